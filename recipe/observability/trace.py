"""The run's timeline: ``trace.json`` in Chrome trace event format (opens in ui.perfetto.dev).

    driver (trainer)   Tracer(pid 1) --span / complete / counter--> buffer --+
    rollouter actor    Tracer(pid 2) --drain_trace(), pulled every step---->+--> TraceFile
    engine replica r   RequestTrace --RolloutReplicas.drain_trace(), pid 10+r->+    trace.json
                       (request_trace.py)

Every process buffers its own events; the trainer pulls them once per step and appends them
to ``trace.json``, so one file holds the whole pipeline. Tracks (Chrome "threads"):

    pid 1 trainer       tid 1 "steps" (one slice per trainer step, with its figures),
                        tid 2 "trainer" (phases: wait_batch, old_log_prob, advantages, update,
                        sync -> weight_push -> pause/transfer/gather/load/resume, validate,
                        checkpoint), counters (version, queue size, in-flight groups)
    pid 2 rollouter     "sync" (pause for a push), "validation", "queue" (blocked puts)
    pid 10+r engine r   one track per concurrent slot: each generation request (one prompt
                        group) is one slice with its uid, n, tokens and versions; a group cut
                        by a pause and resumed shows as two slices

Clock: ``time.time()`` in microseconds, so processes on one host agree (across hosts, as
far as their clocks do). Complete ("X") slices on one track never overlap unless nested:
each process keeps spans of concurrent activities on separate tracks.

The file itself (grown in place, readable after a crash) is recipe/observability/trace_file.py.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from recipe.observability.trace_file import TraceFile

logger = logging.getLogger(__name__)

TRACE_FILE = "trace.json"
TRAINER_PID = 1
ROLLOUTER_PID = 2
ENGINE_PID_BASE = 10
EPISODE_TID_BASE = 1000
"""Tracks of multi-turn episodes on an engine replica's process (after its request slots)."""
"""Engine replica r is process ``ENGINE_PID_BASE + r`` in the trace."""
STEPS_TID = 1
PHASES_TID = 2
SENDER_TID = 3
"""The trainer's weight sender (rank 0): phases it reports, e.g. the gather of a push."""
ROLLOUTER_TIDS = {"sync": 1, "validation": PHASES_TID, "queue": 3}
"""The rollouter's tracks; validation shares the tid of the trainer's phases, so the shared
``_validate`` records on the right track in both processes."""
MAX_BUFFERED_EVENTS = 200_000
"""A buffer nobody drains stops growing here (events beyond it are counted, not kept)."""


def now_us() -> float:
    """Wall-clock microseconds (the trace's time base)."""
    return time.time() * 1e6


class Tracer:
    """Buffers trace events of one process; ``drain()`` hands them over. Thread safe.

    ``enabled=False`` gives a tracer that records nothing, so callers never branch on it.
    """

    def __init__(
        self,
        pid: int,
        process_name: str | None,
        *,
        sort_index: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.pid = pid
        self.enabled = enabled
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._num_dropped = 0
        self._named: set[tuple[int, int | None]] = set()
        if process_name is not None:
            self.name_process(process_name, sort_index=sort_index)

    # ---- naming -------------------------------------------------------------------------

    def name_process(
        self, name: str, *, pid: int | None = None, sort_index: int | None = None
    ) -> None:
        pid = self.pid if pid is None else pid
        if not self._first_time((pid, None)):
            return
        self._add({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        if sort_index is not None:
            meta = {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0}
            self._add(meta | {"args": {"sort_index": sort_index}})

    def name_thread(self, tid: int, name: str, *, pid: int | None = None) -> None:
        pid = self.pid if pid is None else pid
        if not self._first_time((pid, tid)):
            return
        meta = {"ph": "M", "pid": pid, "tid": tid}
        self._add(meta | {"name": "thread_name", "args": {"name": name}})
        self._add(meta | {"name": "thread_sort_index", "args": {"sort_index": tid}})

    def _first_time(self, key: tuple[int, int | None]) -> bool:
        with self._lock:
            if key in self._named:
                return False
            self._named.add(key)
            return True

    # ---- events -------------------------------------------------------------------------

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        *,
        tid: int = PHASES_TID,
        cat: str = "trainer",
        args: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """A complete slice around the block; yields its ``args`` dict to fill in. Recorded
        also when the block raises (with ``error`` set), so a failing phase is visible."""
        span_args: dict[str, Any] = dict(args or {})
        start_us = now_us()
        try:
            yield span_args
        except BaseException as exc:
            span_args["error"] = type(exc).__name__
            raise
        finally:
            self.complete(name, start_us, now_us(), tid=tid, cat=cat, args=span_args)

    def complete(
        self,
        name: str,
        start_us: float,
        end_us: float,
        *,
        tid: int = PHASES_TID,
        pid: int | None = None,
        cat: str = "trainer",
        args: Mapping[str, Any] | None = None,
    ) -> None:
        """One "X" slice from ``start_us`` to ``end_us`` (microseconds, ``now_us`` clock)."""
        event = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "pid": self.pid if pid is None else pid,
            "tid": tid,
            "ts": round(start_us, 1),
            "dur": round(max(end_us - start_us, 0.0), 1),
        }
        if args:
            event["args"] = dict(args)
        self._add(event)

    def counter(
        self, name: str, values: Mapping[str, float], *, ts_us: float | None = None
    ) -> None:
        """A "C" event: one counter track per ``name``, one series per key of ``values``."""
        series = {k: float(v) for k, v in values.items() if v is not None}
        if series:
            ts = round(now_us() if ts_us is None else ts_us, 1)
            event = {"ph": "C", "name": name, "pid": self.pid, "tid": 0, "ts": ts}
            self._add(event | {"args": series})

    def _add(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self._lock:
            if len(self._events) >= MAX_BUFFERED_EVENTS:
                self._num_dropped += 1
                return
            self._events.append(event)

    def drain(self) -> list[dict[str, Any]]:
        """Take every buffered event (an instant event reports any that were dropped)."""
        with self._lock:
            events, self._events = self._events, []
            dropped, self._num_dropped = self._num_dropped, 0
        if dropped:
            logger.warning("trace buffer of pid %d was full: %d events dropped", self.pid, dropped)
            events.append(
                {
                    "ph": "i",
                    "s": "p",
                    "name": "trace events dropped",
                    "pid": self.pid,
                    "tid": 0,
                    "ts": round(now_us(), 1),
                    "args": {"num_dropped": dropped},
                }
            )
        return events


def traced(name: str, *, tid: int = PHASES_TID, cat: str = "trainer") -> Callable:
    """Method decorator: the call is one slice on ``self.tracer`` (sync or async methods)."""

    def wrap(fn: Callable) -> Callable:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                with self.tracer.span(name, tid=tid, cat=cat):
                    return await fn(self, *args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.tracer.span(name, tid=tid, cat=cat):
                return fn(self, *args, **kwargs)

        return run

    return wrap


STEP_ARG_KEYS = (
    "throughput/samples",
    "reward/mean",
    "staleness/mean",
    "staleness/max",
    "timing/step_s",
    "trainer/idle_ratio",
    "rollouter/idle_ratio",
)
"""Step figures copied into each step slice's args (those the step has)."""
_COUNTERS = {
    "queue": ("queue/size", "size"),
    "in_flight": ("rollouter/in_flight", "groups"),
    "staleness": ("staleness/mean", "mean"),
}


class RunTrace:
    """The driver's side of the trace: its Tracer, ``trace.json``, and per-step pulls from
    the other processes (``sources``: callables returning their buffered events)."""

    def __init__(self, run_dir: Path, *, mode: str, flush_interval_s: float = 10.0) -> None:
        self.tracer = Tracer(TRAINER_PID, "trainer", sort_index=TRAINER_PID)
        self.tracer.name_thread(STEPS_TID, "steps")
        self.tracer.name_thread(PHASES_TID, "trainer")
        self.tracer.name_thread(SENDER_TID, "weight sender")
        self.file = TraceFile(
            Path(run_dir) / TRACE_FILE,
            other_data={"mode": mode},
            flush_interval_s=flush_interval_s,
        )
        self._failed_sources: set[str] = set()
        self._closed = False
        self._last_end_us = 0.0

    def step(self, step: int, version: int, metrics: Mapping[str, float]) -> None:
        """One slice on the "steps" track ending now, ``timing/step_s`` long, plus counters
        (``version``: the weights version after the step)."""
        end_us = now_us()
        # Steps follow each other: a step measured from a slightly earlier clock reading
        # must not start inside the previous slice.
        start_us = max(end_us - metrics.get("timing/step_s", 0.0) * 1e6, self._last_end_us)
        self._last_end_us = end_us
        args: dict[str, float] = {"step": step, "version": version}
        args |= {k: metrics[k] for k in STEP_ARG_KEYS if k in metrics}
        self.tracer.complete("step", start_us, end_us, tid=STEPS_TID, cat="step", args=args)
        self.tracer.counter("param_version", {"version": version}, ts_us=end_us)
        for name, (key, series) in _COUNTERS.items():
            if key in metrics:
                self.tracer.counter(name, {series: metrics[key]}, ts_us=end_us)

    def pull(
        self, sources: Iterable[Callable[[], list[dict[str, Any]]]] = (), *, force: bool = False
    ) -> list[dict[str, Any]]:
        """Move this process's and every source's events into the file (written when the
        flush interval passed, or ``force``); returns the events moved. A failing source is
        logged and skipped: the trace never stops a run."""
        events = self.tracer.drain()
        for source in sources:
            try:
                events += source()
            except Exception as exc:
                name = getattr(source, "__qualname__", repr(source))
                if name not in self._failed_sources:
                    self._failed_sources.add(name)
                    logger.warning("trace: pulling events from %s failed: %r", name, exc)
        self.file.add(events)
        self.file.flush(force=force)
        return events

    def close(self, sources: Iterable[Callable[[], list[dict[str, Any]]]] = ()) -> None:
        """Pull what is left and close the file; safe to call twice."""
        if self._closed:
            return
        try:
            self.pull(sources, force=True)
        finally:
            self._closed = True
            self.file.close()
