"""A discrete-event simulation of the three pipelines, for ``python -m recipe.tools.plan``.

    trainer process (one per mode)          engines (fluid processor sharing)
      wait for groups   <---- complete ----   replica r: up to max_num_seqs sequences at
      train (work)                             once, each at 1 / (1/seq_tps + k/engine_tps)
      sync: pause engines, push (sync_s)       tokens/s (k = sequences running); the rest
            version + 1, resume                 wait in the replica's FIFO

A sequence's work is ``prefill_tokens + length`` tokens (length drawn from the measured
response lengths); a group is ``n`` sequences on one replica (round robin, as RolloutReplicas
does) and completes when its last sequence does. The modes follow the recipes:

    sync          submit R groups to every engine, wait, train, push
    one_step_off  wait batch k, submit k+1, train k (overlaps k+1), wait k+1, push
    fully_async   AdmissionController (the recipe's own) admits up to B prompts per version
                  window; finished groups are released in window order; the trainer takes R
                  per step and pushes every T steps (partial rollout: in-flight sequences
                  pause and go on after the push, re-prefilled; else the push waits for them)

``contention`` models resources both sides share (this project's CPU runs: trainer and engine
on the same cores): while the trainer computes and an engine generates, both run
``contention`` times slower. It is 1 on separate GPUs.

Everything runs at the speed of the measurement; ``Layout.trainer_scale`` speeds the trainer
up (more trainer GPUs, linear scaling assumed) and ``Layout.engines`` sets the replicas.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass

from fully_async_policy.admission import AdmissionController, window_budget
from recipe.tools.plan.spec import Layout, SimResult, Workload

# ---- engines ---------------------------------------------------------------------------------


@dataclass(eq=False)
class SimGroup:
    uid: int
    num_left: int
    start_version: int | None = None
    done: bool = False
    ticket: int = -1


class _Engine:
    """One replica: processor sharing over at most ``max_num_seqs`` sequences (module
    docstring). Its state is brought up to date lazily (``sync_to``), so an event costs
    O(log sequences) and untouched replicas cost nothing."""

    def __init__(self, workload: Workload, index: int) -> None:
        self.w = workload
        self.index = index
        self.done_work = 0.0  # work each running sequence has received since time 0
        self.running: list[tuple[float, int, SimGroup]] = []  # (finish at done_work, seq, group)
        self.waiting: deque[tuple[float, SimGroup]] = deque()
        self.paused = False
        self.speed = 1.0  # 1 / contention while the trainer computes
        self.busy_s = 0.0
        self.t_last = 0.0
        self.stamp = 0  # bumped on every reschedule (stale heap entries are skipped)
        self._seq = 0

    @property
    def generating(self) -> bool:
        return bool(self.running) and not self.paused

    def rate(self) -> float:
        """Work per second each running sequence receives."""
        if not self.generating:
            return 0.0
        return self.speed / (1.0 / self.w.seq_tps + len(self.running) / self.w.engine_tps)

    def sync_to(self, now: float) -> None:
        if self.generating:
            self.done_work += self.rate() * (now - self.t_last)
            self.busy_s += now - self.t_last
        self.t_last = now

    def next_time(self) -> float:
        rate = self.rate()
        if rate == 0.0:
            return math.inf
        return self.t_last + max(0.0, (self.running[0][0] - self.done_work) / rate)

    def submit(self, group: SimGroup, works: list[float], version: int) -> None:
        for work in works:
            self.waiting.append((work, group))
        self.fill(version)

    def fill(self, version: int) -> None:
        while self.waiting and len(self.running) < self.w.max_num_seqs:
            work, group = self.waiting.popleft()
            if group.start_version is None:
                group.start_version = version
            self._seq += 1
            heapq.heappush(self.running, (self.done_work + work, self._seq, group))

    def pop_finished(self, version: int) -> list[SimGroup]:
        """Groups whose last sequence finished by now (call ``sync_to`` first)."""
        done = []
        tolerance = 1e-9 * max(1.0, abs(self.done_work))
        while self.running and self.running[0][0] <= self.done_work + tolerance:
            _, _, group = heapq.heappop(self.running)
            group.num_left -= 1
            if group.num_left == 0:
                group.done = True
                done.append(group)
        self.fill(version)
        return done

    def resume(self, reprefill: bool, version: int) -> None:
        """After a push: partial sequences pay their fixed work again (re-prefill)."""
        self.paused = False
        if reprefill and self.w.prefill_tokens > 0:
            extra = self.w.prefill_tokens
            self.running = [(f + extra, s, g) for f, s, g in self.running]
            heapq.heapify(self.running)
        self.fill(version)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting


# ---- the simulation --------------------------------------------------------------------------

Command = tuple[str, object]
"""("work", seconds at full speed) | ("sleep", seconds) | ("until", predicate): wait for
groups (trainer idle time) | ("drain", predicate): wait for in-flight groups before a push."""
_WAITS = ("until", "drain")


class Simulation:
    """Runs one layout for ``num_steps`` trainer steps (``run()`` -> SimResult)."""

    def __init__(self, workload: Workload, layout: Layout, num_steps: int, seed: int = 0) -> None:
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps}: allowed >= 1")
        self.w, self.layout, self.num_steps = workload, layout, num_steps
        self.rng = random.Random(seed)
        self.engines = [_Engine(workload, i) for i in range(layout.engines)]
        self.now = 0.0
        self.version = 0
        self.trainer_busy = False  # computing (not waiting, not pushing)
        self._events: list[tuple[float, int, int]] = []  # (time, stamp, engine)
        self._next_engine = 0
        self._next_uid = 0
        self._on_done: Callable[[SimGroup], None] = lambda group: None
        self.result = SimResult(layout, [], 0, 0.0, 0.0)

    # ---- engine side -------------------------------------------------------------------

    def _touch(self, engine: _Engine) -> None:
        """Reschedule ``engine``'s next event (after ``sync_to(now)`` and a change)."""
        engine.stamp += 1
        heapq.heappush(self._events, (engine.next_time(), engine.stamp, engine.index))

    def start_group(self) -> SimGroup:
        group = SimGroup(self._next_uid, self.w.n)
        self._next_uid += 1
        works = [self.w.prefill_tokens + self.rng.choice(self.w.lengths) for _ in range(self.w.n)]
        engine = self.engines[self._next_engine]
        self._next_engine = (self._next_engine + 1) % len(self.engines)
        engine.sync_to(self.now)
        engine.submit(group, works, self.version)
        self._touch(engine)
        return group

    def in_flight(self) -> bool:
        return not all(e.idle for e in self.engines)

    def train(self, samples: int, trainer_version: int, groups: list[SimGroup]) -> Command:
        """Record the batch's staleness; the command that trains it."""
        for group in groups:
            self.result.staleness[trainer_version - (group.start_version or 0)] += self.w.n
        self.result.num_samples += samples
        work = samples * self.w.train_s_per_sample / self.layout.trainer_scale
        return ("work", work + self.w.step_overhead_s)

    def pause_engines(self) -> None:
        for engine in self.engines:
            engine.sync_to(self.now)
            engine.paused = True
            self._touch(engine)

    def resume_engines(self, *, reprefill: bool) -> None:
        for engine in self.engines:
            engine.sync_to(self.now)
            engine.resume(reprefill, self.version)
            self._touch(engine)

    def _set_trainer_busy(self, busy: bool) -> None:
        """Under contention the engines slow down while the trainer computes."""
        self.trainer_busy = busy
        speed = 1.0 / self.w.contention if busy else 1.0
        if self.w.contention == 1.0:
            return
        for engine in self.engines:
            if engine.speed != speed:
                engine.sync_to(self.now)
                engine.speed = speed
                self._touch(engine)

    def _trainer_speed(self) -> float:
        if self.w.contention == 1.0 or not any(e.generating for e in self.engines):
            return 1.0
        return 1.0 / self.w.contention

    # ---- the event loop ----------------------------------------------------------------

    def run(self, process: Generator[Command, None, None]) -> SimResult:
        """Drive the trainer ``process`` (recipe/tools/plan/modes.py) and the engines to its end."""
        self._loop(process)
        for engine in self.engines:
            engine.sync_to(self.now)
        self.result.engine_busy_s = sum(e.busy_s for e in self.engines) / len(self.engines)
        return self.result

    def _next_engine_event(self) -> float:
        while self._events:
            when, stamp, index = self._events[0]
            if stamp == self.engines[index].stamp:
                return when
            heapq.heappop(self._events)
        return math.inf

    def _loop(self, process: Generator[Command, None, None]) -> None:
        command = next(process, None)
        remaining = self._begin(command) if command is not None else 0.0
        while command is not None:
            kind, arg = command
            if kind in _WAITS and arg():  # type: ignore[operator]
                command = next(process, None)
                remaining = self._begin(command) if command is not None else 0.0
                continue
            trainer_speed = self._trainer_speed() if kind == "work" else 1.0
            until = self._next_engine_event()
            if kind in ("work", "sleep"):
                until = min(until, self.now + remaining / trainer_speed)
            if math.isinf(until):
                raise RuntimeError(f"{self.layout.mode}: simulation stalled at t={self.now}")
            dt, self.now = until - self.now, until
            if kind == "until":
                self.result.trainer_wait_s += dt
            elif kind in ("work", "sleep"):
                remaining -= dt * trainer_speed
            self._engine_events()
            if kind in ("work", "sleep") and remaining <= 1e-12:
                command = next(process, None)
                remaining = self._begin(command) if command is not None else 0.0

    def _engine_events(self) -> None:
        """Handle every engine whose next sequence finishes now."""
        while self._next_engine_event() <= self.now:
            _, _, index = heapq.heappop(self._events)
            engine = self.engines[index]
            engine.sync_to(self.now)
            finished = engine.pop_finished(self.version)
            self._touch(engine)
            for group in finished:
                self._on_done(group)

    def _begin(self, command: Command) -> float:
        kind, arg = command
        if kind not in ("work", "sleep", *_WAITS):
            raise ValueError(f"unknown simulation command {kind!r}")
        self._set_trainer_busy(kind == "work")
        return 0.0 if kind in _WAITS else float(arg)  # type: ignore[arg-type]

    # ---- helpers for the mode processes ---------------------------------------------------

    def end_step(self) -> None:
        self.result.step_end_s.append(self.now)

    def admission(self) -> AdmissionController:
        per_step, steps_per_sync = self.w.prompts_per_step, self.layout.steps_per_sync
        budget = window_budget(per_step, steps_per_sync, self.layout.staleness_threshold)
        return AdmissionController(
            budget=budget,
            window_demand=per_step * steps_per_sync,
            max_fresh=per_step * self.num_steps,
        )

    def set_on_done(self, callback: Callable[[SimGroup], None]) -> None:
        self._on_done = callback
