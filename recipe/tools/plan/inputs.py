"""Measured inputs of ``python -m recipe.tools.plan``: a ``Workload`` read from a run directory.

    metrics.jsonl  train seconds per sample (old log-prob + update), push seconds, per-step
                   overhead (sync runs: step time not in generation, training or the push)
    trace.json     per-sample response lengths and each engine's tokens/s while generating
                   (training requests only; greedy validation requests are left out); from a
                   sync run, the engine's two decode speeds instead (decode.py: a full
                   engine's, a lone sequence's), fitted over its batches where they separate
    config.yaml    n, prompts per step, T, staleness threshold, max_num_seqs

The first ``WARMUP_STEPS`` steps (engine and trainer warm-up) are left out of every figure.
A sync run is the best source: nothing overlaps, so each figure is the piece's own cost; a
run of an async mode measures the pieces while they compete for shared resources.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recipe.observability.trace_file import busy_s, rollout_slices
from recipe.tools.plan.decode import DecodeFit, busy_batches, by_replica, fit_decode
from recipe.tools.plan.spec import Workload
from recipe.tools.report.data import RunData

logger = logging.getLogger(__name__)

WARMUP_STEPS = 2


@dataclass(frozen=True)
class Measured:
    """A run's workload, and what the run itself did (for predicted-vs-measured)."""

    workload: Workload
    mode: str
    num_steps: int
    steps_per_sync: int
    staleness_threshold: float
    partial_rollout: bool
    num_replicas: int
    samples_per_s: float
    """Over the steps after the warm-up (from the step ends in the trace)."""
    trainer_idle_ratio: float | None
    rollouter_idle_ratio: float | None
    staleness_mean: float | None
    decode: DecodeFit | None = None
    """The engine's two speeds fitted from a sync run (None: the mean while busy, no floor)."""

    def describe_engine(self) -> str:
        if self.decode is not None:
            return f"engine: {self.decode.describe()}"
        return (
            f"engine: {self.workload.engine_tps:,.0f} tokens/s, its mean while busy; a lone "
            f"sequence as fast (no fit from this {self.mode} run: recipe/tools/plan/decode.py)"
        )


def _cfg(run: RunData, dotted: str, default: Any) -> Any:
    node: Any = run.config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _steady(run: RunData, key: str) -> list[float]:
    return [v for step, v in run.series(key) if step > WARMUP_STEPS]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def group_size(requests: list[Mapping[str, Any]]) -> int:
    """Responses per prompt of the training requests (``rollout.n``)."""
    sizes = sorted(e["args"]["n"] for e in requests)
    return int(sizes[len(sizes) // 2])


def prompts_per_step(run: RunData, n: int) -> int:
    """Prompts trained per step, from the samples each step trained."""
    samples = sorted(v for _, v in run.series("throughput/samples"))
    if not samples:
        raise ValueError(f"{run.path}: metrics.jsonl has no throughput/samples")
    return max(1, round(samples[len(samples) // 2] / n))


def training_requests(run: RunData) -> list[Mapping[str, Any]]:
    """The engines' slices of training generation (sampled, not greedy validation)."""
    return [e for e in rollout_slices(run.trace) if e.get("args", {}).get("temperature", 1) > 0]


def response_lengths(requests: list[Mapping[str, Any]]) -> tuple[int, ...]:
    """Per-response token counts of finished requests (a cut one counts where it ends)."""
    lengths: list[int] = []
    for event in requests:
        args = event["args"]
        if "aborted" in args.get("finish", {}):
            continue
        if "lengths" in args:
            lengths += args["lengths"]
        elif not args.get("resumed"):
            lengths += args["new_lengths"]
    return tuple(lengths)


def engine_tokens_per_s(run: RunData, requests: list[Mapping[str, Any]]) -> float:
    """New tokens over the time some training request was running, per replica, after the
    warm-up steps."""
    start_us = _steady_start_us(run)
    replicas = by_replica(requests, start_us)
    tokens = sum(e["args"]["new_tokens"] for events in replicas.values() for e in events)
    busy = sum(busy_s(events, start_us, math.inf) for events in replicas.values())
    if busy <= 0:
        raise ValueError(f"{run.path}: no training generation in trace.json after the warm-up")
    return tokens / busy


def steps_per_sync(run: RunData) -> int:
    """T: trainer steps per weights version (from the versions the steps ended on)."""
    versions = [int(r["param_version"]) for r in run.records if "param_version" in r]
    if len(versions) < 2 or versions[-1] <= versions[0]:
        return int(_cfg(run, "async_training.trigger_parameter_sync_step", 1))
    return max(1, round((len(versions) - 1) / (versions[-1] - versions[0])))


def staleness_threshold(run: RunData, prompts_per_step: int) -> float:
    """From the config, else from the admission budget B = floor((1 + s) T R), which a fully
    async run reports as its queue capacity."""
    configured = _cfg(run, "async_training.staleness_threshold", None)
    if configured is not None:
        return float(configured)
    capacity = run.summary.get("queue/capacity")
    if capacity is None:
        return 0.5
    return max(0.0, capacity / (steps_per_sync(run) * prompts_per_step) - 1.0)


def _steady_start_us(run: RunData) -> float:
    end = run.wall_s(WARMUP_STEPS)
    return run.start_us + (end or 0.0) * 1e6


def steady_samples_per_s(run: RunData) -> float:
    """Samples over the steps after the warm-up / the time they took (step ends)."""
    samples = dict(run.series("throughput/samples"))
    last = max(samples, default=0)
    start, end = run.wall_s(WARMUP_STEPS), run.wall_s(last)
    if last <= WARMUP_STEPS + 1 or start is None or end is None or end <= start:
        raise ValueError(f"{run.path}: needs more than {WARMUP_STEPS + 1} steps with a trace")
    return sum(v for step, v in samples.items() if step > WARMUP_STEPS) / (end - start)


def measure(run: RunData, *, contention: float = 1.0) -> Measured:
    """The run's workload (module docstring) and its own figures."""
    if not run.trace:
        raise ValueError(f"{run.path}: no trace.json (the planner needs the engines' slices)")
    requests = training_requests(run)
    lengths = response_lengths(requests)
    if not lengths:
        raise ValueError(f"{run.path}: trace.json has no finished training requests")
    n = group_size(requests)
    samples = _steady(run, "throughput/samples")
    train_s = [
        (lp + up) / s
        for lp, up, s in zip(
            _steady(run, "timing/old_log_prob_s"),
            _steady(run, "timing/update_s"),
            samples,
            strict=False,
        )
    ]
    if run.mode == "fully_async":
        sync_s = _mean(_steady(run, "sync/pause_window_s"))
    else:
        sync_s = _mean(_steady(run, "timing/sync_s"))
    overhead = 0.0
    if run.mode == "sync":
        parts = ("timing/gen_s", "timing/old_log_prob_s", "timing/update_s", "timing/sync_s")
        rest = [
            step_s - sum(vals)
            for step_s, *vals in zip(
                _steady(run, "timing/step_s"), *(_steady(run, k) for k in parts), strict=False
            )
        ]
        overhead = max(0.0, _mean(rest))
    max_num_seqs = int(_cfg(run, "rollout.max_num_seqs", 256))
    decode = None
    if run.mode == "sync":
        decode = fit_decode(busy_batches(requests, _steady_start_us(run)), max_num_seqs)
    workload = Workload(
        n=n,
        prompts_per_step=prompts_per_step(run, n),
        lengths=lengths,
        engine_tps=decode.engine_tps if decode else engine_tokens_per_s(run, requests),
        seq_tps=decode.seq_tps if decode else math.inf,
        train_s_per_sample=_mean(train_s),
        sync_s=sync_s,
        max_num_seqs=max_num_seqs,
        step_overhead_s=overhead,
        contention=contention,
    )
    return Measured(
        workload=workload,
        mode=run.mode,
        num_steps=run.num_steps,
        steps_per_sync=steps_per_sync(run),
        staleness_threshold=staleness_threshold(run, workload.prompts_per_step),
        partial_rollout=bool(_cfg(run, "async_training.partial_rollout", True)),
        num_replicas=len({e["pid"] for e in requests}),
        samples_per_s=steady_samples_per_s(run),
        trainer_idle_ratio=run.idle_ratio("trainer"),
        rollouter_idle_ratio=run.idle_ratio("rollouter"),
        staleness_mean=run.staleness_mean,
        decode=decode,
    )


def estimate_contention(base: Workload, run: RunData) -> float:
    """The slowdown of training while the engines generate, from a run where they overlap.

    The run's training seconds per sample t (metrics) against ``base``'s t0 (a run without
    overlap), and the share f of its training time during which some engine generated
    (trace): t = t0 * (1 + (contention - 1) * f).
    """
    if not run.trace:
        raise ValueError(f"{run.path}: no trace.json to measure the overlap from")
    phases = [
        e
        for e in run.trainer_phases()
        if e["name"] in ("old_log_prob", "update") and e["ts"] >= _steady_start_us(run)
    ]
    engines = training_requests(run)
    train_us = sum(e["dur"] for e in phases)
    overlap_us = sum(busy_s(engines, e["ts"], e["ts"] + e["dur"]) * 1e6 for e in phases)
    samples = _steady(run, "throughput/samples")
    train_s = sum(_steady(run, "timing/old_log_prob_s")) + sum(_steady(run, "timing/update_s"))
    if not phases or overlap_us <= 0 or not samples:
        raise ValueError(f"{run.path}: training never overlapped generation")
    slowdown = train_s / sum(samples) / base.train_s_per_sample
    return max(1.0, 1.0 + (slowdown - 1.0) / (overlap_us / train_us))
