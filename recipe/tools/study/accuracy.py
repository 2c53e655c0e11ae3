"""Time to accuracy: how soon each mode reaches the synchronous baseline's final accuracy.

Per run (read from its run directory once, kept as a small JSON record): the validation curve
as points ``(param_version, step, samples, train_s, accuracy)``, where

    samples   trained samples when the weights of that version existed (the end of the step
              that produced it), so modes compare at equal trained samples;
    train_s   wall-clock seconds from the run's start to that step's end, minus the time the
              trainer spent blocked in validation (the initial one in every mode; later ones
              in sync and one_step_off, which validate in their loop, while fully_async
              validates on the rollouter as the trainer trains), so how often a run
              validates does not decide the race.

Per mode (over its seeds): final accuracy mean and standard error (between seeds; with one
seed, the binomial error of the validation set, sqrt(p(1-p)/n)), and the time to the target:
the first validation at which the mode's seed-averaged curve (accuracy and seconds averaged
over its seeds at each version they all validated) is at or above sync's mean final accuracy.
The headline ratio is a mode's time to the target over sync's own.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipe.tools.report.data import load_run

BLOCKING_VAL_MODES = ("sync", "one_step_off")


@dataclass(slots=True)
class ValPoint:
    version: int
    step: int
    samples: int
    train_s: float
    accuracy: float


@dataclass(slots=True)
class TrainPoint:
    """One trainer step: its mean training reward (``reward/mean``) at ``samples``."""

    step: int
    samples: int
    reward: float


@dataclass(slots=True)
class RunRecord:
    """One run's figures (committed as ``<records>/<mode>-seed<seed>.json``)."""

    mode: str
    seed: int
    steps: int
    samples: int
    wall_s: float
    samples_per_s: float
    val_prompts: int
    curve: list[ValPoint] = field(default_factory=list)
    train: list[TrainPoint] = field(default_factory=list)
    """Per-step training reward, to compare modes per sample (absent in older records)."""

    @property
    def final_accuracy(self) -> float:
        return self.curve[-1].accuracy

    def time_to(self, target: float) -> float | None:
        """``train_s`` of the first validation at or above ``target``; None if never."""
        return next((p.train_s for p in self.curve if p.accuracy >= target - 1e-12), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        curve = [ValPoint(**p) for p in data.pop("curve")]
        train = [TrainPoint(**p) for p in data.pop("train", [])]
        return cls(**data, curve=curve, train=train)


def read_run(run_dir: Path, *, seed: int) -> RunRecord:
    """The record of a finished run directory (it must have its summary.json)."""
    run = load_run(run_dir)
    steps = {int(r["step"]): r for r in run.records}
    samples, blocked, by_version = 0, 0.0, {0: (0, 0, 0.0)}
    train = []
    for step in sorted(steps):
        record = steps[step]
        samples += int(record.get("throughput/samples", 0))
        if "reward/mean" in record:
            train.append(TrainPoint(step, samples, round(float(record["reward/mean"]), 4)))
        # The initial validation precedes training in every mode; later ones block only the
        # loops that validate in line.
        if step == 0 or run.mode in BLOCKING_VAL_MODES:
            blocked += float(record.get("timing/val_s", 0.0))
        version = int(record.get("param_version", step))
        wall = run.wall_s(step) or 0.0
        by_version.setdefault(version, (step, samples, max(0.0, wall - blocked)))
    curve = []
    for record in run.records:
        if "val/accuracy" not in record:
            continue
        version = int(record.get("val/param_version", record.get("param_version", 0)))
        step, at_samples, train_s = by_version.get(version, by_version[max(by_version)])
        curve.append(ValPoint(version, step, at_samples, round(train_s, 2), record["val/accuracy"]))
    final = run.summary.get("final/val_accuracy")
    if final is not None and (not curve or curve[-1].version != run.summary["param_version"]):
        step, at_samples, train_s = by_version[max(by_version)]
        curve.append(ValPoint(max(by_version), step, at_samples, round(train_s, 2), final))
    if not curve:
        raise ValueError(f"{run_dir}: no validation in the run (set data.val_files or a val set)")
    return RunRecord(
        mode=run.mode,
        seed=seed,
        steps=int(run.summary["steps"]),
        samples=samples,
        wall_s=round(float(run.summary["wall_s"]), 2),
        samples_per_s=round(float(run.summary["throughput/samples_per_s"]), 3),
        val_prompts=max((int(r.get("val/num_prompts", 0)) for r in run.records), default=0),
        curve=_dedupe(curve),
        train=train,
    )


def _dedupe(curve: list[ValPoint]) -> list[ValPoint]:
    seen, out = set(), []
    for point in sorted(curve, key=lambda p: p.version):
        if point.version not in seen:
            seen.add(point.version)
            out.append(point)
    return out


def _mean_se(values: list[float], *, val_prompts: int) -> tuple[float, float]:
    mean = statistics.fmean(values)
    if len(values) >= 2:
        return mean, statistics.stdev(values) / math.sqrt(len(values))
    return mean, math.sqrt(mean * (1 - mean) / max(val_prompts, 1))


def table(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per mode (sync first): accuracy, throughput and time to sync's final accuracy."""
    by_mode: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_mode.setdefault(run.mode, []).append(run)
    if "sync" not in by_mode:
        raise ValueError("no sync run: the baseline that sets the target is missing")
    target = statistics.fmean(r.final_accuracy for r in by_mode["sync"])
    sync_time = _mean_time(by_mode["sync"], target)
    rows = []
    for mode in sorted(by_mode, key=lambda m: (m != "sync", m)):
        group = by_mode[mode]
        mean, se = _mean_se([r.final_accuracy for r in group], val_prompts=group[0].val_prompts)
        time_s = _mean_time(group, target)
        rows.append(
            {
                "mode": mode,
                "seeds": len(group),
                "final_accuracy": round(mean, 4),
                "final_accuracy_se": round(se, 4),
                "target": round(target, 4),
                "time_to_target_s": None if time_s is None else round(time_s, 1),
                "time_ratio": None
                if time_s is None or not sync_time
                else round(time_s / sync_time, 3),
                "samples_per_s": round(statistics.fmean(r.samples_per_s for r in group), 2),
                "wall_s": round(statistics.fmean(r.wall_s for r in group), 1),
            }
        )
    return rows


def _mean_time(runs: list[RunRecord], target: float) -> float | None:
    """When the seed-averaged curve first reaches ``target``: accuracy and ``train_s``
    averaged over the runs at each weight version they all validated (sync's averaged curve
    ends at its mean final accuracy, so sync always has a time, though some of its seeds end
    below the mean). None if the averaged curve never gets there."""
    common = set.intersection(*({p.version for p in r.curve} for r in runs))
    for version in sorted(common):
        points = [next(p for p in r.curve if p.version == version) for r in runs]
        if statistics.fmean(p.accuracy for p in points) >= target - 1e-12:
            return statistics.fmean(p.train_s for p in points)
    return None


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'mode':14s} {'seeds':>5s} {'final acc':>15s} {'to target s':>11s} "
        f"{'x sync':>7s} {'samples/s':>9s} {'wall s':>7s}"
    )
    for r in rows:
        acc = f"{r['final_accuracy']:.3f}+-{r['final_accuracy_se']:.3f}"
        to = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        ratio = "-" if r["time_ratio"] is None else f"{r['time_ratio']:.2f}"
        print(
            f"{r['mode']:14s} {r['seeds']:5d} {acc:>15s} {to:>11s} {ratio:>7s} "
            f"{r['samples_per_s']:9.1f} {r['wall_s']:7.0f}"
        )
    print(f"target: sync's final accuracy {rows[0]['target']:.3f}")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def write_plot(path: Path, runs: list[RunRecord], *, title: str = "") -> None:
    """Validation accuracy vs trained samples (left) and vs ``train_s`` (middle), one line per
    run, sync's final accuracy dashed; training reward vs trained samples, two steps averaged
    (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_samples, by_time, reward) = plt.subplots(1, 3, figsize=(16, 4))
    colours = {"sync": "tab:blue", "one_step_off": "tab:green", "fully_async": "tab:red"}
    for run in runs:
        style = {
            "color": colours.get(run.mode),
            "marker": ".",
            "label": f"{run.mode} seed {run.seed}",
        }
        accuracy = [p.accuracy for p in run.curve]
        by_samples.plot([p.samples for p in run.curve], accuracy, **style)
        by_time.plot([p.train_s for p in run.curve], accuracy, **style)
        style["marker"] = None
        pairs = [run.train[i : i + 2] for i in range(0, len(run.train) - 1, 2)]
        reward.plot(
            [pair[-1].samples for pair in pairs],
            [sum(p.reward for p in pair) / 2 for pair in pairs],
            **style,
        )
    rows = table(runs)
    for ax in (by_samples, by_time):
        ax.axhline(rows[0]["target"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel("greedy validation accuracy")
        ax.grid(alpha=0.3)
    by_samples.set(xlabel="trained samples", title=f"{title} vs trained samples".strip())
    by_time.set(xlabel="seconds (validation pauses excluded)", title=f"{title} vs time".strip())
    # Two steps averaged, in every mode: a fully_async window of T=2 trains the previous
    # window's last finishers first, then its own first ones (docs/results.md, the zigzag).
    reward.set(xlabel="trained samples", ylabel="training reward (mean of 2 steps)")
    reward.set_title(f"{title} training reward".strip())
    reward.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
