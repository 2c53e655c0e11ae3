"""``python -m recipe.report RUN_DIR [RUN_DIR ...] [--out DIR]``: plots and a summary of runs.

    run dir: summary.json, metrics.jsonl, trace.json, config.yaml
        |
        v
    RunData (one per run) --> curves.png-style PNGs (several runs overlaid, one colour each)
                          --> gantt_<run>.png (the pipeline timeline, from trace.json)
                          --> report.md (one table row per run, the images below it)

Images: validation accuracy and reward vs step and vs wall time, staleness histogram, idle
ratios over time, weight-sync times, and per run a Gantt chart of a few steps of its trace
(trainer phases, rollouter pauses, every engine's generation requests). Wall time is seconds
since the run's first traced event (the initial validation), from the trace's step slices;
runs without a trace fall back to the sum of ``timing/step_s``.

The default output is ``RUN_DIR/report`` for one run and ``./report`` for several.
Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import time
from pathlib import Path

from recipe.report_data import RunData, load_run, pyplot, smooth

logger = logging.getLogger(__name__)

IMAGES = ("val_accuracy", "reward", "staleness", "idle_ratios", "sync_times")


def save_figure(fig, out: Path) -> bool:
    """Lay out, write ``out`` (PNG) and free ``fig``; True (a plot was written)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


# ---- curves ----------------------------------------------------------------------------------


def _curve_pair(runs: list[RunData], key: str, title: str, out: Path, *, window: int) -> bool:
    """``key`` vs step (left) and vs wall time (right), one line per run."""
    series = [(run, run.series(key)) for run in runs]
    if not any(points for _, points in series):
        return False
    plt = pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 3.8))
    for run, points in series:
        if not points:
            continue
        steps = [p[0] for p in points]
        values = smooth([p[1] for p in points], window)
        marker = "o" if len(points) <= 30 else None
        by_step.plot(steps, values, label=run.label, marker=marker, markersize=3)
        times = [run.wall_s(step) for step in steps]
        pairs = [(t, v) for t, v in zip(times, values, strict=True) if t is not None]
        if pairs:
            by_time.plot(*zip(*pairs, strict=True), label=run.label, marker=marker, markersize=3)
    suffix = f" (moving mean of {window})" if window > 1 else ""
    by_step.set(xlabel="trainer step", ylabel=title, title=f"{title} vs step{suffix}")
    by_time.set(xlabel="wall time (s)", ylabel=title, title=f"{title} vs wall time{suffix}")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_val_accuracy(runs: list[RunData], out: Path) -> bool:
    return _curve_pair(runs, "val/accuracy", "val accuracy", out, window=1)


def plot_reward(runs: list[RunData], out: Path) -> bool:
    longest = max((len(run.series("reward/mean")) for run in runs), default=0)
    window = max(1, longest // 25)
    return _curve_pair(runs, "reward/mean", "train reward", out, window=window)


def plot_staleness(runs: list[RunData], out: Path) -> bool:
    """Share of trained samples per staleness (versions), one bar group per run."""
    hists = [(run, run.staleness_histogram()) for run in runs]
    hists = [(run, h) for run, h in hists if h]
    if not hists:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    levels = sorted({level for _, hist in hists for level in hist})
    width = 0.8 / len(hists)
    for i, (run, hist) in enumerate(hists):
        total = sum(hist.values())
        shares = [hist.get(level, 0) / total for level in levels]
        xs = [level + (i - (len(hists) - 1) / 2) * width for level in levels]
        ax.bar(xs, shares, width=width, label=run.label)
    ax.set(
        xlabel="staleness (trainer version - oldest token version)",
        ylabel="share of trained samples",
        title="staleness histogram",
        xticks=levels,
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, out)


def plot_idle_ratios(runs: list[RunData], out: Path) -> bool:
    keys = (("trainer/idle_ratio", "trainer"), ("rollouter/idle_ratio", "rollouter"))
    if not any(run.series(key) for run in runs for key, _ in keys):
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, (key, who) in zip(axes, keys, strict=True):
        for run in runs:
            points = run.series(key)
            if points:
                window = max(1, len(points) // 25)
                ax.plot(
                    [p[0] for p in points], smooth([p[1] for p in points], window), label=run.label
                )
        ax.set(xlabel="trainer step", ylabel="idle ratio", title=f"{who} idle ratio", ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


SYNC_PHASES = ("sync/gather_s", "sync/transfer_s", "sync/verify_s", "sync/load_s")


def plot_sync_times(runs: list[RunData], out: Path) -> bool:
    """Each push's time over the run (left) and the mean phase split per run (right)."""
    if not any(run.series("sync/total_s") for run in runs):
        return False
    plt = pyplot()
    fig, (over_time, split) = plt.subplots(1, 2, figsize=(11, 3.8))
    for run in runs:
        total = run.series("sync/total_s")
        if total:
            over_time.plot([p[0] for p in total], [p[1] for p in total], ".", label=run.label)
        window = run.series("sync/pause_window_s")
        if window:
            steps, values = [p[0] for p in window], [p[1] for p in window]
            over_time.plot(steps, values, "x", label=f"{run.label}: generation paused")
    over_time.set(xlabel="trainer step", ylabel="seconds", title="weight push per sync")
    over_time.grid(alpha=0.3)
    over_time.legend(fontsize=8)
    labels = [run.label for run in runs]
    bottoms = [0.0] * len(runs)
    for phase in SYNC_PHASES:
        means = [run.mean(phase) or 0.0 for run in runs]
        split.bar(labels, means, bottom=bottoms, label=phase.removeprefix("sync/"))
        bottoms = [b + m for b, m in zip(bottoms, means, strict=True)]
    split.set(ylabel="seconds per push (mean)", title="push phases")
    split.legend(fontsize=8)
    split.tick_params(axis="x", labelrotation=15)
    return save_figure(fig, out)


PLOTS = {
    "val_accuracy": plot_val_accuracy,
    "reward": plot_reward,
    "staleness": plot_staleness,
    "idle_ratios": plot_idle_ratios,
    "sync_times": plot_sync_times,
}


# ---- the report ------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def summary_table(runs: list[RunData]) -> list[str]:
    head = (
        "| run | mode | steps | samples/s | wall s | val acc start -> end | trainer idle | "
        "rollouter idle | staleness mean / max | push s |"
    )
    rows = [head, "|" + "---|" * 10]
    for run in runs:
        acc = f"{_fmt(run.initial_val_accuracy)} -> {_fmt(run.final_val_accuracy)}"
        stale = f"{_fmt(run.staleness_mean, '.2f')} / {_fmt(run.staleness_max, '.0f')}"
        rows.append(
            f"| {run.label} | {run.mode} | {run.num_steps} | {_fmt(run.samples_per_s, '.1f')} | "
            f"{_fmt(run.wall_time_s, '.1f')} | {acc} | {_fmt(run.idle_ratio('trainer'), '.2f')} | "
            f"{_fmt(run.idle_ratio('rollouter'), '.2f')} | {stale} | "
            f"{_fmt(run.mean('sync/total_s'), '.3f')} |"
        )
    return rows


def phase_table(runs: list[RunData]) -> list[str]:
    """Where the trainer's time went: seconds per top-level phase, from the traces."""
    shares = {run.label: run.phase_seconds() for run in runs if run.trace}
    phases = sorted({p for per_run in shares.values() for p in per_run})
    if not phases:
        return []
    rows = ["| run | " + " | ".join(phases) + " |", "|" + "---|" * (len(phases) + 1)]
    for label, per_run in shares.items():
        rows.append(
            f"| {label} | " + " | ".join(_fmt(per_run.get(p), ".1f") for p in phases) + " |"
        )
    return rows


def write_report(
    run_dirs: list[Path], out_dir: Path, *, gantt_steps: tuple[int, int] | None = None
) -> Path:
    """Load the runs, write the PNGs and ``report.md`` into ``out_dir``; returns the .md."""
    from recipe.report_gantt import plot_gantt

    runs = [load_run(path) for path in run_dirs]
    _unique_labels(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[str, str]] = []
    for name, plot in PLOTS.items():
        if plot(runs, out_dir / f"{name}.png"):
            written.append((name.replace("_", " "), f"{name}.png"))
        else:
            logger.info("report: no data for %s", name)
    for run in runs:
        image = f"gantt_{_slug(run.label)}.png"
        if run.trace and plot_gantt(run, out_dir / image, steps=gantt_steps):
            written.append((f"pipeline timeline: {run.label}", image))
    lines = [
        "# Run report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} from: "
        + ", ".join(f"`{run.path}`" for run in runs),
        "",
        *summary_table(runs),
        "",
        "samples/s: trained responses over the run's wall time (summary.json); idle ratios: "
        "the share of a step the trainer waited for samples / no engine was generating, "
        "averaged over steps weighted by step time; push s: mean weight-push time.",
        "",
    ]
    phases = phase_table(runs)
    if phases:
        lines += ["## Trainer time by phase (seconds, from trace.json)", "", *phases, ""]
    for title, image in written:
        lines += [f"## {title}", "", f"![{title}]({image})", ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


def _unique_labels(runs: list[RunData]) -> None:
    """Label runs by mode; by mode and directory when a mode appears twice."""
    modes = [run.mode for run in runs]
    for run in runs:
        run.label = run.mode if modes.count(run.mode) == 1 else f"{run.mode} ({run.path.name})"


def _slug(text: str) -> str:
    """``fully_async (run-2)`` -> ``fully_async_run-2``."""
    return re.sub(r"[^\w-]+", "_", text).strip("_")


def _parse_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        first, last = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gantt-steps={text!r}: expected FIRST:LAST") from None
    if not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"--gantt-steps={text!r}: need 1 <= FIRST <= LAST")
    return first, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument(
        "--gantt-steps", default=None, help="trainer steps the Gantt charts show, FIRST:LAST"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out = args.out or (args.run_dirs[0] / "report" if len(args.run_dirs) == 1 else Path("report"))
    try:
        steps = _parse_steps(args.gantt_steps)
        report = write_report(args.run_dirs, out, gantt_steps=steps)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
