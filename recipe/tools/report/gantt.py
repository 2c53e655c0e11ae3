"""The pipeline Gantt chart of ``recipe.tools.report.cli``: a few trainer steps of a run's
trace.json.

    steps              | step 5 | step 6 | step 7 |          one bar per trainer step
    trainer            [wait][train_step ][sync]...           top-level phases
    trainer (nested)        [old_lp][update][weight_push]     phases inside them (2 levels)
    weight sender                    [gather]
    rollouter: sync                [pause]  [resume]
    rollouter: validation / queue
    engine 0 #0..#k    [gen v4][gen v4 cut] [gen v5]...       requests re-packed into rows

Engine requests are coloured by the weights version of their newest tokens (a cut request is
hatched; greedy requests, i.e. validation, are grey), so the chart shows which version fed
which step and where a sync cut generation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipe.observability.trace import (
    ENGINE_PID_BASE,
    PHASES_TID,
    ROLLOUTER_PID,
    ROLLOUTER_TIDS,
    SENDER_TID,
    STEPS_TID,
    TRAINER_PID,
)
from recipe.tools.report.data import RunData, depth_of
from recipe.tools.report.plotting import pyplot

DEFAULT_STEPS_SHOWN = 6
MAX_ROWS_PER_ENGINE = 32
PHASE_COLORS = {
    "wait_batch": "#d62728",
    "generate": "#2ca02c",
    "train_step": "#c7c7c7",
    "train": "#c7c7c7",
    "old_log_prob": "#9467bd",
    "advantages": "#8c564b",
    "update": "#1f77b4",
    "sync": "#ffbb78",
    "hold_for_sync (drain)": "#f7b6d2",
    "begin_sync (pause)": "#e377c2",
    "end_sync (resume)": "#aec7e8",
    "weight_push": "#ff7f0e",
    "pause": "#e377c2",
    "transfer": "#ff9896",
    "gather": "#c5b0d5",
    "load": "#98df8a",
    "resume": "#aec7e8",
    "validate": "#7f7f7f",
    "checkpoint": "#17becf",
    "put blocked": "#d62728",
}
OTHER_COLOR = "#bcbd22"
"""Phases without a colour of their own (the push's handshakes: agree-*, placement, ...)."""
VERSION_COLORS = ("#08519c", "#a63603", "#006d2c", "#54278f", "#7f2704", "#252525")
"""Engine requests by weights version (dark shades: apart from the phase colours)."""


def pick_window(run: RunData, steps: tuple[int, int] | None) -> tuple[float, float] | None:
    """[start, end] (µs) of the steps shown: ``steps`` = (first, last), else a few steps
    from the middle of the run (every step when it is short)."""
    slices = sorted(
        (
            e
            for e in run.trace
            if e.get("ph") == "X" and e.get("pid") == TRAINER_PID and e.get("tid") == STEPS_TID
        ),
        key=lambda e: e["args"]["step"],
    )
    if not slices:
        return None
    by_step = {e["args"]["step"]: e for e in slices}
    if steps is None:
        if len(slices) <= DEFAULT_STEPS_SHOWN + 2:
            return slices[0]["ts"], slices[-1]["ts"] + slices[-1]["dur"]
        first = slices[len(slices) // 2 - DEFAULT_STEPS_SHOWN // 2]["args"]["step"]
        steps = (first, first + DEFAULT_STEPS_SHOWN - 1)
    chosen = [by_step[s] for s in range(steps[0], steps[1] + 1) if s in by_step]
    if not chosen:
        raise ValueError(f"{run.path}: no steps {steps[0]}..{steps[1]} in trace.json")
    return chosen[0]["ts"], chosen[-1]["ts"] + chosen[-1]["dur"]


def _rows(run: RunData, lo: float, hi: float) -> list[tuple[str, list[dict[str, Any]]]]:
    def on(pid: int, tid: int) -> list[dict[str, Any]]:
        return [
            e
            for e in run.trace
            if e.get("ph") == "X"
            and e.get("pid") == pid
            and e.get("tid") == tid
            and e["ts"] < hi
            and e["ts"] + e["dur"] > lo
        ]

    rows = [("steps", on(TRAINER_PID, STEPS_TID))]
    phases = depth_of(on(TRAINER_PID, PHASES_TID))
    for depth, name in enumerate(("trainer", "trainer (nested)", "trainer (nested 2)")):
        rows.append((name, [e for e, d in phases if d == depth]))
    rows.append(("weight sender", on(TRAINER_PID, SENDER_TID)))
    for track, tid in ROLLOUTER_TIDS.items():
        rows.append((f"rollouter: {track}", on(ROLLOUTER_PID, tid)))
    engines = sorted({e["pid"] for e in run.trace if e.get("pid", 0) >= ENGINE_PID_BASE})
    for pid in engines:
        requests = [
            e
            for e in run.trace
            if e.get("ph") == "X"
            and e.get("pid") == pid
            and e.get("cat") == "rollout"
            and e["ts"] < hi
            and e["ts"] + e["dur"] > lo
        ]
        for i, packed in enumerate(_pack(requests)):
            rows.append((f"engine {pid - ENGINE_PID_BASE} #{i}", packed))
    return [(name, events) for name, events in rows if events or name == "steps"]


def _pack(slices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Greedy interval partitioning into the fewest rows; rows past the cap are merged."""
    rows: list[list[dict[str, Any]]] = []
    ends: list[float] = []
    for event in sorted(slices, key=lambda e: e["ts"]):
        for i, end in enumerate(ends):
            if end <= event["ts"]:
                rows[i].append(event)
                ends[i] = event["ts"] + event["dur"]
                break
        else:
            rows.append([event])
            ends.append(event["ts"] + event["dur"])
    if len(rows) > MAX_ROWS_PER_ENGINE:
        overflow = [e for row in rows[MAX_ROWS_PER_ENGINE - 1 :] for e in row]
        rows = [*rows[: MAX_ROWS_PER_ENGINE - 1], overflow]
    return rows


def _style(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args", {})
    if event.get("cat") == "rollout":
        if args.get("temperature") == 0:
            return {"facecolor": "#bbbbbb"}
        version = max(args.get("versions") or [0])
        style = {"facecolor": VERSION_COLORS[version % len(VERSION_COLORS)]}
        if "aborted" in args.get("finish", {}):
            style["hatch"] = "////"
        return style
    if event.get("cat") == "step":
        return {"facecolor": "#dddddd" if args.get("step", 0) % 2 else "#aaaaaa"}
    return {"facecolor": PHASE_COLORS.get(event["name"], OTHER_COLOR)}


def plot_gantt(run: RunData, out: Path, *, steps: tuple[int, int] | None = None) -> bool:
    """Write ``out`` (PNG); False when the trace has no step to show."""
    window = pick_window(run, steps)
    if window is None:
        return False
    lo, hi = window
    rows = _rows(run, lo, hi)
    plt = pyplot()
    from matplotlib.patches import Patch

    height = 1.2 + 0.22 * len(rows)
    fig, ax = plt.subplots(figsize=(13, height))
    origin = run.start_us
    for y, (_, events) in enumerate(rows):
        for event in events:
            start = (max(event["ts"], lo) - origin) / 1e6
            end = (min(event["ts"] + event["dur"], hi) - origin) / 1e6
            ax.barh(
                y,
                end - start,
                left=start,
                height=0.8,
                edgecolor="black",
                linewidth=0.2,
                **_style(event),
            )
            if event.get("cat") == "step" and end - start > 0:
                ax.text(
                    (start + end) / 2,
                    y,
                    str(event["args"]["step"]),
                    ha="center",
                    va="center",
                    fontsize=7,
                )
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim((lo - origin) / 1e6, (hi - origin) / 1e6)
    ax.set_xlabel("wall time (s since the run's first traced event)")
    ax.set_title(f"pipeline timeline: {run.label}")
    ax.grid(alpha=0.3, axis="x")
    shown = {
        e["name"] for _, events in rows for e in events if e.get("cat") not in ("rollout", "step")
    }
    handles = [
        Patch(facecolor=PHASE_COLORS[n], label=n) for n in sorted(shown & PHASE_COLORS.keys())
    ]
    others = sorted(shown - PHASE_COLORS.keys())
    if others:
        label = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        handles.append(Patch(facecolor=OTHER_COLOR, label=label))
    versions = sorted(
        {
            max(e["args"].get("versions") or [0])
            for _, events in rows
            for e in events
            if e.get("cat") == "rollout" and e["args"].get("temperature") != 0
        }
    )
    handles += [
        Patch(facecolor=VERSION_COLORS[v % len(VERSION_COLORS)], label=f"generating v{v}")
        for v in versions[:8]
    ]
    handles += [
        Patch(facecolor="white", hatch="////", label="cut by a sync"),
        Patch(facecolor="#bbbbbb", label="greedy (validation)"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True
