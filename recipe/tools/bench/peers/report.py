"""The peer benchmark's table: the terms, each side's versions, one row per system, and the
ratios of ours to verl's (the targets on one H200: sync >= 1.0x verl's samples/s, fully_async
>= 1.5x, start-up <= verl's) and of each side's async trainer to its sync one."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from recipe.tools.bench.peers.result import PHASES, SystemResult

OURS = ("torch", "vllm", "ray", "transformers")
VERL_SIDE = ("verl", "transformers", "tensordict", "tokenizers")


def versions(verl_site: Path) -> dict[str, dict[str, str]]:
    """Package versions of our side (this interpreter) and of verl's folder of wheels."""
    ours: dict[str, str] = {}
    for name in OURS:
        try:
            ours[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            ours[name] = "-"
    theirs = {}
    for dist in importlib.metadata.distributions(path=[str(verl_site)]):
        name = dist.metadata["Name"].lower()
        if name in VERL_SIDE:
            theirs[name] = dist.version
    return {"ours": ours, "verl": theirs}


PAIRS = (
    ("sync", "verl"),
    ("fully_async", "verl"),
    ("fully_async", "verl_async"),
    ("verl_async", "verl"),
    ("fully_async", "sync"),
)
"""(system, base) of each ratio: ours to verl's, each side's async trainer to its sync one."""


def ratios(results: list[SystemResult]) -> dict[str, float]:
    """``<system>_over_<base>`` samples/s, generated tokens/s and start-up, for each pair of
    ``PAIRS`` that both finished."""
    by = {r.system: r for r in results if r.failed is None}
    out: dict[str, float] = {}
    for system, base in PAIRS:
        if system not in by or base not in by:
            continue
        for key in ("samples_per_s", "gen_tokens_per_s", "startup_s"):
            mine, theirs = getattr(by[system], key), getattr(by[base], key)
            if mine is not None and theirs:
                out[f"{system}_over_{base} {key}"] = round(mine / theirs, 3)
    return out


def _cell(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _precision(terms: dict[str, Any]) -> str:
    if terms.get("device", "cuda") == "cpu":
        return "float32 on the CPU (ours only)"
    return f"bf16, CUDA graphs, engine memory {terms['gpu_memory_utilization']}"


def print_table(report: dict[str, Any]) -> None:
    terms = report["terms"]
    print(
        f"terms: model {Path(terms['model']).name}, {terms['steps']} steps x {terms['prompts']} "
        f"prompts x n={terms['n']} ({terms['steps'] * terms['prompts'] * terms['n']} samples), "
        f"response <= {terms['response_length']}, lr {terms['lr']:g}, no KL, no entropy, "
        f"{_precision(terms)}, greedy validation on "
        f"{terms['val_rows']} test problems; rates over steps > {terms['warmup_steps']}"
    )
    for side, found in report["versions"].items():
        print(f"{side}: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    head = ["system", "samples/s", "gen tok/s", "step s", *[f"{p} s" for p in PHASES]]
    head += ["peak GiB", "start-up s", "val acc", "SM MHz", "max C", "CPU pre", "CPU"]
    rows = []
    for data in report["results"]:
        r = SystemResult.from_json(dict(data))
        peak = None if r.peak_gpu_mib is None else r.peak_gpu_mib / 1024
        name = r.system + (" (cut)" if r.failed else "")
        rows.append(
            [name, _cell(r.samples_per_s, 2), _cell(r.gen_tokens_per_s, 0), _cell(r.step_s, 2)]
            + [_cell(r.phases_s.get(p), 2) for p in PHASES]
            + [_cell(peak), _cell(r.startup_s), _cell(r.val_accuracy, 3)]
            + [_cell(r.gpu_state.get("sm_clock_mhz_median"), 0)]
            + [_cell(r.gpu_state.get("temp_c_max"), 0)]
            + [_cell(r.cpu_state.get(k), 2) for k in ("cpu_busy_before", "cpu_busy_median")]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    for line in (head, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))
    for data in report["results"]:
        for note in data.get("notes", []):
            print(f"{data['system']}: {note}")
    for key, value in report["ratios"].items():
        print(f"{key}: {value:.2f}x")
