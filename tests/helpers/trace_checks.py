"""Checks of a real run's trace.json shared by the recipes' integration tests."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from recipe.observability.trace import ENGINE_PID_BASE, TRAINER_PID

TOLERANCE_US = 1.0
"""Timestamps are written to 0.1 us: a child may end a rounding step after its parent."""


def load_checked(run_dir: Path) -> list[dict[str, Any]]:
    """trace.json as Perfetto reads it: a JSON object with traceEvents and a display unit,
    every slice on a track nested in or disjoint from the others, names for every track."""
    data = json.loads((run_dir / "trace.json").read_text())
    assert data["displayTimeUnit"] == "ms"
    events = data["traceEvents"]
    assert {e["ph"] for e in events} >= {"M", "X", "C"}
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["ts"] > 1e15  # wall clock in microseconds
            tracks[(event["pid"], event["tid"])].append(event)
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    processes = {e["pid"] for e in events if e["name"] == "process_name"}
    for (pid, tid), slices in tracks.items():
        assert (pid, tid) in named and pid in processes, (pid, tid)
        _assert_nested(slices)
    return events


def _assert_nested(slices: list[dict[str, Any]]) -> None:
    open_ends: list[float] = []
    for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        while open_ends and event["ts"] >= open_ends[-1] - TOLERANCE_US:
            open_ends.pop()
        end = event["ts"] + event["dur"]
        assert not open_ends or end <= open_ends[-1] + TOLERANCE_US, f"{event} crosses its parent"
        open_ends.append(end)


def slices(events: list[dict[str, Any]], name: str, pid: int = TRAINER_PID) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["name"] == name]


def requests(events: list[dict[str, Any]], *, training: bool = True) -> list[dict[str, Any]]:
    """The engines' generation slices: sampled (training) or greedy (validation)."""
    out = [e for e in events if e["ph"] == "X" and e.get("cat") == "rollout"]
    assert all(e["pid"] >= ENGINE_PID_BASE for e in out)
    return [e for e in out if (e["args"]["temperature"] > 0) == training]
