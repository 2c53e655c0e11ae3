"""``python -m recipe.tools.plan``: how to split GPUs between trainer and rollout, predicted by a
discrete-event simulation of the pipeline (recipe/tools/plan/sim.py).

    inputs:  --run RUN_DIR (measured: recipe/tools/plan/inputs.py)  or  flags (--engine-tps ...)
    sweep:   sync on all --gpus | one_step_off and fully_async for trainer:rollout splits
             x staleness thresholds
    output:  one table row per layout (samples/s, speedup over sync, idle ratios, staleness);
             the last line is the recommendation
    --validate RUN_DIR ...   each run's own layout simulated with the inputs: predicted vs
                             measured samples/s
    --verl                   verl's published 7B runs (32/64/128 GPUs) next to the planner's
                             prediction for them (recipe/tools/plan/verl.py states the assumptions)
    --contention-from RUN    trainer and engines share resources (this project's CPU runs):
                             how much slower training runs while generation overlaps it,
                             measured from an async run (recipe/tools/plan/inputs.py)

Scaling (stated, not measured): training time per sample falls linearly with trainer GPUs
(``--measured-trainer-gpus`` is the count the run trained on); each engine replica of
``--gpus-per-engine`` GPUs generates at the measured per-replica speed.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from recipe.tools.plan.modes import simulate
from recipe.tools.plan.spec import Layout, SimResult, Workload

logger = logging.getLogger(__name__)

DEFAULT_THRESHOLDS = (0.0, 0.25, 0.5, 1.0)
RECOMMEND_WITHIN = 0.03
"""Layouts within 3% of the best samples/s count as ties; the freshest of them wins."""


@dataclass(frozen=True)
class Row:
    layout: Layout
    trainer_gpus: int
    rollout_gpus: int
    result: SimResult


def sweep(
    workload: Workload,
    *,
    gpus: int,
    gpus_per_engine: int,
    measured_trainer_gpus: int,
    steps: int,
    steps_per_sync: int,
    thresholds: tuple[float, ...],
    partial_rollout: bool = True,
) -> list[Row]:
    """Sync on every GPU, then one_step_off / fully_async for each split and threshold."""
    if gpus < 2:
        raise ValueError(f"--gpus={gpus}: a split needs at least 2")
    rows = []
    sync = Layout(
        "sync", engines=max(1, gpus // gpus_per_engine), trainer_scale=gpus / measured_trainer_gpus
    )
    rows.append(Row(sync, gpus, gpus, simulate(workload, sync, steps)))
    for trainer_gpus in _splits(gpus, gpus_per_engine):
        engines = (gpus - trainer_gpus) // gpus_per_engine
        scale = trainer_gpus / measured_trainer_gpus
        layouts = [Layout("one_step_off", engines=engines, trainer_scale=scale)]
        layouts += [
            Layout(
                "fully_async",
                engines=engines,
                trainer_scale=scale,
                staleness_threshold=threshold,
                steps_per_sync=steps_per_sync,
                partial_rollout=partial_rollout,
            )
            for threshold in thresholds
        ]
        for layout in layouts:
            result = simulate(workload, layout, steps)
            rows.append(Row(layout, trainer_gpus, gpus - trainer_gpus, result))
    return rows


def _splits(gpus: int, gpus_per_engine: int) -> list[int]:
    """Trainer GPU counts: eighths of the cluster, leaving whole engines to the rollout."""
    out = set()
    for eighth in range(1, 8):
        trainer = max(1, round(gpus * eighth / 8))
        rollout = (gpus - trainer) // gpus_per_engine * gpus_per_engine
        if rollout >= gpus_per_engine:
            out.add(gpus - rollout)
    return sorted(out)


def recommend(rows: list[Row]) -> Row:
    best = max(r.result.steady_samples_per_s() for r in rows)
    close = [r for r in rows if r.result.steady_samples_per_s() >= (1 - RECOMMEND_WITHIN) * best]
    return min(close, key=lambda r: (r.result.staleness_mean, -r.result.steady_samples_per_s()))


def _describe(row: Row) -> str:
    layout = row.layout
    if layout.mode == "sync":
        return f"sync on all {row.trainer_gpus} GPUs (colocated)"
    text = f"{layout.mode} trainer:rollout {row.trainer_gpus}:{row.rollout_gpus}"
    if layout.mode == "fully_async":
        text += f" staleness_threshold={layout.staleness_threshold:g} T={layout.steps_per_sync}"
    return text


def print_table(rows: list[Row]) -> None:
    base = rows[0].result.steady_samples_per_s()
    head = ("layout", "samples/s", "x sync", "idle T", "idle R", "stale", "max")
    print(f"{head[0]:<62}" + "".join(f"{h:>9}" for h in head[1:]))
    for row in rows:
        res = row.result
        sps = res.steady_samples_per_s()
        print(
            f"{_describe(row):<62}{sps:>9.2f}{sps / base:>9.2f}{res.trainer_idle_ratio:>9.2f}"
            f"{res.rollouter_idle_ratio:>9.2f}{res.staleness_mean:>9.2f}{res.staleness_max:>9d}"
        )


# ---- predicted vs measured -------------------------------------------------------------------


def validate(workload: Workload, run_dirs: list[Path]) -> list[tuple[str, float, float]]:
    """Each run's own layout simulated with ``workload``: (mode, predicted, measured)."""
    from recipe.tools.plan.inputs import measure
    from recipe.tools.report.data import load_run

    out = []
    print(
        f"{'mode':<16}{'predicted':>10}{'measured':>10}{'error':>8}  run (samples/s after warm-up)"
    )
    for path in run_dirs:
        run = measure(load_run(path), contention=workload.contention)
        layout = Layout(
            run.mode,
            engines=run.num_replicas,
            staleness_threshold=run.staleness_threshold,
            steps_per_sync=run.steps_per_sync if run.mode == "fully_async" else 1,
            partial_rollout=run.partial_rollout,
        )
        own = replace(workload, prompts_per_step=run.workload.prompts_per_step, n=run.workload.n)
        predicted = simulate(own, layout, run.num_steps).steady_samples_per_s()
        error = predicted / run.samples_per_s - 1
        print(f"{run.mode:<16}{predicted:>10.1f}{run.samples_per_s:>10.1f}{error:>+8.1%}  {path}")
        out.append((run.mode, predicted, run.samples_per_s))
    return out


# ---- the command line ------------------------------------------------------------------------


def workload_from_args(args: argparse.Namespace) -> tuple[Workload, dict[str, int]]:
    """The measured workload of ``--run`` with flag overrides, or one from flags alone."""
    defaults: dict[str, int] = {"steps_per_sync": 1}
    if args.run is not None:
        from recipe.tools.plan.inputs import measure
        from recipe.tools.report.data import load_run

        measured = measure(load_run(args.run))
        print(measured.describe_engine())
        workload = measured.workload
        defaults["steps_per_sync"] = measured.steps_per_sync
    else:
        missing = [
            f
            for f in ("engine_tps", "train_s_per_sample", "length_mean")
            if getattr(args, f) is None
        ]
        if missing:
            raise ValueError(
                "without --run, give " + ", ".join("--" + m.replace("_", "-") for m in missing)
            )
        workload = Workload(
            n=args.n or 16,
            prompts_per_step=args.prompts_per_step or 32,
            lengths=(round(args.length_mean),),
            engine_tps=args.engine_tps,
            train_s_per_sample=args.train_s_per_sample,
            sync_s=args.sync_s or 0.0,
        )
    overrides = {
        key: getattr(args, key)
        for key in (
            "n",
            "prompts_per_step",
            "engine_tps",
            "seq_tps",
            "train_s_per_sample",
            "sync_s",
        )
        if getattr(args, key) is not None
    }
    contention = args.contention
    if args.contention_from is not None:
        from recipe.tools.plan.inputs import estimate_contention
        from recipe.tools.report.data import load_run

        contention = estimate_contention(workload, load_run(args.contention_from))
        print(f"contention {contention:.2f} (measured from {args.contention_from})")
    workload = replace(workload, contention=contention, **overrides)
    return workload, defaults


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.tools.plan", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run", type=Path, help="run directory to measure the workload from")
    parser.add_argument("--validate", type=Path, nargs="+", help="runs to predict and compare")
    parser.add_argument("--verl", action="store_true", help="compare with verl's published runs")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs to split (default 8)")
    parser.add_argument("--gpus-per-engine", type=int, default=1)
    parser.add_argument("--measured-trainer-gpus", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40, help="trainer steps simulated")
    parser.add_argument("--steps-per-sync", type=int, default=None, help="T (default: the run's)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--contention", type=float, default=1.0, help="shared-resource slowdown")
    parser.add_argument(
        "--contention-from", type=Path, help="measure the contention from this async run"
    )
    for flag in ("n", "prompts-per-step"):
        parser.add_argument(f"--{flag}", type=int, default=None)
    for flag in ("engine-tps", "seq-tps", "train-s-per-sample", "sync-s", "length-mean"):
        parser.add_argument(f"--{flag}", type=float, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        if args.verl:
            from recipe.tools.plan.verl import compare_with_verl

            compare_with_verl()
            return 0
        workload, defaults = workload_from_args(args)
        if args.validate:
            validate(workload, args.validate)
            return 0
        rows = sweep(
            workload,
            gpus=args.gpus,
            gpus_per_engine=args.gpus_per_engine,
            measured_trainer_gpus=args.measured_trainer_gpus,
            steps=args.steps,
            steps_per_sync=args.steps_per_sync or int(defaults["steps_per_sync"]),
            thresholds=tuple(args.thresholds),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_table(rows)
    best = recommend(rows)
    speedup = best.result.steady_samples_per_s() / rows[0].result.steady_samples_per_s()
    print(
        f"recommendation: {_describe(best)}: {best.result.steady_samples_per_s():.2f} samples/s "
        f"({speedup:.2f}x sync), idle trainer {best.result.trainer_idle_ratio:.2f} / rollout "
        f"{best.result.rollouter_idle_ratio:.2f}, staleness mean {best.result.staleness_mean:.2f}"
    )
    return 0 if math.isfinite(speedup) else 1


if __name__ == "__main__":
    sys.exit(main())
