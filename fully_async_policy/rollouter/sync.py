"""``RolloutSync``: the rollouter's state machine and its side of a sync, on the actor's loop.

A sync is three calls of the trainer (its side: fully_async_policy/driver/trainer.py); the
actor (actor.py) answers them with the steps here::

    open_sync()                     resume_engines()          end_sync(v, trained)
      hold_for_sync: stop admitting;  (the push loaded v)       open window v (allowance =
        wait for running validation;  the engines generate        B - carried); resume the
        DRAIN: in-flight groups         again, each replica       engines only if paused
        finish on the old weights       once; admission stays     again (a snapshot);
      begin_sync: pause the engines;    held                      resubmit cut groups with
        CUT: in-flight groups come                                their tokens so far (new
        back "aborted" (partials)                                 tokens carry v); start
      health checks: replicas found                               validation of v (every
        dead start again                                          test_freq); admit again
      -> SyncOpening (the push's                                -> SyncPause (what the
         receivers; whether a replica                              pause did, the window
         is coming back: the trainer                               admission was held)
         then recovers it, a 4th call)

What the pause does with the groups in flight is the ``PausePolicy`` chosen once from config
(pause_policy.py): DRAIN (``partial_rollout=false``), CUT (partial, single-turn) or
KEEP_EPISODES (partial, multi-turn: episodes are not returned at a pause; the engines stop
serving them, their turns wait in the workers and continue on the new weights with per-token
versions; environment steps run on).

The long waits of a sync (a validation: ``rollout.generation_timeout_s``; groups finishing on
the old weights: the same) are ``hold_for_sync``'s, so ``begin_sync``, the pause proper, waits
only on the engines (``checkpoint_engine.timeout_s``). Every wait here has the deadline of
what it waits for and fails naming it (deadlines.py).

State machine (``state``, its steps checked: states.py): RUNNING --hold_for_sync--> PAUSED
--end_sync--> RUNNING; any --stop()--> STOPPED.
Invariant: from the end of ``begin_sync`` to the push's resume no engine request runs, so the
trainer may change the engines' weights (episodes in flight wait inside the workers;
single-turn groups came back as partials and wait for ``end_sync``).
"""

from __future__ import annotations

import dataclasses
import time

from fully_async_policy.admission import AdmissionController, Ticket
from fully_async_policy.deadlines import RolloutDeadlines, bounded
from fully_async_policy.messages import PromptGroup, SyncPause
from fully_async_policy.rollouter.pause_policy import PausePolicy
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.states import ROLLOUT_STEPS, RolloutState, check_step
from fully_async_policy.rollouter.stream import GroupStream
from fully_async_policy.rollouter.validation import VersionValidation
from recipe.config import RecipeConfig
from recipe.observability.trace import ROLLOUTER_TIDS, Tracer, traced
from recipe.protocol import Trajectory


class RolloutSync:
    """The rollouter's state (RUNNING, PAUSED, STOPPED), the version its engines serve, and
    the steps of a sync that change them (see the module docstring). Its one owner is the
    actor; the stream and the supervisor read the state and the version through it."""

    def __init__(
        self,
        cfg: RecipeConfig,
        stream: GroupStream,
        book: StreamBook,
        admission: AdmissionController[PromptGroup],
        tracer: Tracer,
    ) -> None:
        self.stream, self.book, self.admission = stream, book, admission
        self.tracer = tracer
        """The actor's trace (the sync's slices)."""
        self.max_staleness = cfg.async_training.max_staleness
        self.state = RolloutState.RUNNING
        """RUNNING --hold_for_sync--> PAUSED --end_sync--> RUNNING, any --stop--> STOPPED
        (states.py)."""
        self.version = 0
        """The weights version the engines serve (the trainer's, told at ``end_sync``)."""
        self.deadlines = RolloutDeadlines(cfg)
        """What each wait of the rollouter may take (deadlines.py)."""
        self.pause_policy = PausePolicy.of(cfg)
        """What a pause does with the groups in flight (pause_policy.py)."""
        self.replicas: ReplicaSupervisor
        """The engines' supervisor (``serve_on``, once the actor started the engines)."""
        self.validation: VersionValidation
        """Validation per weights version (``serve_on``)."""
        self._hold = (0.0, 0)
        """When the sync's hold began (``time.perf_counter()``) and the groups it drained."""
        self._pause: SyncPause | None = None
        """What the sync's pause did (``begin_sync``), answered by ``end_sync``."""

    def serve_on(self, replicas: ReplicaSupervisor, validation: VersionValidation) -> None:
        """The supervisor and the validation of the engines the actor started."""
        self.replicas, self.validation = replicas, validation

    def enter(self, state: RolloutState) -> None:
        """Step the state machine to ``state`` (a step it does not draw raises)."""
        check_step("the rollouter", self.state, state, ROLLOUT_STEPS)
        self.state = state

    def busy_replicas(self) -> list[int]:
        """The replicas with a group generating now, for a deadline's message."""
        return sorted(set(self.stream.replica_of.values()))

    @traced("hold_for_sync (drain)", tid=ROLLOUTER_TIDS["sync"], cat="sync")
    async def hold_for_sync(self) -> None:
        """A sync's long waits, before ``begin_sync`` pauses the engines: stop admitting, let
        the running validation end and, under ``PausePolicy.DRAIN``, the groups in flight
        finish on the old weights; each within ``rollout.generation_timeout_s``, past which
        ``RunFailure`` names the wait."""
        start = time.perf_counter()
        self.enter(RolloutState.PAUSED)
        self.replicas.hold(True)
        await self.validation.finish("hold_for_sync")
        num_drained = 0
        if self.pause_policy.drains_at_hold:
            num_drained = len(self.stream.in_flight)
            busy = ", ".join(map(str, self.busy_replicas())) or "?"
            what = (
                f"hold_for_sync: {num_drained} prompt groups in flight on version "
                f"{self.version} (rollout replica(s) {busy}; engine logs: RUN_DIR/engines/)"
            )
            await bounded(self.stream.quiet(), self.deadlines.generation, what)
        self._hold = (start, num_drained)

    @traced("begin_sync (pause)", tid=ROLLOUTER_TIDS["sync"], cat="sync")
    async def begin_sync(self) -> None:
        """Pause the engines so the weights can change (after ``hold_for_sync``): each replica
        within ``checkpoint_engine.timeout_s``, and the groups the pause cut come back within
        the same. What the pause did is kept for ``end_sync``'s answer."""
        if self.state is not RolloutState.PAUSED:
            raise RuntimeError(f"begin_sync() while {self.state.name}: hold_for_sync() first")
        start, num_drained = self._hold
        await self.replicas.pause_all()
        if self.pause_policy.waits_for_cut_groups:
            what = f"begin_sync: {len(self.stream.in_flight)} prompt groups cut by the pause"
            await bounded(self.stream.quiet(), self.deadlines.cut_back, what)
        num_partial = len(self.book.partials)
        if self.pause_policy.keeps_episodes:
            num_partial += self.stream.num_generating  # episodes waiting in the workers
        self._pause = SyncPause(num_partial, num_drained, time.perf_counter() - start)

    @traced("end_sync (resume)", tid=ROLLOUTER_TIDS["sync"], cat="sync")
    async def end_sync(self, version: int, num_trained: int) -> SyncPause | None:
        """The engines serve ``version`` now: open its window and generate again. The engines
        resume here only if they are paused (a snapshot paused them again); the push's
        resume was their one resume otherwise. Returns what the sync's pause did (None: a
        resumed run's replay, which followed no pause here)."""
        self.version = version
        self.admission.open_window(version, num_trained)
        if self.replicas.paused:
            await self.replicas.resume_all()
        self.replicas.hold(False)
        partials, self.book.partials = self.book.partials, []
        for ticket, trajs in partials:
            self._resume_partial(ticket, trajs)
        for ticket in self.book.deferred:
            self.stream.start(ticket, resume=None)
        self.book.deferred = []
        self.enter(RolloutState.RUNNING)
        self.validation.start(version)
        self.stream.wake()
        pause, self._pause = self._pause, None
        if pause is None:
            return None
        return dataclasses.replace(pause, window_s=time.perf_counter() - self._hold[0])

    def _resume_partial(self, ticket: Ticket, trajs: list[Trajectory]) -> None:
        max_staleness = self.max_staleness
        started = [t.min_version for t in trajs if t.model_versions]
        if max_staleness is not None and started and self.version - min(started) > max_staleness:
            # Already too old to be trained: generate it again on the new weights.
            self.book.num_resumes.pop(ticket.ticket, None)
            self.stream.start(self.admission.readmit(ticket.ticket, ticket.uid), resume=None)
            return
        self.book.num_resumes[ticket.ticket] = self.book.num_resumes.get(ticket.ticket, 0) + 1
        self.stream.start(ticket, resume=trajs)
