"""``trace.json`` on disk: written in place as a run goes, read back by the report and the
planner.

The file is grown in place: new events are written over the closing ``]}`` which is then
written again, so after every flush it is a complete JSON object (Chrome trace format), and a
run that crashes loses only what was not flushed yet. One event per line, so a file cut
mid-write is still readable (``load_trace`` skips the broken line).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from recipe.observability.backends import json_safe

logger = logging.getLogger(__name__)

_HEADER = '{"displayTimeUnit": "ms", "otherData": %s, "traceEvents": [\n'
_TAIL = "\n]}\n"


class TraceFile:
    """``trace.json``, appended in place (see the module docstring). Not thread safe: one
    owner (the driver) adds and flushes.

    An existing file (a resumed run in the same directory) is continued: complete events
    are kept, a line cut by a crash is dropped.
    """

    def __init__(
        self,
        path: Path,
        *,
        other_data: Mapping[str, Any] | None = None,
        flush_interval_s: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self._pending: list[dict[str, Any]] = []
        self._last_flush = 0.0
        self._closed = False
        kept = load_trace(self.path) if self.path.exists() else []
        self._file = self.path.open("w", encoding="utf-8")
        self._file.write(_HEADER % json.dumps(dict(other_data or {})))
        self._num_written = 0
        self._tail_at = self._file.tell()
        self._write(kept)

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        self._pending.extend(events)

    def flush(self, *, force: bool = False) -> None:
        """Write what was added, if ``flush_interval_s`` passed since the last write (or
        ``force``)."""
        if self._closed or not self._pending:
            return
        if not force and time.monotonic() - self._last_flush < self.flush_interval_s:
            return
        events, self._pending = self._pending, []
        self._write(events)

    def _write(self, events: list[dict[str, Any]]) -> None:
        self._file.seek(self._tail_at)
        parts = []
        for event in events:
            parts.append(("" if self._num_written == 0 else ",\n") + _dumps(event))
            self._num_written += 1
        self._file.write("".join(parts))
        self._tail_at = self._file.tell()
        self._file.write(_TAIL)
        self._file.truncate()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._closed:
            return
        self.flush(force=True)
        self._closed = True
        self._file.close()


def _dumps(event: Mapping[str, Any]) -> str:
    return json.dumps(json_safe(dict(event)), separators=(",", ":"), allow_nan=False)


def load_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a trace file; a file cut by a crash gives its complete events."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        events = []
        for line in text.splitlines()[1:]:
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line.strip().rstrip(","))
                if isinstance(event, dict) and "ph" in event:
                    events.append(event)
        logger.warning("%s was cut mid-write; kept %d complete events", path, len(events))
        return events
    if isinstance(data, list):
        return data
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no 'traceEvents' list)")
    return data["traceEvents"]


def busy_s(events: Iterable[Mapping[str, Any]], start_us: float, end_us: float) -> float:
    """Seconds within [start_us, end_us] covered by at least one of the slices ``events``."""
    spans = sorted(
        (max(e["ts"], start_us), min(e["ts"] + e["dur"], end_us))
        for e in events
        if e.get("ph") == "X"
    )
    total, cur_start, cur_end = 0.0, None, None
    for lo, hi in spans:
        if hi <= lo:
            continue
        if cur_end is None or lo > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = lo, hi
        else:
            cur_end = max(cur_end, hi)
    if cur_end is not None:
        total += cur_end - cur_start
    return total / 1e6


def rollout_slices(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The engines' generation slices among ``events``."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "rollout"]
