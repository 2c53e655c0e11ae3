"""The report's curve plots: one PNG each, several runs overlaid (one colour per run).

Every plot takes the loaded runs and the output path and returns whether it wrote an image
(False: no run has the data). Matplotlib runs on its file-only Agg backend (``pyplot()``), so
reports are written without a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipe.tools.report.data import RunData, smooth


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (reports run without a screen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def plot_agent(runs: list[RunData], out: Path) -> bool:
    """Multi-turn episodes: model turns per episode (left) and environment seconds per
    episode, p50 and p99 (right), per step; nothing for runs without episodes."""
    if not any(run.series("agent/turns_mean") for run in runs):
        return False
    plt = pyplot()
    fig, (turns, env) = plt.subplots(1, 2, figsize=(11, 3.8))
    for run in runs:
        points = run.series("agent/turns_mean")
        if points:
            turns.plot([p[0] for p in points], [p[1] for p in points], label=run.label)
        for key, style in (("agent/env_s_p50", "-"), ("agent/env_s_p99", "--")):
            points = run.series(key)
            if points:
                label = f"{run.label} {key.rsplit('_', 1)[1]}"
                env.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    turns.set(xlabel="trainer step", ylabel="model turns", title="turns per episode (mean)")
    env.set(xlabel="trainer step", ylabel="seconds", title="environment time per episode")
    for ax in (turns, env):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


PLOTS = {
    "val_accuracy": plot_val_accuracy,
    "reward": plot_reward,
    "staleness": plot_staleness,
    "idle_ratios": plot_idle_ratios,
    "sync_times": plot_sync_times,
    "agent": plot_agent,
}
