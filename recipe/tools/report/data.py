"""What ``recipe.tools.report.cli`` and ``recipe.tools.plan.cli`` read from a run directory,
loaded once.

``RunData`` holds a run's ``summary.json``, ``metrics.jsonl`` records, ``trace.json`` events
and resolved ``config.yaml``, and derives the figures the report shows (per-step series,
wall time of a step, idle ratios weighted by step time, the trainer's time per phase). A run
that crashed has no summary: figures then come from the records where they can, and are
``None`` where they cannot.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.observability.backends import NON_FINITE
from recipe.observability.trace import PHASES_TID, STEPS_TID, TRACE_FILE, TRAINER_PID
from recipe.observability.trace_file import load_trace

logger = logging.getLogger(__name__)


@dataclass
class RunData:
    """One run directory's files (see the module docstring)."""

    path: Path
    mode: str
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    trace: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or self.mode
        self._step_end_s = self._step_ends()

    # ---- per-step series -----------------------------------------------------------------

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of every record with a finite ``key``."""
        out = []
        for record in self.records:
            value = record.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                out.append((int(record["step"]), float(value)))
        return out

    def mean(self, key: str) -> float | None:
        values = [v for _, v in self.series(key)]
        return sum(values) / len(values) if values else None

    def wall_s(self, step: int) -> float | None:
        """Seconds from the run's start to the end of ``step`` (0: the start)."""
        if step == 0:
            return 0.0
        return self._step_end_s.get(step)

    def _step_ends(self) -> dict[int, float]:
        slices = [
            e
            for e in self.trace
            if e.get("ph") == "X" and e.get("pid") == TRAINER_PID and e.get("tid") == STEPS_TID
        ]
        if slices:
            start = self.start_us
            return {int(e["args"]["step"]): (e["ts"] + e["dur"] - start) / 1e6 for e in slices}
        ends, total = {}, 0.0  # no trace: the steps' own durations, back to back
        for step, step_s in self.series("timing/step_s"):
            total += step_s
            ends[step] = total
        return ends

    @property
    def start_us(self) -> float:
        """The first traced moment of the trainer or the rollouter (µs)."""
        starts = [e["ts"] for e in self.trace if e.get("ph") == "X" and e.get("pid") in (1, 2)]
        return min(starts) if starts else 0.0

    # ---- run figures -----------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        steps = [int(r["step"]) for r in self.records]
        return int(self.summary.get("steps", max(steps, default=0)))

    @property
    def samples_per_s(self) -> float | None:
        if "throughput/samples_per_s" in self.summary:
            return self.summary["throughput/samples_per_s"]
        samples = sum(v for _, v in self.series("throughput/samples"))
        step_s = sum(v for _, v in self.series("timing/step_s"))
        return samples / step_s if step_s > 0 else None

    @property
    def wall_time_s(self) -> float | None:
        if "wall_s" in self.summary:
            return self.summary["wall_s"]
        return max(self._step_end_s.values(), default=None)

    @property
    def initial_val_accuracy(self) -> float | None:
        if self.summary.get("initial/val_accuracy") is not None:
            return self.summary["initial/val_accuracy"]
        points = self.series("val/accuracy")
        return points[0][1] if points and points[0][0] == 0 else None

    @property
    def final_val_accuracy(self) -> float | None:
        if self.summary.get("final/val_accuracy") is not None:
            return self.summary["final/val_accuracy"]
        points = self.series("val/accuracy")
        return points[-1][1] if points else None

    @property
    def staleness_mean(self) -> float | None:
        return self.summary.get("staleness/mean", 0.0 if self.mode == "sync" else None)

    @property
    def staleness_max(self) -> float | None:
        return self.summary.get("staleness/max")

    def staleness_histogram(self) -> dict[int, int]:
        """Trained samples per staleness (summary.json; empty for a run without one)."""
        hist = self.summary.get("staleness/histogram") or {}
        return {int(level): int(count) for level, count in hist.items()}

    def idle_ratio(self, who: str) -> float | None:
        """``who`` = trainer | rollouter: per-step idle ratios weighted by step time."""
        ratios = dict(self.series(f"{who}/idle_ratio"))
        weights = dict(self.series("timing/step_s"))
        pairs = [(ratios[s], weights[s]) for s in ratios if s in weights]
        total = sum(w for _, w in pairs)
        if total > 0:
            return sum(r * w for r, w in pairs) / total
        return self.summary.get(f"{who}/idle_ratio")

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per top-level slice name on the trainer's phase track."""
        out: dict[str, float] = {}
        for event in top_level(self.trainer_phases()):
            out[event["name"]] = out.get(event["name"], 0.0) + event["dur"] / 1e6
        return out

    def trainer_phases(self) -> list[dict[str, Any]]:
        return [
            e
            for e in self.trace
            if e.get("ph") == "X" and e.get("pid") == TRAINER_PID and e.get("tid") == PHASES_TID
        ]


def top_level(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slices not inside another one (slices of one track, nested or disjoint)."""
    out, end = [], -math.inf
    for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        if event["ts"] >= end:
            out.append(event)
            end = event["ts"] + event["dur"]
    return out


def depth_of(slices: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each slice with its nesting depth on its track (0: top level)."""
    out: list[tuple[dict[str, Any], int]] = []
    stack: list[float] = []  # end times of the open slices
    for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        while stack and event["ts"] >= stack[-1]:
            stack.pop()
        out.append((event, len(stack)))
        stack.append(event["ts"] + event["dur"])
    return out


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving mean over ``window`` points (the first points use what they have)."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def load_run(path: Path) -> RunData:
    """Read a run directory; raises ``ValueError`` naming the path when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory")
    metrics, summary_file = path / "metrics.jsonl", path / "summary.json"
    if not metrics.exists() and not summary_file.exists():
        raise ValueError(f"{path}: not a run directory (no metrics.jsonl or summary.json)")
    records = _read_records(metrics) if metrics.exists() else []
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    config = _read_config(path / "config.yaml")
    trace: list[dict[str, Any]] = []
    if (path / TRACE_FILE).exists():
        try:
            trace = load_trace(path / TRACE_FILE)
        except ValueError as exc:
            logger.warning("%s: trace skipped: %s", path, exc)
    mode = summary.get("mode") or config.get("mode") or "unknown"
    return RunData(path, str(mode), records, summary, trace, config)


def _read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            logger.warning("%s:%d: not JSON (a line cut by a crash?); skipped", path, number)
            continue
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}:{number}: a record needs a 'step' field")
        records.append({k: NON_FINITE.get(v, v) if isinstance(v, str) else v
                        for k, v in record.items()})  # fmt: skip
    return records


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    import yaml

    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}
