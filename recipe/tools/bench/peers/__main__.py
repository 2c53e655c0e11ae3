"""``python -m recipe.tools.bench.peers [key=value ...]``: verl's GRPO (its sync trainer and its
fully async trainer) and ours on the same GPU, in one sitting, under the same terms; one table.

    data (GSM8K as published, or its prepared parquet) --> OUT/data/{train,val<N>}.parquet
    for system in systems (verl, verl_async, sync, fully_async):   OUT/<system>/result.json
        its command (verl.py, ours.py) --measure.py--> Measured + its metrics file
        --result.summarize--> SystemResult
    --> the table, ratios to verl, OUT/peers.json (and json=PATH)

A system with a ``result.json`` is not run again, so a machine with a per-call deadline runs
one system per call (``systems=verl``, then ``systems=sync``, ...) and the last call prints
the table of all. A run killed at ``timeout_s`` keeps the figures of the steps it
finished in ``partial.json``: in the table, marked cut, in no ratio, and run again next time.
Keys (``Terms`` holds the shared ones and their defaults):

    systems=verl,verl_async,sync,fully_async
    model=PATH|CATALOG_NAME|SIZE   a model folder, a catalog model (python -m recipe.tools.models),
                                   or a random-init size of recipe.tools.bench.models (e.g. 0.5B)
    data=DIR                       GSM8K's train/test.jsonl, or train/test.parquet
    out=outputs/bench/peers        run directories and results
    verl_site=PATH                 verl's installed wheels (ci/peers_gpu.sh setup)
    json=PATH                      the results also there
    steps, warmup_steps, prompts, n, response_length, max_prompt_length, lr, val_rows,
    gpu_memory_utilization, seed, timeout_s
    device=cuda                    cpu: ours only, float32 (the harness on a machine
                                   without a GPU; verl trains on GPUs only)
    verl:KEY=VALUE                 a Hydra override for verl alone (a variant of its settings,
                                   e.g. verl:trainer.use_v1=False); give a variant its own out=
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any

from recipe.tools.bench.peers import ours, verl
from recipe.tools.bench.peers.data import prepare_peer_data
from recipe.tools.bench.peers.measure import SETTLE_S, Measured, run_measured
from recipe.tools.bench.peers.report import print_table, ratios, versions
from recipe.tools.bench.peers.result import SystemResult, summarize
from recipe.tools.bench.peers.terms import Terms
from recipe.tools.cli import fail, parse_pairs

SYSTEMS = (*verl.SYSTEMS, *ours.SYSTEMS)
VERL_PREFIX = "verl:"
PARTIAL = "partial.json"
"""A run killed at its deadline: the figures of the steps it finished."""
SET_HERE = ("model", "train_file", "val_file", "verl_extra")
"""``Terms`` fields that come from ``model=``, ``data=`` and ``verl:`` arguments."""
OPTIONS = {
    "systems": ",".join(SYSTEMS),
    "model": "",
    "data": "../shared/data/gsm8k",
    "out": "outputs/bench/peers",
    "verl_site": "/tmp/verlsite",
    "json": "",
}
# Stable across runs: what every system's process gets (the compile caches are off for
# all, so each start-up is a first start).
SHARED_ENV = {
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def parse(argv: list[str]) -> tuple[Terms, dict[str, str]]:
    """(the terms, the options) from ``key=value`` arguments; ``SystemExit`` (exit 2) naming a
    bad one."""
    options = dict(OPTIONS)
    fields = {f.name: f for f in dataclasses.fields(Terms) if f.name not in SET_HERE}
    raw: dict[str, Any] = {}
    verl_extra = []
    for key, value in parse_pairs(argv, __doc__)[1]:
        if key.startswith(VERL_PREFIX):
            verl_extra.append(f"{key.removeprefix(VERL_PREFIX)}={value}")
            continue
        if key not in options and key not in fields:
            known = sorted(set(options) | set(fields))
            fail(f"{f'{key}={value}'!r}: unknown key; known {known}")
        if key in options:
            options[key] = value
        else:
            raw[key] = value
    systems = options["systems"].split(",")
    if unknown := sorted(set(systems) - set(SYSTEMS)):
        fail(f"systems={options['systems']}: unknown {unknown}; known {list(SYSTEMS)}")
    theirs = [s for s in systems if s in verl.SYSTEMS]
    if raw.get("device", "cuda") != "cuda" and theirs:
        named = ",".join(theirs)
        fail(f"systems={named} needs device=cuda (verl trains on GPUs only), not {raw['device']}")
    if not options["model"]:
        fail("model= is required (a model folder, a catalog name or a size such as 0.5B)")
    try:
        values = {k: _typed(fields[k].type, v) for k, v in raw.items()}
        model = _model(options["model"])
        val_rows = int(values.get("val_rows", Terms.__dataclass_fields__["val_rows"].default))
        train, val = prepare_peer_data(Path(options["data"]), Path(options["out"]), val_rows)
        terms = Terms(model=model, train_file=train, val_file=val, **values)
        terms = dataclasses.replace(terms, verl_extra=tuple(verl_extra))
        if "verl_async" in systems:
            verl.verl_async_overrides(terms)  # its terms' own check
    except (ValueError, OSError) as exc:
        fail(str(exc))

    return terms, options


def _typed(kind: Any, value: str) -> Any:
    kind = str(kind)
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    return value


def _model(spec: str) -> Path:
    from recipe.models.store import resolve_model_path
    from recipe.tools.bench.models import SHAPES, random_model_path

    path = random_model_path(spec) if spec in SHAPES else resolve_model_path(spec).resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"model={spec}: {path} is not a model folder (no config.json)")
    return path


def run_system(system: str, terms: Terms, options: dict[str, str]) -> SystemResult:
    """``system``'s result: read back when its ``result.json`` exists, else run and kept."""
    run_dir = Path(options["out"]) / system
    kept = run_dir / "result.json"
    if kept.is_file():
        return SystemResult.from_json(json.loads(kept.read_text()))
    if system in verl.SYSTEMS:
        command, env = verl.verl_command(terms, run_dir, Path(options["verl_site"]), system)
        metrics = run_dir / verl.METRICS_FILE
        read = functools.partial(verl.read_verl, run_dir, terms)
    else:
        command, env = ours.our_command(terms, system, run_dir), {}
        metrics = run_dir / ours.METRICS_FILE
        read = functools.partial(ours.read_ours, run_dir)
    for stale in (metrics, run_dir / PARTIAL):  # a failed earlier attempt's
        stale.unlink(missing_ok=True)
    print(f"== {system}: {run_dir}/run.log", flush=True)
    measured = run_measured(
        command, run_dir, metrics_file=metrics, timeout_s=terms.timeout_s, env=SHARED_ENV | env
    )
    cut = measured.returncode is None  # at the deadline: the steps it finished still count
    if measured.returncode != 0:
        # what the harness saw, kept for the diagnosis (the steps that ended, the GPU's peak)
        (run_dir / "failed.json").write_text(json.dumps(dataclasses.asdict(measured)))
    if not metrics.is_file() or (measured.returncode != 0 and not cut):
        why = "past timeout_s" if cut else f"exit {measured.returncode}"
        return SystemResult(system, f"{why}; see {run_dir}/run.log", wall_s=measured.wall_s)
    rows, lines, accuracy = read()
    result = summarize(
        system,
        measured,
        rows,
        line_of_step=lines,
        warmup_steps=terms.warmup_steps,
        val_accuracy=None if cut else accuracy,
    )
    _note_leftovers(result, measured)
    if cut:  # kept aside, not as result.json: the system runs again next time
        result.failed = (
            f"past timeout_s={terms.timeout_s:g} after {len(rows)} of {terms.steps} steps "
            f"(figures of those, no validation); see {run_dir}/run.log"
        )
        (run_dir / PARTIAL).write_text(json.dumps(result.to_json(), indent=2))
    elif result.failed is None:
        kept.write_text(json.dumps(result.to_json(), indent=2))
    return result


def _note_leftovers(result: SystemResult, measured: Measured) -> None:
    if measured.left_gpu_mib is not None:
        result.notes.append(
            f"{measured.left_gpu_mib:.0f} MiB still in use on the GPU {SETTLE_S:g} s after its "
            "exit: the next system's baseline includes it"
        )


def _recorded(run_dir: Path) -> SystemResult | None:
    """A system's kept result, else the steps of its last run cut at the deadline, else None."""
    for name in ("result.json", PARTIAL):
        if (run_dir / name).is_file():
            return SystemResult.from_json(json.loads((run_dir / name).read_text()))
    return None


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    terms, options = parse(argv)
    results = [run_system(s, terms, options) for s in options["systems"].split(",")]
    out = Path(options["out"])
    done = [r for r in (_recorded(out / s) for s in SYSTEMS) if r is not None]
    report = {
        "terms": terms.describe(),
        "versions": versions(Path(options["verl_site"])),
        "results": [r.to_json() for r in done],
        "ratios": ratios(done),
    }
    print_table(report)
    for path in (out / "peers.json", Path(options["json"]) if options["json"] else None):
        if path is not None:
            path.write_text(json.dumps(report, indent=2))
    failed = [r for r in results if r.failed]
    for result in failed:
        print(f"{result.system}: FAILED ({result.failed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
