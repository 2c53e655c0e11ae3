"""A registered study's results from its kept records: ``results.json``, the printed table and
``accuracy.png`` (accuracy against trained samples and against training clock, every run).

Reads ``<records>/design.json``, ``targets.json`` and ``runs/*/`` (harness.py); the warm-up
runs fixed the targets and are left out of every figure. Statistics: timing.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.tools.study.design import TARGETS_FILE, StudyDesign, registered
from recipe.tools.study.evaluate import EVAL_FILE, read_points
from recipe.tools.study.harness import RECORD_FILE, RUNS_DIR
from recipe.tools.study.timing import (
    Point,
    accuracy_at,
    bootstrap,
    crossing_s,
    mean_difference,
    mean_of,
    median_ratio,
    min_detectable_ratio,
    steady_samples_per_s,
)

RESULTS_FILE = "results.json"
PLOT_FILE = "accuracy.png"
COLOURS = {"sync": "tab:blue", "one_step_off": "tab:green", "fully_async": "tab:red"}


@dataclass(frozen=True, slots=True)
class KeptRun:
    mode: str
    seed: int
    points: list[Point]
    wall_samples_per_s: float
    steady_samples_per_s: float
    samples_trained: int
    gpu: dict[str, Any]


def load_runs(records: Path) -> list[KeptRun]:
    """The measured runs kept so far (warm-ups left out)."""
    runs = []
    for path in sorted((records / RUNS_DIR).glob(f"*/{RECORD_FILE}")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["warmup"]:
            continue
        rows = read_points(path.parent / EVAL_FILE)
        metrics_path = path.parent / "metrics.jsonl"
        lines = metrics_path.read_text(encoding="utf-8").splitlines()
        metrics = [json.loads(line) for line in lines if line.strip()]
        summary = json.loads((path.parent / "summary.json").read_text(encoding="utf-8"))
        runs.append(
            KeptRun(
                mode=record["mode"],
                seed=record["seed"],
                points=[Point(r.samples, r.clock_s, r.accuracy) for r in rows],
                wall_samples_per_s=summary["throughput/samples_per_s"],
                steady_samples_per_s=steady_samples_per_s(metrics),
                samples_trained=int(summary["samples/trained"]),
                gpu=record["gpu"],
            )
        )
    return runs


def results(design: StudyDesign, records: Path) -> dict[str, Any]:
    """Every figure of the study (module docstring of timing.py)."""
    targets = json.loads((records / TARGETS_FILE).read_text(encoding="utf-8"))
    runs = load_runs(records)
    if len({r.samples_trained for r in runs}) > 1:
        counts = ", ".join(f"{r.mode}-seed{r.seed}: {r.samples_trained}" for r in runs)
        raise ValueError(f"{records}: the runs trained different numbers of samples ({counts})")
    by_mode = {m: [r for r in runs if r.mode == m] for m in design.modes}
    boot = {"resamples": design.bootstrap_resamples, "seed": design.bootstrap_seed}
    out: dict[str, Any] = {"targets": targets, "runs": {}, "modes": {}, "ratios": {}}
    for run in runs:
        out["runs"][f"{run.mode}-seed{run.seed}"] = {
            "crossing_s": [crossing_s(run.points, t) for t in targets["accuracies"]],
            "accuracy_at_budgets": [accuracy_at(run.points, b) for b in targets["budgets_s"]],
            "final_accuracy": run.points[-1].accuracy,
            "wall_samples_per_s": run.wall_samples_per_s,
            "steady_samples_per_s": run.steady_samples_per_s,
            "gpu": run.gpu,
        }
    for mode, group in by_mode.items():
        finals = [r.points[-1].accuracy for r in group]
        out["modes"][mode] = {
            "n": len(group),
            "final_accuracy": _mean_interval(finals, boot),
            "wall_samples_per_s": mean_of([r.wall_samples_per_s for r in group]),
            "steady_samples_per_s": mean_of([r.steady_samples_per_s for r in group]),
        }
    base = by_mode["sync"]
    for mode, group in by_mode.items():
        if mode == "sync" or not group or not base:
            continue
        out["ratios"][mode] = _against_sync(base, group, targets, boot)
    return out


def _mean_interval(values: list[float], boot: dict[str, int]) -> dict[str, float]:
    if not values:
        return {}
    interval = bootstrap([values], mean_of, **boot)
    return interval.as_dict()


def _against_sync(
    base: list[KeptRun], group: list[KeptRun], targets: dict[str, Any], boot: dict[str, int]
) -> dict[str, Any]:
    per_target = []
    for target in targets["accuracies"]:
        times = [[crossing_s(r.points, target) for r in runs] for runs in (base, group)]
        ratio = bootstrap(times, median_ratio, **boot)
        logs = [[math.log(t) for t in ts if t is not None and t > 0] for ts in times]
        per_target.append(
            {
                "target": target,
                "median_ratio": ratio.as_dict(),
                "censored": {"sync": times[0].count(None), "other": times[1].count(None)},
                "min_detectable_ratio": min_detectable_ratio(logs, min(len(base), len(group))),
            }
        )
    per_budget = []
    for budget in targets["budgets_s"]:
        acc = [[accuracy_at(r.points, budget) for r in runs] for runs in (base, group)]
        diff = bootstrap(acc, mean_difference, **boot)
        per_budget.append({"budget_s": budget, "accuracy_difference": diff.as_dict()})
    finals = [[r.points[-1].accuracy for r in runs] for runs in (base, group)]
    return {
        "targets": per_target,
        "budgets": per_budget,
        "final_accuracy_difference": bootstrap(finals, mean_difference, **boot).as_dict(),
    }


def print_results(res: dict[str, Any]) -> None:
    for mode, row in res["modes"].items():
        final = row["final_accuracy"]
        print(
            f"{mode:>12}  n={row['n']}  final accuracy {final.get('estimate', math.nan):.3f} "
            f"[{final.get('low', math.nan):.3f}, {final.get('high', math.nan):.3f}]  "
            f"samples/s wall {row['wall_samples_per_s']:.1f}, steady "
            f"{row['steady_samples_per_s']:.1f}"
        )
    for mode, ratios in res["ratios"].items():
        for row in ratios["targets"]:
            r = row["median_ratio"]
            detectable = row["min_detectable_ratio"]
            power = "" if detectable is None else f"; detectable at <= {1 / detectable:.2f}x"
            print(
                f"{mode} / sync, time to {row['target']:.3f}: {r['estimate']:.2f}x "
                f"[{r['low']:.2f}, {r['high']:.2f}] (95% bootstrap), censored "
                f"{row['censored']['sync']} sync / {row['censored']['other']} {mode}{power}"
            )
        for row in ratios["budgets"]:
            print(
                f"{mode} - sync, accuracy at {row['budget_s']:.0f} s of training clock: "
                f"{_signed(row['accuracy_difference'])}"
            )
        print(f"{mode} - sync, final accuracy: {_signed(ratios['final_accuracy_difference'])}")


def _signed(interval: dict[str, float]) -> str:
    """A difference with its 95% bootstrap interval, signs shown."""
    return (
        f"{interval.get('estimate', math.nan):+.3f} [{interval.get('low', math.nan):+.3f}, "
        f"{interval.get('high', math.nan):+.3f}] (95% bootstrap)"
    )


def write_plot(path: Path, design: StudyDesign, records: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = json.loads((records / TARGETS_FILE).read_text(encoding="utf-8"))
    fig, (by_samples, by_clock) = plt.subplots(1, 2, figsize=(12, 4.2))
    for run in load_runs(records):
        style = {"color": COLOURS.get(run.mode), "marker": ".", "alpha": 0.8}
        label = f"{run.mode} seed {run.seed}"
        accuracy = [p.accuracy for p in run.points]
        by_samples.plot([p.samples for p in run.points], accuracy, label=label, **style)
        by_clock.plot([p.clock_s for p in run.points], accuracy, **style)
    for ax in (by_samples, by_clock):
        for target in targets["accuracies"]:
            ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel("greedy accuracy, full test set")
        ax.grid(alpha=0.3)
    by_samples.set(xlabel="trained samples", title=f"{design.name}: accuracy vs samples")
    by_clock.set(xlabel="training clock, s", title=f"{design.name}: accuracy vs time")
    by_samples.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyse(records: Path) -> dict[str, Any]:
    """results.json and accuracy.png under ``records``; returns the results."""
    design = registered(records)
    res = results(design, records)
    (records / RESULTS_FILE).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    write_plot(records / PLOT_FILE, design, records)
    return res
