"""``python -m recipe.tools.bench.e2e [key=value ...]``: sync vs one_step_off vs fully_async, end
to end.

The three recipes run back to back in one process on the same hardware, model, data,
sampling and number of trained samples (``steps`` trainer steps of R prompt groups each:
``actor.ppo_mini_batch_size`` prompts x ``rollout.n`` responses; sync and one_step_off take R
as ``data.train_batch_size`` too, so every mode takes one optimizer step per trainer step).
Throughput counts trained samples over each run's whole ``fit``. Every mode gets the same
engine settings (CUDA graphs on GPUs, ``rollout.enforce_eager`` unset). Printed per mode:
samples/s, wall time, trainer and rollouter idle ratios, staleness; the trainer's tokens/s
and MFU over its busy time (old log-probs + update, ``recipe.tools.bench.flops``); each phase's
share of a step (``PHASES``); push medians. The last line is the headline ratios to sync
(targets on GPUs: fully_async >= 2x, one_step_off >= 1.25x).

Bench keys (everything else is a config override, ``key=value``):

    model=tiny|20M|0.5B|1.5B|7B|PATH   tiny: the embedded default; a size: random-init
                                        Qwen2.5-shaped model (recipe/tools/bench/models.py)
    workload=longtail|natural|multiturn|agent
                                        longtail: rollout.length_profile=longtail (most
                                        responses short, ~1 in 10 near rollout.response_length);
                                        multiturn: 3-turn tool episodes whose tool latency has a
                                        long tail (``multiturn_overrides``); agent: the same
                                        episodes from an agent written against the OpenAI API,
                                        through the workers' endpoint (``agent_overrides``)
    steps=N                             trainer steps per mode (default 20)
    modes=sync,one_step_off,fully_async
    gpus=N                              the GPUs each mode gets (``gpu_layout``): sync colocates
                                        N trainer ranks with N engines; the other modes split
                                        them, N//2 trainer ranks and the rest for engines
    json=PATH                           also write the results there

Idle ratios: sync from its phase timers (the trainer waits while generating and the engines
wait while training); one_step_off's trainer from its wait for the batch in flight (its
engines' idle time is not measured: "-"); fully_async from its own accounting.

CPU: ``python -m recipe.tools.bench.e2e``. GPU (one H200, shared by trainer and engines):
``python -m recipe.tools.bench.e2e model=0.5B trainer.device=cuda model.dtype=bfloat16
rollout.response_length=384 rollout.max_num_seqs=512``.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from recipe.config import load_config
from recipe.run.placement import resolve_device
from recipe.tools.bench.flops import ModelFlops, device_peak_flops, mfu
from recipe.tools.bench.models import resolve_bench_model
from recipe.tools.cli import fail, parse_key_values

logger = logging.getLogger(__name__)

MODES = ("sync", "one_step_off", "fully_async")
SHARED = {
    "actor": {"ppo_mini_batch_size": 16},
    "logger": {"quiet": True},
    "trainer": {"test_freq": 0, "val_before_train": False},
    "data": {"num_val_prompts": 32},
}
ASYNC = {
    "staleness_threshold": 0.5,
    "trigger_parameter_sync_step": 2,
    "require_batches": 1,
    "partial_rollout": True,
}


def gpu_layout(mode: str, gpus: int) -> dict[str, Any]:
    """Equal GPUs for every mode: ``sync`` colocates ``gpus`` trainer ranks with ``gpus``
    engine GPUs (the baseline the peers compare against); ``one_step_off`` and
    ``fully_async`` give ``gpus // 2`` GPUs to trainer ranks and the rest to engines (one
    GPU: both share it)."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: needs at least 1")
    if mode == "sync" or gpus == 1:
        trainer = engines = gpus
    else:
        trainer, engines = gpus // 2, gpus - gpus // 2
    return {"actor.n_gpus_per_node": trainer, "rollout.n_gpus_per_node": engines}


def bench_config(mode: str, steps: int, overrides: dict[str, Any], gpus: int | None = None) -> Any:
    """The validated config of ``mode`` with the shared bench settings, ``gpu_layout`` when
    ``gpus`` is given, and ``overrides`` (which win)."""
    cfg = OmegaConf.create(SHARED | {"mode": mode})
    OmegaConf.update(cfg, "trainer.total_training_steps", steps, force_add=True)
    if mode == "fully_async":
        OmegaConf.update(cfg, "async_training", ASYNC, force_add=True)
    layout = gpu_layout(mode, gpus) if gpus is not None else {}
    for key, value in (layout | overrides).items():
        if mode != "fully_async" and key.startswith("async_training."):
            continue  # only fully_async reads these
        OmegaConf.update(cfg, key, value, force_add=True)
    if mode != "fully_async":
        per_step = OmegaConf.select(cfg, "actor.ppo_mini_batch_size")
        OmegaConf.update(cfg, "data.train_batch_size", per_step, force_add=True)
    return load_config(cfg)


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def idle_ratios(mode: str, summary: dict[str, Any], rows: list[dict]) -> tuple[Any, Any]:
    """(trainer, rollouter) idle ratios over the run (None where not measured)."""
    wall = summary["wall_s"]
    if mode == "fully_async":
        return summary.get("trainer/idle_ratio"), summary.get("rollouter/idle_ratio")
    if mode == "sync":
        gen = sum(r.get("timing/gen_s", 0.0) for r in rows)
        return gen / wall, 1.0 - gen / wall
    wait = sum(r.get("timing/wait_prev_gen_s", 0.0) for r in rows)
    return wait / wall, None


PHASES = ("gen", "wait", "old_log_prob", "update", "sync", "save_to_cpu", "other")
"""Shares of the trainer's step time: generating (sync only), waiting for rollouts (one_step_
off and fully_async), old log-probs, the update, weight pushes, keeping a copy of the pushed
weights (fully_async), and the rest."""


def _step_tokens(row: dict[str, Any]) -> float:
    if "throughput/tokens" in row:
        return row["throughput/tokens"]
    return row.get("throughput/tokens_per_s", 0.0) * row.get("timing/step_s", 0.0)


def phase_shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's share of the summed ``timing/step_s`` (``PHASES``)."""
    total = sum(r.get("timing/step_s", 0.0) for r in rows)
    if total <= 0:
        return {}
    wait = sum(
        r.get("timing/wait_prev_gen_s", r.get("trainer/idle_ratio", 0.0) * r["timing/step_s"])
        for r in rows
        if "timing/gen_s" not in r and "timing/step_s" in r
    )
    sums = {
        "gen": sum(r.get("timing/gen_s", 0.0) for r in rows),
        "wait": wait,
        **{k: sum(r.get(f"timing/{k}_s", 0.0) for r in rows) for k in PHASES[2:6]},
    }
    shares = {k: v / total for k, v in sums.items()}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def trainer_rates(
    rows: list[dict[str, Any]], flops: ModelFlops, peak: float | None
) -> dict[str, float | None]:
    """Tokens (prompt + response) the trainer processed per second of old log-probs +
    update, and the MFU of that time (one forward + one training pass per token; attention
    scores not counted, so a lower bound)."""
    tokens = sum(_step_tokens(r) for r in rows)
    busy_s = sum(r.get("timing/old_log_prob_s", 0.0) + r.get("timing/update_s", 0.0) for r in rows)
    if busy_s <= 0:
        return {"trainer_tokens_per_s": None, "trainer_mfu": None}
    work = flops.forward_flops(int(tokens)) + flops.train_flops(int(tokens))
    return {"trainer_tokens_per_s": tokens / busy_s, "trainer_mfu": mfu(work, busy_s, peak)}


def run_mode(
    mode: str, steps: int, overrides: dict[str, Any], out_dir: Path, gpus: int | None = None
) -> dict[str, Any]:
    from recipe.main import recipe_class

    cfg = bench_config(mode, steps, overrides, gpus)
    run_dir = out_dir / mode
    start = time.perf_counter()
    recipe = recipe_class(mode)(cfg, run_dir)
    build_s = time.perf_counter() - start
    try:
        summary = recipe.fit()
    finally:
        recipe.close()
    rows = _metrics(run_dir)
    trainer_idle, rollouter_idle = idle_ratios(mode, summary, rows)
    flops = ModelFlops.from_config(cfg.model.path)
    peak = device_peak_flops(resolve_device(cfg.trainer.device))
    lengths = [r["response_length/mean"] for r in rows if "response_length/mean" in r]
    return {
        **{f"{key}_p50": _median(rows, f"sync/{key}") for key in SYNC_KEYS},
        "mode": mode,
        "build_s": build_s,
        "steps": summary["steps"],
        "samples_per_s": summary["throughput/samples_per_s"],
        "wall_s": summary["wall_s"],
        "trainer_idle": trainer_idle,
        "rollouter_idle": rollouter_idle,
        "staleness_mean": summary.get("staleness/mean", 0.0),
        "staleness_max": summary.get("staleness/max", 0),
        "response_length_mean": sum(lengths) / len(lengths) if lengths else None,
        "final_val_accuracy": summary.get("final/val_accuracy"),
        "turns_mean": _median(rows, "agent/turns_mean"),
        "env_s_p50": _median(rows, "agent/env_s_p50"),
        **trainer_rates(rows, flops, peak),
        "phase_shares": phase_shares(rows),
        "run_dir": str(run_dir),
    }


WORKLOADS = ("longtail", "natural", "multiturn", "agent")


def multiturn_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``workload=multiturn``: episodes of the built-in ``tool_latency`` environment (3 tool
    turns, latencies 0.05 s, ~1 in 10 of 1 s), a model turn a quarter of the response budget
    (64 tokens unless ``rollout.response_length`` is given); keys given win."""
    length = int(overrides.get("rollout.response_length", 64))
    return {
        "rollout.response_length": length,
        "rollout.multi_turn.enable": True,
        "rollout.multi_turn.environment": "tool_latency",
        "rollout.multi_turn.max_turn_tokens": max(1, length // 4),
    } | overrides


def agent_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``workload=agent``: ``multiturn``'s episodes, driven by
    ``recipe/agent/examples/tool_latency_agent.py`` through the OpenAI-compatible endpoint
    (the same turns, budgets and tool latencies); keys given win."""
    episodes = multiturn_overrides(overrides)
    del episodes["rollout.multi_turn.environment"]
    return (
        episodes
        | {
            "rollout.multi_turn.agent": "recipe.agent.examples.tool_latency_agent:run",
            "rollout.multi_turn.max_assistant_turns": 3,
        }
        | overrides
    )


SYNC_KEYS = ("pause_window_s", "pause_s", "total_s", "gbps", "bytes")
"""Per-push figures reported as medians over the run (``sync/<key>`` in metrics.jsonl)."""


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = sorted(r[key] for r in rows if key in r)
    return values[len(values) // 2] if values else None


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING)
    args = parse_key_values(argv, __doc__)
    steps = int(args.pop("steps", "20"))
    modes = tuple(args.pop("modes", ",".join(MODES)).split(","))
    unknown = set(modes) - set(MODES)
    if unknown or "sync" not in modes:
        fail(f"modes={','.join(modes)}: allowed {MODES}, sync included")
    model = args.pop("model", "tiny")
    workload = args.pop("workload", "longtail")
    json_path = args.pop("json", None)
    gpus_arg = args.pop("gpus", None)
    if gpus_arg is not None and not (gpus_arg.isdigit() and int(gpus_arg) >= 1):
        fail(f"gpus={gpus_arg}: a whole number of GPUs, at least 1")
    gpus = None if gpus_arg is None else int(gpus_arg)
    overrides = {key: yaml.safe_load(value) for key, value in args.items()}
    overrides["model.path"] = str(resolve_bench_model(model))
    if workload not in WORKLOADS:
        fail(f"workload={workload}: allowed {', '.join(WORKLOADS)}")
    overrides["rollout.length_profile"] = "longtail" if workload == "longtail" else "natural"
    if workload == "multiturn":
        overrides = multiturn_overrides(overrides)
    elif workload == "agent":
        overrides = agent_overrides(overrides)
    out_dir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    results = [run_mode(mode, steps, overrides, out_dir, gpus) for mode in modes]
    base = results[0]["samples_per_s"]
    print(
        f"model={model} workload={workload} steps={steps} gpus={gpus} "
        f"overrides={json.dumps(overrides)}"
    )
    print(
        f"{'mode':<13} {'samples/s':>10} {'x sync':>7} {'wall s':>8} {'build s':>8} "
        f"{'trainer idle':>13} {'rollout idle':>13} {'stale mean':>11} {'stale max':>10} "
        f"{'resp len':>9} {'turns':>6} {'env s/ep':>9}"
    )
    for r in results:
        print(
            f"{r['mode']:<13} {r['samples_per_s']:>10.1f} {r['samples_per_s'] / base:>7.2f} "
            f"{r['wall_s']:>8.1f} {r['build_s']:>8.1f} {_fmt(r['trainer_idle'], '.2f'):>13} "
            f"{_fmt(r['rollouter_idle'], '.2f'):>13} {r['staleness_mean']:>11.2f} "
            f"{r['staleness_max']:>10} {_fmt(r['response_length_mean'], '.1f'):>9} "
            f"{_fmt(r['turns_mean'], '.2f'):>6} {_fmt(r['env_s_p50'], '.3f'):>9}"
        )
    print(
        f"{'mode':<13} {'trainer tok/s':>14} {'trainer MFU':>12}  step shares: "
        + " ".join(f"{k:>12}" for k in PHASES)
    )
    for r in results:
        shares = r["phase_shares"]
        mfu_pct = "-" if r["trainer_mfu"] is None else f"{100 * r['trainer_mfu']:.1f}%"
        print(
            f"{r['mode']:<13} {_fmt(r['trainer_tokens_per_s'], ',.0f'):>14} "
            f"{mfu_pct:>12}  {'':13}"
            + " ".join(f"{_fmt(shares.get(k), '.2f'):>12}" for k in PHASES)
        )
    print(f"{'mode':<13} " + " ".join(f"{'sync ' + k + ' p50':>20}" for k in SYNC_KEYS))
    for r in results:
        print(
            f"{r['mode']:<13} " + " ".join(f"{_fmt(r[f'{k}_p50'], '.3f'):>20}" for k in SYNC_KEYS)
        )
    ratios = {f"{r['mode']}_over_sync": r["samples_per_s"] / base for r in results[1:]}
    record = {
        "model": model,
        "workload": workload,
        "steps": steps,
        "gpus": gpus,
        "results": results,
    }
    if json_path:
        Path(json_path).write_text(json.dumps(record | {"ratios": ratios}, indent=2))
    print(json.dumps({"results": results, "run_dirs": str(out_dir)}))
    print(
        "headline: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        + " samples/s (targets: fully_async >= 2x, one_step_off >= 1.25x)"
    )
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
