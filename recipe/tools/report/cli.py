"""``python -m recipe.tools.report RUN_DIR [RUN_DIR ...] [--out DIR]``: plots and a summary of runs.

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

from recipe.tools.report.data import RunData, load_run
from recipe.tools.report.plotting import PLOTS

logger = logging.getLogger(__name__)

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
    from recipe.tools.report.gantt import plot_gantt

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
        prog="python -m recipe.tools.report", description=__doc__.split("\n")[0]
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
