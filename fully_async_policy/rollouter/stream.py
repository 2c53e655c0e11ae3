"""``GroupStream``: the fully async rollouter's streaming loop, on the actor's one event loop.

    run():    admit while the window's allowance lasts --> submit(group) to an engine
    group:    engine result --> score --> AdmissionController.complete --> release deque
    release:  release deque --put (blocks when full)--> MessageQueue   (one put at a time: FIFO)

The rollouter (actor.py, sync.py) owns the state machine and the syncs: the stream admits only
while the rollouter is RUNNING and ends when the rollouter's ``stop`` says so (``end``), once
it paused the engines. A group cut by a pause goes to the book's partials, one that waited for
a replica through a sync to its deferred tickets; the rollouter starts both again at
``end_sync`` (``start``). A dead replica's groups are admitted again (``admit_again``); any
other failure closes the queue, cuts the groups in flight (nothing of them will be trained)
and is raised from ``run()``.

The end is bounded (deadlines.py): the groups in flight come back within
``checkpoint_engine.timeout_s`` (plus an episode's environment step), the last releases go
into the queue within ``checkpoint_engine.timeout_s``; past either, the run ends anyway with
one line naming what was left (counted in the ledger as in flight, never lost silently).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fully_async_policy.admission import AdmissionController, Ticket
from fully_async_policy.deadlines import RolloutDeadlines, bounded
from fully_async_policy.messages import PromptGroup
from fully_async_policy.rollouter.engine_replicas import EngineReplicas
from fully_async_policy.rollouter.pause_policy import PausePolicy
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.states import RolloutState
from recipe.algo.dynamic_sampling import FilteredOutError, has_signal
from recipe.config import RecipeConfig
from recipe.observability.trace import ROLLOUTER_TIDS, Tracer, now_us
from recipe.protocol import Trajectory
from recipe.reward import RewardError
from recipe.run.inputs import RunInputs
from recipe.workers.rollout.requests import GroupRequest

if TYPE_CHECKING:
    from fully_async_policy.rollouter.clients import QueueProducer

logger = logging.getLogger(__name__)

_PUT_WAIT_TRACE_US = 5_000.0
"""A queue put longer than this (5 ms: more than an actor call) waited for room."""


class IdleClock:
    """Seconds during which no training group was generating."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self._idle_s = 0.0
        self._idle_since: float | None = self.start

    def set_busy(self, busy: bool) -> None:
        now = time.perf_counter()
        if busy and self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None
        elif not busy and self._idle_since is None:
            self._idle_since = now

    def idle_s(self) -> float:
        open_s = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
        return self._idle_s + open_s


class GroupStream:
    """Admits, generates, scores and releases prompt groups (module docstring)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        inputs: RunInputs,
        book: StreamBook,
        queue: QueueProducer,
        tracer: Tracer,
        *,
        state: Callable[[], RolloutState],
        version: Callable[[], int],
    ) -> None:
        """``state()`` and ``version()``: the rollouter's state and served version."""
        self.cfg, self.book, self.queue, self.tracer = cfg, book, queue, tracer
        self.admission: AdmissionController[PromptGroup] = book.admission
        self.reward_fn, self.prompt_ids = inputs.reward_fn, inputs.prompt_ids
        self.records = {r.uid: r for r in inputs.train_records}
        self._state, self._version = state, version
        self.deadlines = RolloutDeadlines(cfg)
        self._cut_if_paused = PausePolicy.of(cfg).cuts_overtaken_calls
        self.in_flight: dict[int, asyncio.Task] = {}
        """Tickets generating or being scored now, and their tasks."""
        self.judging: dict[int, tuple[Ticket, list[Trajectory]]] = {}
        """Groups of ``in_flight`` generated and awaiting their reward (a judge's verdicts):
        no pause waits for them, and a snapshot keeps them to be scored again on resume."""
        self.replica_of: dict[int, int] = {}
        """The replica each in-flight ticket generates on (once picked)."""
        self.clock = IdleClock()
        self._engines: EngineReplicas | None = None
        self._replicas: ReplicaSupervisor | None = None
        self._error: BaseException | None = None
        self._ending = False  # the rollouter stopped: run() ends (end())
        self._flushing = False  # run() is ending: the release loop returns once it is empty
        self._wake = asyncio.Event()
        self._released = asyncio.Event()
        self._puts_open = asyncio.Event()  # cleared while a snapshot reads the queue
        self._puts_open.set()
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._loop_done = asyncio.Event()
        self._loop_done.set()

    def serve_on(self, engines: EngineReplicas, replicas: ReplicaSupervisor) -> None:
        """The engines groups go to, and their supervisor (the rollouter's ``start``)."""
        self._engines, self._replicas = engines, replicas

    # ---- what the rollouter calls -------------------------------------------------------

    async def run(self) -> None:
        """Admit, generate and release until ``end()`` or a failure (module docstring)."""
        self.clock = IdleClock()
        self._loop_done.clear()
        release_task = asyncio.create_task(self._release_loop())
        failed = True
        try:
            while not self._ending:
                if self._error is not None:
                    raise self._error
                self._admit_available()
                self._wake.clear()
                await self._wake.wait()
            if self._error is not None:
                raise self._error
            failed = False
        except BaseException:
            await self._close_queue()
            raise
        finally:
            if failed:  # nothing in flight will be trained: end the groups' waits now
                for task in self.in_flight.values():
                    task.cancel()
            await self._settle()
            await self._flush_releases(release_task)
            self._loop_done.set()

    def wake(self) -> None:
        """Look again: admission may have room, or the state changed."""
        self._wake.set()

    def end(self) -> None:
        """The rollouter stopped and paused its engines: ``run()`` ends once the groups they
        cut came back and the last releases are in the queue."""
        self._ending = True
        self._wake.set()

    def fail(self, error: BaseException) -> None:
        """End the run with ``error`` (raised from ``run()``; the first one wins)."""
        self._error = self._error or error
        self._wake.set()

    def start(self, ticket: Ticket, resume: list[Trajectory] | None) -> None:
        """Generate the group of ``ticket`` (``resume``: a partial's responses so far)."""
        self.in_flight[ticket.ticket] = asyncio.create_task(self._generate(ticket, resume))
        self._quiet.clear()
        self.clock.set_busy(True)

    def admit_again(self, ticket: int, uid: str) -> None:
        """The prompt of ``ticket`` (released too old, or lost with its replica) again: a new
        ticket in the current window, generated from scratch on the served weights, or at
        ``end_sync`` while a sync holds admission."""
        self.book.num_resumes.pop(ticket, None)
        new = self.admission.readmit(ticket, uid)
        if self._state() is RolloutState.RUNNING:
            self.start(new, resume=None)
        else:
            self.book.deferred.append(new)

    @property
    def num_generating(self) -> int:
        """Groups in flight on the engines (not those awaiting their reward)."""
        return len(self.in_flight) - len(self.judging)

    async def quiet(self) -> None:
        """Returns once no group generates (groups awaiting their reward may be in flight)."""
        await self._quiet.wait()

    async def finished(self) -> None:
        """Returns once ``run()`` ended."""
        await self._loop_done.wait()

    @contextlib.asynccontextmanager
    async def puts_held(self) -> AsyncIterator[None]:
        """No put into the queue starts inside (a snapshot reads the queue)."""
        self._puts_open.clear()
        try:
            yield
        finally:
            self._puts_open.set()

    # ---- one group --------------------------------------------------------------------

    def _admit_available(self) -> None:
        while self._state() is RolloutState.RUNNING and self.admission.can_admit():
            record = self.book.cursor.next()
            self.start(self.admission.admit(record.uid), resume=None)

    async def _generate(self, ticket: Ticket, resume: list[Trajectory] | None) -> None:
        assert self._engines is not None and self._replicas is not None, "serve_on() first"
        rollout = self.cfg.rollout
        replica = worker = None
        try:
            replica = await self._replicas.pick()
            if replica is None:  # no replica served it before a sync or the stop
                self._hold_back(ticket, resume)
                return
            worker = self._engines.workers[replica]
            self.replica_of[ticket.ticket] = replica
            asked = GroupRequest(
                ticket.uid,
                self.prompt_ids[ticket.uid],
                self._version(),
                rollout.n,
                rollout.temperature,
                rollout.top_p,
                rollout.top_k,
                resume=resume,
                record=self.records[ticket.uid],
                cut_if_paused=self._cut_if_paused,
            )
            trajs = await self._engines.submit(asked, replica=replica, track=False)
            if any(t.finish_reason == "aborted" for t in trajs):
                self.book.partials.append((ticket, trajs))  # cut by a pause: resumed at end_sync
                return
            self.judging[ticket.ticket] = (ticket, trajs)
            self._off_engines()
            await self.reward_fn.ascore_group(self.records[ticket.uid], trajs)
            if self._filtered_out(ticket, trajs):
                return
            group = PromptGroup(
                ticket.ticket, ticket.window, trajs, self.book.num_resumes.pop(ticket.ticket, 0)
            )
            self.book.releases.extend(self.admission.complete(ticket.ticket, group))
            self._released.set()
        except (RewardError, FilteredOutError) as exc:  # the user's function or data
            self.fail(exc)
        except Exception as exc:  # surfaces from run(), which closes the queue
            on = (replica, worker) if replica is not None and worker is not None else None
            if on is not None and await self._replicas.on_failure(*on, exc):
                self.admit_again(ticket.ticket, ticket.uid)  # lost with its dying replica
                return
            logger.exception("generating prompt %s failed", ticket.uid)
            self.fail(exc)
        finally:
            self.judging.pop(ticket.ticket, None)
            del self.in_flight[ticket.ticket]
            self.replica_of.pop(ticket.ticket, None)
            self._off_engines()

    def _off_engines(self) -> None:
        """A group left the engines (generated, or ended): quiet once none generates."""
        if not self.num_generating:
            self._quiet.set()
            self.clock.set_busy(False)

    def _hold_back(self, ticket: Ticket, resume: list[Trajectory] | None) -> None:
        """A group that waited for a serving replica when a sync began: it starts after."""
        if resume is None:
            self.book.deferred.append(ticket)
        else:
            self.book.partials.append((ticket, resume))

    def _filtered_out(self, ticket: Ticket, trajs: list[Trajectory]) -> bool:
        """Dynamic sampling: a group without reward variance is filtered, its admission slot
        given back (admission.py); ``FilteredOutError`` when a window filtered more than
        ``max_num_gen_batches - 1`` windows' worth of groups."""
        config = self.cfg.algorithm.filter_groups
        if not config.enable or has_signal(trajs, config.metric):
            return False
        self.book.num_resumes.pop(ticket.ticket, None)
        self.book.releases.extend(self.admission.filter(ticket.ticket))
        self._released.set()
        self._wake.set()  # the slot it gave back may admit another prompt
        demand, cap = self.admission.window_demand, config.max_num_gen_batches
        if cap and self.admission.num_filtered_in_window > (cap - 1) * demand:
            raise FilteredOutError(
                f"{self.admission.num_filtered_in_window} prompt groups were filtered in "
                f"version window {self.admission.window} (zero variance of "
                f"{config.metric!r}), more than {cap - 1} windows' worth of {demand}: raise "
                f"algorithm.filter_groups.max_num_gen_batches={cap}, or check that the reward "
                "can tell the responses apart"
            )
        return True

    # ---- releases -----------------------------------------------------------------------

    async def _release_loop(self) -> None:
        """Put released groups into the queue one at a time (keeps the release order)."""
        try:
            while True:
                while self.book.releases:
                    await self._puts_open.wait()
                    start_us = now_us()
                    if not await self.queue.put(self.book.releases[0]):
                        return  # queue closed: what is left stays unreleased in the ledger
                    self._trace_put(start_us)
                    self.book.releases.popleft()
                if self._flushing:
                    return
                self._released.clear()
                await self._released.wait()
        except Exception as exc:  # surfaces from run()
            logger.exception("putting a group into the message queue failed")
            self.fail(exc)

    def _trace_put(self, start_us: float) -> None:
        """A put that waited (queue full: backpressure) is a slice on the "queue" track."""
        end_us = now_us()
        if end_us - start_us > _PUT_WAIT_TRACE_US:
            self.tracer.complete(
                "put blocked", start_us, end_us, tid=ROLLOUTER_TIDS["queue"], cat="queue"
            )

    async def _close_queue(self) -> None:
        """Close the queue, so the trainer's batch wait ends at once (within
        ``checkpoint_engine.timeout_s``: the queue actor may be what failed)."""
        try:
            await bounded(self.queue.close(), self.deadlines.answer, "closing the queue")
        except Exception as exc:  # the run's own error is the one to raise
            logger.error("the message queue was not closed: %s", exc)

    async def _settle(self) -> None:
        """Wait for the groups in flight to end (cut by the stop's pause, or cancelled after
        a failure) within ``deadlines.cut_back``; past it the run ends anyway, naming them."""
        tasks = dict(self.in_flight)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks.values(), timeout=self.deadlines.cut_back.seconds)
        if pending:
            uids = {t.ticket: t.uid for t in self.admission.unreleased()}
            left = sorted(uids.get(k, str(k)) for k, task in tasks.items() if task in pending)
            logger.error(
                "the rollouter ends with %d prompt groups still in flight (%s): they did not "
                "come back within %s of being cut; they count as in flight",
                len(left),
                ", ".join(left),
                self.deadlines.cut_back,
            )
            for task in pending:
                task.cancel()

    async def _flush_releases(self, release_task: asyncio.Task) -> None:
        """Let the release loop put what is released and return (at once when the queue is
        closed), within ``checkpoint_engine.timeout_s``; past it what is left stays
        unreleased (the ledger's in flight) and one line says so."""
        self._flushing = True
        self._released.set()
        done, _ = await asyncio.wait({release_task}, timeout=self.deadlines.answer.seconds)
        if not done:
            logger.error(
                "%d finished prompt groups were not put into the message queue within %s (a "
                "full queue nobody takes from, or a hung queue actor); they count as in flight",
                len(self.book.releases),
                self.deadlines.answer,
            )
            release_task.cancel()
