"""``FullyAsyncRollouter``: streams prompt groups through the engines into the message queue.

Runs as an async Ray actor beside the trainer; it owns the rollout engines (``RolloutReplicas``)
and the prompt cursor. One event loop drives everything, so no state needs a lock. The
streaming loop (admit, generate, score, release into the queue) is ``GroupStream``
(stream.py); this class holds the state machine around it and the trainer's calls. A sync
is three calls (the trainer's side: fully_async_policy/driver/trainer.py)::

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
Checkpoints use the same pause: ``snapshot()`` (after the push, before ``end_sync``) is then
the rollouter's whole state; ``restore()`` loads it before ``run()``, and the trainer replays
``end_sync`` (fully_async_policy/rollouter/snapshot.py).

Validation runs here, on the engines, at the start of a window and next to the window's
training generation, so the trainer never waits for it; the next ``hold_for_sync`` waits for
it to end so that every val answer comes from one version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.admission import AdmissionController, Ticket
from fully_async_policy.deadlines import RolloutDeadlines, bounded
from fully_async_policy.messages import (
    ROLLOUTER_STATE_FILE,
    PromptGroup,
    RolloutLedger,
    RolloutProgress,
    SyncOpening,
    SyncPause,
)
from fully_async_policy.rollouter.engine_replicas import EngineReplicas
from fully_async_policy.rollouter.pause_policy import PausePolicy
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.states import (
    ROLLOUT_STEPS,
    ReplicaState,
    RolloutState,
    check_step,
)
from fully_async_policy.rollouter.stream import GroupStream
from fully_async_policy.rollouter.validation import VersionValidation, score_val_set
from fully_async_policy.run_plan import RunPlan
from recipe.agent.loading import episodes_save_state
from recipe.checkpoint.rng import capture_rng, restore_rng
from recipe.checkpoint.store import RUN_STATE_DIR
from recipe.config import RecipeConfig
from recipe.data.cursor import PromptCursor
from recipe.observability.trace import ROLLOUTER_PID, ROLLOUTER_TIDS, Tracer, traced
from recipe.protocol import Trajectory
from recipe.run.inputs import RunInputs
from recipe.run.placement import Placement
from recipe.utils.weights_file import WeightsFile
from recipe.workers.rollout.client import ReplicaClient

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)


class FullyAsyncRollouter:
    """The rollout side of the fully async recipe (see the module docstring).

    It composes its own pieces: the run's inputs (``RunInputs``), the engines
    (``EngineReplicas``) and their ``ReplicaSupervisor``, the prompt cursor, the admission
    controller and the queue's handle. Nothing in it needs Ray but the handles it is given, so
    a test builds it in-process with fake engines and an in-memory queue."""

    def __init__(
        self,
        cfg: RecipeConfig,
        run_dir: Path,
        queue: ActorHandle,
        plan: RunPlan,
        engines: Any,
        *,
        inputs: RunInputs,
    ) -> None:
        """``queue``: the MessageQueue actor released groups go into; ``engines``: the
        engines' placement group, reserved by the driver with the trainer's; ``inputs``: the
        data, prompt ids and reward function the driver loaded and checked (never loaded
        again here)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.inputs = inputs
        self.reward_fn, self.prompt_ids = self.inputs.reward_fn, self.inputs.prompt_ids
        self.val_records = self.inputs.val_records
        self.placement = Placement(cfg, self.run_dir)
        self.placement.adopt("rollout", engines)
        self.version = 0
        """The weights version the engines serve (the trainer's, told at ``end_sync``)."""
        self._engines: EngineReplicas | None = None
        """The engines (built by ``start``)."""
        multi_turn = cfg.rollout.multi_turn
        self.tracer = Tracer(ROLLOUTER_PID, "rollouter", sort_index=ROLLOUTER_PID)
        """This actor's trace events; the trainer pulls them (``drain_trace``)."""
        self.queue = queue
        train_records = self.inputs.train_records
        self.cursor = PromptCursor(train_records, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
        self.admission: AdmissionController[PromptGroup] = AdmissionController(
            budget=plan.budget, window_demand=plan.window_demand, max_fresh=plan.total_prompts
        )
        self.replicas: ReplicaSupervisor
        """The engines' supervisor (built by ``start``, with the engines)."""
        self.validation: VersionValidation
        """Validation per weights version (built by ``start``)."""
        self._episodes_save_state = multi_turn.enable and episodes_save_state(multi_turn)
        """A checkpoint cuts episodes in flight with their state instead of restarting them."""
        self.book = StreamBook(self.cursor, self.admission)
        """Partials, resumes, deferred re-admissions, releases: what a checkpoint carries."""
        self.state = RolloutState.RUNNING
        """RUNNING --hold_for_sync--> PAUSED --end_sync--> RUNNING, any --stop--> STOPPED
        (fully_async_policy/rollouter/states.py)."""
        self.deadlines = RolloutDeadlines(cfg)
        """What each wait here may take (deadlines.py)."""
        self._hold = (0.0, 0)
        """When the sync's hold began (``time.perf_counter()``) and the groups it drained."""
        self._pause: SyncPause | None = None
        """What the sync's pause did (``begin_sync``), answered by ``end_sync``."""
        self.pause_policy = PausePolicy.of(cfg)
        """What a pause does with the groups in flight (pause_policy.py)."""
        self.stream = GroupStream(
            cfg,
            self.inputs,
            self.book,
            queue,
            self.tracer,
            state=lambda: self.state,
            version=lambda: self.version,
        )
        """Admits, generates and releases the groups (stream.py)."""
        for track, tid in ROLLOUTER_TIDS.items():
            self.tracer.name_thread(tid, track)

    async def start(self, engines: EngineReplicas | None = None) -> None:
        """Start the engines (blocking Ray calls: in a thread, never on this actor's loop) and
        the supervisor that owns them; the first call after the constructor. ``engines``:
        replicas already started (tests); None starts ``rollout.replicas`` engines."""
        if engines is None:
            assert self.inputs.model is not None, "RunInputs without a model brings its engines"
            engines = await asyncio.to_thread(self.placement.start_engines, self.inputs.model)
        self._engines = engines
        self.replicas = ReplicaSupervisor(
            engines,
            served_version=lambda: self.version,
            max_restarts=self.cfg.rollout.max_restarts,
            on_fatal=self.stream.fail,
            timeout_s=self.cfg.checkpoint_engine.timeout_s,
        )
        self.stream.serve_on(engines, self.replicas)
        self.validation = VersionValidation(
            self._validate_here,
            self.replicas,
            self.cfg.trainer.test_freq,
            self.deadlines.generation,
        )

    @property
    def engines(self) -> EngineReplicas:
        """The engines ``start`` built (an error before it)."""
        if self._engines is None:
            raise RuntimeError("FullyAsyncRollouter.start() has not run")
        return self._engines

    def engine_workers(self) -> list[ReplicaClient]:
        """The replicas' current workers' clients, for the trainer's weight push (the engines
        stay ours: a dead replica is replaced here; a retired one gets no weights)."""
        retired = self.replicas.retired
        return [w for i, w in enumerate(self.engines.workers) if i not in retired]

    async def load_weights(self, weights: WeightsFile, version: int) -> None:
        """Every replica verifies and loads ``weights`` and serves ``version`` (a resumed
        run, before ``run()``)."""
        await asyncio.to_thread(self.engines.update_weights_from_file, weights, version)
        self.version = version

    # ---- the streaming loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Admit, generate and release until ``stop()``; a failure closes the queue (the
        trainer then sees the end of the stream) and is raised from here (stream.py)."""
        await self.stream.run()

    # ---- syncs: open_sync, resume_engines, end_sync ------------------------------------------

    async def open_sync(self) -> SyncOpening:
        """The sync's first call: ``hold_for_sync``, ``begin_sync``, then every replica
        health-checked and the dead ones restarted, not waited for (replicas.py). Returns the
        push's receivers and whether a replica is restarting or waits for the served weights
        (the trainer then calls ``recover_replicas``, with a restart's deadline)."""
        await self.hold_for_sync()
        await self.begin_sync()
        await self.replicas.check_all()
        if self.replicas.error is not None:
            raise self.replicas.error
        coming_back = (ReplicaState.RESTARTING, ReplicaState.WAITING_WEIGHTS)
        recovering = any(self.replicas.states.where(state) for state in coming_back)
        return SyncOpening(self.engine_workers(), recovering)

    @traced("hold_for_sync (drain)", tid=ROLLOUTER_TIDS["sync"], cat="sync")
    async def hold_for_sync(self) -> None:
        """A sync's long waits, before ``begin_sync`` pauses the engines: stop admitting, let
        the running validation end and, under ``PausePolicy.DRAIN``, the groups in flight
        finish on the old weights; each within ``rollout.generation_timeout_s``, past which
        ``RunFailure`` names the wait."""
        start = time.perf_counter()
        self._enter(RolloutState.PAUSED)
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
            num_partial += len(self.stream.in_flight)  # episodes waiting in the workers
        self._pause = SyncPause(num_partial, num_drained, time.perf_counter() - start)

    async def resume_engines(self) -> None:
        """The push loaded the new weights: the engines generate again, so episodes in
        flight go on; admission stays held until ``end_sync`` (driver/rollout_engines.py)."""
        await self.replicas.resume_all()

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
        self._enter(RolloutState.RUNNING)
        self.validation.start(version)
        self.stream.wake()
        pause, self._pause = self._pause, None
        if pause is None:
            return None
        return dataclasses.replace(pause, window_s=time.perf_counter() - self._hold[0])

    def _enter(self, state: RolloutState) -> None:
        check_step("the rollouter", self.state, state, ROLLOUT_STEPS)
        self.state = state

    def _resume_partial(self, ticket: Ticket, trajs: list[Trajectory]) -> None:
        max_staleness = self.cfg.async_training.max_staleness
        started = [t.min_version for t in trajs if t.model_versions]
        if max_staleness is not None and started and self.version - min(started) > max_staleness:
            # Already too old to be trained: generate it again on the new weights.
            self.book.num_resumes.pop(ticket.ticket, None)
            self.stream.start(self.admission.readmit(ticket.ticket, ticket.uid), resume=None)
            return
        self.book.num_resumes[ticket.ticket] = self.book.num_resumes.get(ticket.ticket, 0) + 1
        self.stream.start(ticket, resume=trajs)

    async def readmit(self, groups: list[tuple[int, str]]) -> None:
        """Admit again the prompts of released groups (ticket, uid) the trainer found too
        old (``async_training.max_staleness``)."""
        for ticket, uid in groups:
            self.stream.admit_again(ticket, uid)

    # ---- validation (validation.py) -------------------------------------------------------

    async def validate(self) -> dict[str, float]:
        """Validation metrics of the version the engines serve now (once per version)."""
        return await self.validation.result(self.version)

    @traced("validate", tid=ROLLOUTER_TIDS["validation"])
    async def _validate_here(self) -> dict[str, float]:
        """The val set generated and scored on this actor's event loop, as training groups
        are: the replica supervisor is touched by this loop only, and a user's async reward
        function runs on the one loop it always runs on (``RewardFunction``)."""
        records, rollout = self.val_records, self.cfg.rollout
        return await score_val_set(
            self.engines, records, self.prompt_ids, self.reward_fn, rollout, version=self.version
        )

    # ---- checkpoints ------------------------------------------------------------------------

    async def snapshot(self) -> dict[str, Any]:
        """This side's checkpoint state (snapshot.py), taken while PAUSED
        for a sync, after the push and before ``end_sync``. Single responses: nothing
        generates (admission is held, partials wait for ``end_sync``), so it is complete.
        Episodes (``rollout.multi_turn``) go on in the workers through a sync (their
        environment steps are never cut; the push resumed the engines). When their
        environment saves its state, the engines are paused again and each episode is cut
        where it next waits for them (after the environment step it may be in: at most
        ``step_timeout_s``); its group comes back as a partial carrying that state, resumed
        at ``end_sync`` like any partial. Else their groups are recorded as ``restart``: a
        resume admits those prompts again, generated from scratch, while this run goes on
        with them.

        Consistency: no put into the queue starts while the queue is read, and everything
        else is read in one go after it, so a group that finishes meanwhile is either in
        ``restart`` (still generating then) or among the releases, never both or neither."""
        if self._episodes_save_state:
            # The push resumed the engines (admission stays held until end_sync): pause them
            # again so that every episode comes to wait for them, then cut it there.
            await self.replicas.pause_all()
            await self.replicas.cut_episodes_all()
            what = f"snapshot: {len(self.stream.in_flight)} prompt groups of episodes being cut"
            await bounded(self.stream.quiet(), self.deadlines.cut_back, what)
        if self.state is not RolloutState.PAUSED:
            raise RuntimeError(f"snapshot() while {self.state.name}: take it inside a sync")
        in_flight = self.stream.in_flight
        if in_flight and not self.pause_policy.keeps_episodes:
            raise RuntimeError(f"snapshot() with {len(in_flight)} groups generating")
        async with self.stream.puts_held():
            seen = list(self.book.releases)  # the head may be put (and popped) meanwhile
            read: Any = self.queue.snapshot.remote()
            queued = await bounded(read, self.deadlines.answer, "snapshot: reading the queue")
            live = {t.ticket: t for t in self.admission.unreleased()}
            restart = [live[k] for k in sorted(in_flight)]
            return self.book.state_dict(queued, seen, restart) | {"rng": capture_rng()}

    def restore(self, checkpoint: str) -> None:
        """Load ``snapshot()``'s state from ``checkpoint`` before ``run()``; the trainer then
        calls ``end_sync(version, trained)`` as after the push the checkpoint followed."""
        path = Path(checkpoint) / RUN_STATE_DIR / ROLLOUTER_STATE_FILE
        state = json.loads(path.read_text(encoding="utf-8"))
        restart = self.book.load_state_dict(state)
        restore_rng(state["rng"])
        if restart:
            logger.info(
                "%d prompt groups were generating episodes at the checkpoint; episodes are "
                "not resumed mid-way, so these prompts start again from scratch (counted in "
                "prompts/readmitted)",
                len(restart),
            )
        logger.info(
            "rollouter restored: %d admitted, %d partial groups, %d finished groups to train",
            self.admission.num_admitted,
            len(self.book.partials),
            len(self.book.releases),
        )

    # ---- progress and the end ---------------------------------------------------------------

    async def drain_trace(self) -> list[dict[str, Any]]:
        """This actor's and its engines' trace events since the last call (the trainer
        writes them into trace.json)."""
        retired = sorted(self.replicas.retired)
        engines = await asyncio.to_thread(self.engines.drain_trace, skip=retired)
        return self.tracer.drain() + engines

    def busy_replicas(self) -> list[int]:
        """The replicas with a group generating now, for a deadline's message."""
        return sorted(set(self.stream.replica_of.values()))

    def poll(self) -> RolloutProgress:
        """Cumulative counters, and validation results not reported before."""
        clock = self.stream.clock
        return RolloutProgress(
            elapsed_s=time.perf_counter() - clock.start,
            idle_s=clock.idle_s(),
            num_admitted=self.admission.num_admitted,
            num_readmitted=self.admission.num_readmitted,
            num_in_flight=len(self.stream.in_flight),
            val_results=self.validation.take_unreported(),
            num_restarts=self.replicas.num_restarts,
            num_retired=len(self.replicas.retired),
            num_filtered=self.admission.num_filtered,
        )

    async def stop(self) -> RolloutLedger:
        """Stop admitting and cut what is generating; the engines stay up for validation.
        The stream ends once the engines are paused, so its bounded wait for the groups in
        flight (stream.py) waits only for them to come back cut."""
        self._enter(RolloutState.STOPPED)
        self.replicas.hold(True)
        await self.validation.finish("stop")
        await self.replicas.pause_all()
        if self.cfg.rollout.multi_turn.enable:  # episodes wait in paused workers: end them
            await self.replicas.cut_episodes_all()
        self.stream.end()
        await self.stream.finished()
        await self.replicas.resume_all()
        unreleased = [t.uid for t in self.admission.unreleased()]
        return RolloutLedger(
            admitted_uids=list(self.admission.admitted_uids),
            num_readmitted=self.admission.num_readmitted,
            unreleased_uids=unreleased + [g.prompt_uid for g in self.book.releases],
            num_released=self.admission.num_released - len(self.book.releases),
            num_restarts=self.replicas.num_restarts,
            num_retired=len(self.replicas.retired),
            filtered_uids=list(self.admission.filtered_uids),
        )

    # ---- dead replicas (replicas.py) ------------------------------------------------------

    async def recover_replicas(self) -> list[int]:
        """Restart the replicas found dead and wait for every restart; returns the replicas
        waiting for the served weights (the trainer sends them: ``install_weights``)."""
        return await self.replicas.recover()

    async def install_weights(
        self, replica: int, weights: WeightsFile | None, version: int
    ) -> None:
        """Restarted ``replica`` loads the served weights (``version``; ``weights`` None:
        version 0, which it holds) and serves again."""
        await self.replicas.install_weights(replica, weights, version)

    async def wait_replica_request(self) -> None:
        """Returns once a restarted replica waits for the served weights."""
        await self.replicas.weights_wanted.wait()

    def close(self) -> None:
        """No more restarts, then the engines shut down and the placement is released; safe
        to call twice."""
        if hasattr(self, "replicas"):  # start() built them
            self.replicas.close()
        if self._engines is not None:
            try:
                self._engines.shutdown()
            except Exception:  # closing must go on: the placement is released all the same
                logger.exception("shutting down the rollout engines failed")
            self._engines = None
        self.placement.release()

    async def shutdown(self) -> None:
        """``close`` in a thread (its Ray calls block), off this actor's loop."""
        await asyncio.to_thread(self.close)
