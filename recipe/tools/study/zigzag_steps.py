"""A run's trainer steps, each with its position in its version window: what ``python -m
recipe.tools.study.zigzag`` reads (zigzag_stats.py compares the positions, zigzag.py prints).

A fully async trainer pushes its weights every T = ``trigger_parameter_sync_step`` steps, so
each step has a position in its version window (1 = the first step after a push)::

    run directory --read_run--> RunSteps: steps, positions, one value per step and column
        metrics.jsonl --positions_of (a step that pushed ends its window)--> positions; the
                      columns of COLUMNS: training reward, response length, staleness,
                      partial share, queue size, the trainer's wait for its batch, ...
        ledger.jsonl + trace.json (when both are there) --trained_groups, group_columns-->
                      GROUP_COLUMNS, means over the step's trained groups: the longest
                      response of each (its engine requests' lengths), whether it began
                      before the window opened, its finish rank among those that began in
                      the same window (0 = first to finish, 1 = last)
    study record (docs/study/*/<mode>-seed<N>.json) --read_run--> its ``train`` rewards; it
                      carries no config, so its window is ``sync_every`` (1 for sync records)
    RunSteps --by_window--> one {position: value} per window, what the statistics compare

T is the run's ``async_training.trigger_parameter_sync_step`` unless ``sync_every`` is given
(1 for sync and one_step_off, where every step pushes: one position). Input that is neither
a run nor a record raises ``ValueError`` naming the path.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.tools.report.data import load_run
from recipe.tools.study.zigzag_stats import nanmean

COLUMNS: dict[str, str] = {
    "reward": "reward/mean",
    "length": "response_length/mean",
    "clip": "response_length/clip_ratio",
    "stale": "staleness/mean",
    "stale_max": "staleness/max",
    "partial": "partial/ratio",
    "resumed": "partial/resumed_group_ratio",
    "queue": "queue/size",
    "wait_s": "",  # trainer/idle_ratio * timing/step_s: the step's wait for its batch
    "grad_norm": "actor/grad_norm",
}
"""Per-step columns and the metrics.jsonl key each comes from."""

GROUP_COLUMNS = ("group_len", "carried", "finish_rank")
"""Per-step columns from ledger.jsonl and trace.json, means over the step's groups: the longest
response of a group, whether it began before the step's window opened (carried over), and its
place in the order in which the trained groups that began in its window finished (0 first)."""

SYNC_MODES = ("sync", "one_step_off")


@dataclass(slots=True)
class RunSteps:
    """A run's trainer steps, each with its position in its version window."""

    name: str
    mode: str
    sync_every: int
    """T: steps per version window."""
    steps: list[int]
    positions: list[int]
    """1..T per step (a last, shorter window ends early)."""
    columns: dict[str, list[float]] = field(default_factory=dict)
    """Column name -> one value per step (NaN where not recorded)."""


def positions_of(pushed: Sequence[bool]) -> list[int]:
    """Position of each step in its window: a step that pushed ends its window."""
    out, position = [], 1
    for did_push in pushed:
        out.append(position)
        position = 1 if did_push else position + 1
    return out


def read_run(path: Path, sync_every: int | None = None) -> RunSteps:
    """A run directory or a study record; ``ValueError`` naming the path when it is neither."""
    if path.is_file() and path.suffix == ".json":
        return _read_record(path, sync_every)
    run = load_run(path)
    records = [r for r in run.records if "reward/mean" in r]
    if not records:
        raise ValueError(f"{path}: no trained step in metrics.jsonl")
    every = sync_every or _config_sync_every(run.mode, run.config)
    pushed = [("timing/sync_s" in r) for r in records]
    if run.mode in SYNC_MODES or not any(pushed):  # no push recorded: count steps instead
        pushed = [(i + 1) % every == 0 for i in range(len(records))]
    steps = [int(r["step"]) for r in records]
    columns = {name: [_value(r, key) for r in records] for name, key in COLUMNS.items()}
    columns["wait_s"] = [
        _value(r, "trainer/idle_ratio") * _value(r, "timing/step_s") for r in records
    ]
    columns |= group_columns(trained_groups(path, run.trace), steps, pushed)
    return RunSteps(str(path), run.mode, every, steps, positions_of(pushed), columns)


def _read_record(path: Path, sync_every: int | None) -> RunSteps:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        mode, train = str(record["mode"]), record["train"]
        steps = [int(t["step"]) for t in train]
        rewards = [float(t["reward"]) for t in train]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a study record with 'mode' and 'train' ({exc})") from None
    if sync_every is None and mode not in SYNC_MODES:
        raise ValueError(f"{path}: a {mode} record names no window: give sync_every=T")
    every = 1 if mode in SYNC_MODES else sync_every or 1
    pushed = [(i + 1) % every == 0 for i in range(len(steps))]
    return RunSteps(str(path), mode, every, steps, positions_of(pushed), {"reward": rewards})


def _config_sync_every(mode: str, config: dict[str, Any]) -> int:
    if mode in SYNC_MODES:
        return 1
    every = config.get("async_training", {}).get("trigger_parameter_sync_step")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"mode={mode}: no async_training.trigger_parameter_sync_step in "
                         "config.yaml; give sync_every=T")  # fmt: skip
    return every


def _value(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


@dataclass(frozen=True, slots=True)
class TrainedGroup:
    """One trained group as the engines' trace shows it (times: the trace's µs)."""

    step: int
    began_us: float
    """Start of its first engine request (a resumed request continues the group)."""
    ended_us: float
    """End of its last engine request before the step."""
    max_len: int
    """Its longest response (tokens)."""
    began_window: int | None
    """Pushes before it began: the window it was admitted in (None: the trace shows no
    window openings, the rollouter's ``end_sync``, as in sync and one_step_off)."""


def trained_groups(path: Path, trace: list[dict[str, Any]]) -> list[TrainedGroup]:
    """Every group of ledger.jsonl with its engine requests in the trace (none without)."""
    ledger_file = path / "ledger.jsonl"
    if not ledger_file.is_file() or not trace:
        return []
    lines = filter(None, ledger_file.read_text(encoding="utf-8").splitlines())
    trained = {int(r["step"]): r.get("trained", []) for r in map(json.loads, lines)}
    step_end = {int(e["args"]["step"]): e["ts"] + e["dur"] for e in trace
                if e.get("name") == "step" and "step" in e.get("args", {})}  # fmt: skip
    opened = sorted(e["ts"] + e["dur"] for e in trace if e.get("name") == "end_sync (resume)")
    segments: dict[str, list[dict[str, Any]]] = defaultdict(list)  # uid -> by end time
    requests = [
        e for e in trace if e.get("name") == "generate" and "prompt_uid" in e.get("args", {})
    ]
    for event in sorted(requests, key=lambda e: e["ts"] + e["dur"]):
        segments[event["args"]["prompt_uid"]].append(event)
    out = []
    for step, uids in sorted(trained.items()):
        for uid in uids:  # its requests up to the step (a uid comes again in a later epoch)
            mine = [e for e in segments[uid] if e["ts"] + e["dur"] <= step_end.get(step, math.inf)]
            if not mine:
                continue
            began = next((e for e in reversed(mine) if not e["args"].get("resumed")), mine[0])
            max_len = max(mine[-1]["args"].get("lengths") or [0])
            window = bisect.bisect_right(opened, began["ts"]) if opened else None
            out.append(
                TrainedGroup(step, began["ts"], mine[-1]["ts"] + mine[-1]["dur"], max_len, window)
            )
    return out


def group_columns(
    groups: list[TrainedGroup], steps: list[int], pushed: list[bool]
) -> dict[str, list[float]]:
    """``GROUP_COLUMNS`` per step (empty without groups): finish_rank is a group's place in
    the order its window's trained groups finished generating (0 first, 1 last)."""
    if not groups:
        return {}
    members: dict[int, list[int]] = defaultdict(list)  # window -> indices into groups
    for index, group in enumerate(groups):
        if group.began_window is not None:
            members[group.began_window].append(index)
    rank = [math.nan] * len(groups)
    for indices in members.values():
        ordered = sorted(indices, key=lambda i: groups[i].ended_us)
        for place, index in enumerate(ordered):
            rank[index] = place / max(len(ordered) - 1, 1)
    window_of = dict(zip(steps, itertools.accumulate([0, *map(int, pushed[:-1])]), strict=True))
    by_step: dict[int, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_step[group.step].append(index)
    out: dict[str, list[float]] = {name: [] for name in GROUP_COLUMNS}
    for step in steps:
        mine = by_step.get(step, [])
        out["group_len"].append(nanmean([groups[i].max_len for i in mine]))
        carried = [_before(groups[i].began_window, window_of[step]) for i in mine]
        out["carried"].append(nanmean(carried))
        out["finish_rank"].append(nanmean([rank[i] for i in mine]))
    return out


def _before(began_window: int | None, window: int) -> float:
    return math.nan if began_window is None else float(began_window < window)


def by_window(run: RunSteps, column: str) -> list[dict[int, float]]:
    """One {position: value} per window, in order."""
    windows: list[dict[int, float]] = []
    for position, value in zip(run.positions, run.columns[column], strict=True):
        if position == 1:
            windows.append({})
        if windows:
            windows[-1][position] = value
    return windows
