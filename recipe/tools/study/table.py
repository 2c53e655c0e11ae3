"""The staleness study's aggregation: one row per grid point over its seeds.

Per run (a ``Cell``): final greedy validation accuracy, the area under its validation curve
(trapezoids over trainer steps, normalised by the last step: the mean accuracy over the
run), samples/s, measured staleness mean/max, the mean fractions of tokens and sequences
rejection masked (``mismatch/masked_*``), and the prompts admitted again because their groups
got older than ``max_staleness``. Per grid point: mean and sample std over
the seeds present, and the standard error of the final accuracy (std / sqrt(n)).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Cell:
    """One run of the grid."""

    threshold: float
    """``async_training.staleness_threshold``."""
    correction: str
    """A name in ``recipe.tools.study.staleness.CORRECTIONS``."""
    seed: int
    """``trainer.seed`` and ``rollout.seed``."""
    max_staleness: int | None = None
    """``async_training.max_staleness`` (None: unbounded)."""

    @property
    def point(self) -> tuple[int | None, float, str]:
        """The grid point the seeds of which are averaged."""
        return (self.max_staleness, self.threshold, self.correction)

    @property
    def name(self) -> str:
        bound = "" if self.max_staleness is None else f"-max{self.max_staleness}"
        return f"s{self.threshold:g}{bound}-{self.correction}-seed{self.seed}"


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def val_curve(records: list[dict[str, Any]], summary: dict[str, Any]) -> list[tuple[int, float]]:
    """(trainer step, val accuracy) at every validation, the final one included."""
    curve = [(r["step"], r["val/accuracy"]) for r in records if "val/accuracy" in r]
    final = summary.get("final/val_accuracy")
    if final is not None and (not curve or curve[-1][0] != summary["steps"]):
        curve.append((summary["steps"], final))
    return curve


def area(curve: list[tuple[int, float]]) -> float | None:
    """Mean accuracy over the run: trapezoids over steps / the last step."""
    if len(curve) < 2 or curve[-1][0] <= curve[0][0]:
        return None
    total = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(curve))
    return total / (curve[-1][0] - curve[0][0])


def _mean_of(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return sum(values) / len(values) if values else None


def run_row(out: Path, cell: Cell) -> dict[str, Any] | None:
    """One finished run's figures (None when it has no summary yet, or a summary of a run
    that failed or never validated: such a run is no seed of its grid point)."""
    run_dir = out / cell.name
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    if summary.get("status") == "failed" or summary.get("final/val_accuracy") is None:
        return None
    records = _records(run_dir)
    curve = val_curve(records, summary)
    return {
        **asdict(cell),
        "final_acc": summary.get("final/val_accuracy"),
        "initial_acc": summary.get("initial/val_accuracy"),
        "auc": area(curve),
        "samples_per_s": summary.get("throughput/samples_per_s"),
        "staleness_mean": summary.get("staleness/mean"),
        "staleness_max": summary.get("staleness/max"),
        "readmitted": summary.get("prompts/readmitted"),
        "masked_token_frac": _mean_of(records, "mismatch/masked_token_frac"),
        "masked_seq_frac": _mean_of(records, "mismatch/masked_seq_frac"),
        "curve": curve,
    }


def _stats(given: list[float | None]) -> tuple[float | None, float | None]:
    values = [v for v in given if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def record(records: Path, out: Path, cell: Cell) -> dict[str, Any] | None:
    """One run's figures: its record (``records/<cell>.json``, a few hundred bytes, kept in
    the repository) or, the first time, read from its run directory and recorded."""
    path = records / f"{cell.name}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    row = run_row(out, cell)
    if row is not None:
        records.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return row


def collect(records: Path, out: Path, cells: list[Cell]) -> list[dict[str, Any]]:
    """One row per grid point with the mean (and std) of every figure over its seeds."""
    runs: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    order: list[tuple] = []
    for cell in cells:
        if cell.point not in runs:
            order.append(cell.point)
        found = record(records, out, cell)
        runs[cell.point] += [found] if found is not None else []
    rows = []
    for point in order:
        done = runs[point]
        row: dict[str, Any] = {
            "max_staleness": point[0],
            "threshold": point[1],
            "correction": point[2],
            "seeds": len(done),
            "runs": done,
        }
        for key in ("final_acc", "auc", "samples_per_s", "staleness_mean", "masked_token_frac"):
            row[key], row[f"{key}_std"] = _stats([r[key] for r in done])
        row["masked_seq_frac"], _ = _stats([r["masked_seq_frac"] for r in done])
        row["staleness_max"] = max((r["staleness_max"] for r in done), default=None)
        row["readmitted"], _ = _stats([r.get("readmitted") for r in done])
        std = row["final_acc_std"]
        row["final_acc_se"] = None if std is None or not done else std / math.sqrt(len(done))
        rows.append(row)
    return rows


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'max_stale':>9} {'threshold':>9} {'correction':<17} {'seeds':>5} "
        f"{'final acc':>15} {'AUC':>15} {'samples/s':>9} {'stale mean':>10} {'max':>4} "
        f"{'masked tok':>10} {'masked seq':>10} {'readmitted':>10}"
    )
    for r in rows:
        acc = f"{_fmt(r['final_acc'], '.3f')} +- {_fmt(r['final_acc_std'], '.3f')}"
        auc = f"{_fmt(r['auc'], '.3f')} +- {_fmt(r['auc_std'], '.3f')}"
        print(
            f"{_fmt(r['max_staleness'], 'd') if r['max_staleness'] is not None else 'none':>9} "
            f"{r['threshold']:>9g} {r['correction']:<17} {r['seeds']:>5} {acc:>15} {auc:>15} "
            f"{_fmt(r['samples_per_s'], '.1f'):>9} {_fmt(r['staleness_mean'], '.2f'):>10} "
            f"{_fmt(r['staleness_max'], 'd'):>4} {_fmt(r['masked_token_frac'], '.4f'):>10} "
            f"{_fmt(r['masked_seq_frac'], '.4f'):>10} {_fmt(r['readmitted'], '.0f'):>10}"
        )


def write_results(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")


def write_plot(path: Path, rows: list[dict[str, Any]]) -> bool:
    """Validation accuracy vs trainer step, one panel per correction (and bound), one line
    per threshold (the mean over seeds at each validation); False when nothing ran."""
    from recipe.tools.report.plotting import pyplot, save_figure

    panels: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["runs"]:
            panels[(row["max_staleness"], row["correction"])].append(row)
    if not panels:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False, sharey=True
    )
    ordered = sorted(panels.items(), key=str)
    for ax, ((bound, correction), panel) in zip(axes[0], ordered, strict=True):
        for row in panel:
            points: dict[int, list[float]] = defaultdict(list)
            for run in row["runs"]:
                for step, acc in run["curve"]:
                    points[step].append(acc)
            steps = sorted(points)
            ax.plot(steps, [statistics.fmean(points[s]) for s in steps], marker="o", ms=3,
                    label=f"threshold {row['threshold']:g} (n={row['seeds']})")  # fmt: skip
        title = correction if bound is None else f"{correction}, max_staleness={bound}"
        ax.set(title=title, xlabel="trainer step", ylabel="greedy val accuracy")
        ax.legend(fontsize=7)
    return save_figure(fig, path)
