"""``FullyAsyncRollouter``: streams prompt groups through the engines into the message queue.

Runs as an async Ray actor beside the trainer; it owns the rollout engines (``RolloutReplicas``)
and the prompt cursor. One event loop drives everything, so no state needs a lock. This class
is the actor's surface, the trainer's calls (``RolloutClient``, driver/clients.py), over the
pieces it composes:

    stream.py       GroupStream: the streaming loop (admit, generate, score, release)
    sync.py         RolloutSync: the state machine, the served version and the sync's steps
                    (open_sync, resume_engines, end_sync: the diagram is there)
    checkpoint.py   take_snapshot / restore: the checkpoint, inside a sync's pause
    replicas.py     ReplicaSupervisor: the engines' pauses, deaths, restarts and re-entry
    validation.py   VersionValidation: the val set, once per version, next to training

Validation runs here, on the engines, at the start of a window and next to the window's
training generation, so the trainer never waits for it; the next ``hold_for_sync`` waits for
it to end so that every val answer comes from one version.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.admission import AdmissionController
from fully_async_policy.messages import (
    PromptGroup,
    RolloutLedger,
    RolloutProgress,
    SyncOpening,
    SyncPause,
)
from fully_async_policy.rollouter.checkpoint import load_snapshot, take_snapshot
from fully_async_policy.rollouter.clients import QueueProducer
from fully_async_policy.rollouter.engine_replicas import EngineReplicas
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from fully_async_policy.rollouter.reports import rollout_ledger, rollout_progress
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.states import ReplicaState, RolloutState
from fully_async_policy.rollouter.stream import GroupStream
from fully_async_policy.rollouter.sync import RolloutSync
from fully_async_policy.rollouter.validation import VersionValidation, score_val_set
from fully_async_policy.run_plan import RunPlan
from recipe.agent.loading import episodes_save_state
from recipe.config import RecipeConfig
from recipe.data.cursor import PromptCursor
from recipe.observability.trace import ROLLOUTER_PID, ROLLOUTER_TIDS, Tracer, traced
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
        engines' placement group, reserved by the driver with the trainer's, for a ``start``
        that starts the engines itself (None: ``start`` is handed them); ``inputs``: the
        data, prompt ids and reward function the driver loaded and checked (never loaded
        again here)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.inputs = inputs
        self.reward_fn, self.prompt_ids = self.inputs.reward_fn, self.inputs.prompt_ids
        self.val_records = self.inputs.val_records
        self.placement = Placement(cfg, self.run_dir)
        self.placement.adopt("rollout", engines)
        self._engines: EngineReplicas | None = None
        """The engines (built by ``start``)."""
        multi_turn = cfg.rollout.multi_turn
        self.tracer = Tracer(ROLLOUTER_PID, "rollouter", sort_index=ROLLOUTER_PID)
        """This actor's trace events; the trainer pulls them (``drain_trace``)."""
        self.queue = QueueProducer(queue)
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
        self.stream = GroupStream(
            cfg,
            self.inputs,
            self.book,
            self.queue,
            self.tracer,
            state=lambda: self.state,
            version=lambda: self.version,
        )
        """Admits, generates and releases the groups (stream.py)."""
        self.sync = RolloutSync(cfg, self.stream, self.book, self.admission, self.tracer)
        """The state machine, the served version and the steps of a sync (sync.py)."""
        for track, tid in ROLLOUTER_TIDS.items():
            self.tracer.name_thread(tid, track)

    async def start(self, engines: EngineReplicas | None = None) -> None:
        """Wait for the engines to start (blocking Ray calls: in a thread, never on this
        actor's loop), then build the supervisor that owns them; the first call after the
        constructor. ``engines``: replicas launched by the caller and still starting (the
        driver launches them beside this actor's own start; ``Placement.launch_engines``), from
        here on this actor's to shut down; None starts ``rollout.replicas`` engines in the
        placement group the constructor was given."""
        if engines is None:
            assert self.inputs.model is not None, "RunInputs without a model brings its engines"
            engines = await asyncio.to_thread(self.placement.launch_engines, self.inputs.model)
        self._engines = engines  # shut down by close() even if they fail to start
        await asyncio.to_thread(engines.wait_started)
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
            self.sync.deadlines.generation,
        )
        self.sync.serve_on(self.replicas, self.validation)

    @property
    def state(self) -> RolloutState:
        """RUNNING, PAUSED (inside a sync) or STOPPED (``RolloutSync``, sync.py)."""
        return self.sync.state

    @property
    def version(self) -> int:
        """The weights version the engines serve (the trainer's, told at ``end_sync``)."""
        return self.sync.version

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
        self.sync.version = version

    # ---- the streaming loop ---------------------------------------------------------------

    async def run(self) -> None:
        """Admit, generate and release until ``stop()``; a failure closes the queue (the
        trainer then sees the end of the stream) and is raised from here (stream.py)."""
        await self.stream.run()

    # ---- syncs: open_sync, resume_engines, end_sync ------------------------------------------

    async def open_sync(self) -> SyncOpening:
        """The sync's first call: ``hold_for_sync``, ``begin_sync`` (sync.py), then every
        replica health-checked and the dead ones restarted, not waited for (replicas.py).
        Returns the push's receivers and whether a replica is restarting or waits for the
        served weights (the trainer then calls ``recover_replicas``, with a restart's
        deadline)."""
        await self.sync.hold_for_sync()
        await self.sync.begin_sync()
        await self.replicas.check_all()
        if self.replicas.error is not None:
            raise self.replicas.error
        coming_back = (ReplicaState.RESTARTING, ReplicaState.WAITING_WEIGHTS)
        recovering = any(self.replicas.states.where(state) for state in coming_back)
        return SyncOpening(self.engine_workers(), recovering)

    async def resume_engines(self) -> None:
        """The push loaded the new weights: the engines generate again, so episodes in
        flight go on; admission stays held until ``end_sync`` (driver/rollout_engines.py)."""
        await self.replicas.resume_all()

    async def end_sync(self, version: int, num_trained: int) -> SyncPause | None:
        """The engines serve ``version`` now: open its window, resume the cut groups and
        generate again (sync.py). Returns what the sync's pause did (None: a resumed run's
        replay, which followed no pause here)."""
        return await self.sync.end_sync(version, num_trained)

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
        """This side's checkpoint state, taken while PAUSED for a sync, after the push and
        before ``end_sync`` (checkpoint.py)."""
        return await take_snapshot(self.sync, self.queue, cut_episodes=self._episodes_save_state)

    def restore(self, checkpoint: str) -> None:
        """Load ``snapshot()``'s state from ``checkpoint`` before ``run()``; the trainer then
        calls ``end_sync(version, trained)`` as after the push the checkpoint followed."""
        load_snapshot(self.book, checkpoint)

    # ---- progress and the end ---------------------------------------------------------------

    async def drain_trace(self) -> list[dict[str, Any]]:
        """This actor's and its engines' trace events since the last call (the trainer
        writes them into trace.json)."""
        retired = sorted(self.replicas.retired)
        engines = await asyncio.to_thread(self.engines.drain_trace, skip=retired)
        return self.tracer.drain() + engines

    def busy_replicas(self) -> list[int]:
        """The replicas with a group generating now, for a deadline's message."""
        return self.sync.busy_replicas()

    def poll(self) -> RolloutProgress:
        """Cumulative counters, and validation results not reported before."""
        return rollout_progress(self.admission, self.stream, self.validation, self.replicas)

    async def stop(self) -> RolloutLedger:
        """Stop admitting and cut what is generating; the engines stay up for validation.
        The stream ends once the engines are paused, so its bounded wait for the groups in
        flight (stream.py) waits only for them to come back cut."""
        self.sync.enter(RolloutState.STOPPED)
        self.replicas.hold(True)
        await self.validation.finish("stop")
        await self.replicas.pause_all()
        # End what waits in the paused workers: episodes, and groups whose generate call
        # arrived after the pause (Ray does not order an async actor's calls); else they
        # would wait for a resume that comes only after them.
        await self.replicas.cut_episodes_all()
        self.stream.end()
        await self.stream.finished()
        await self.replicas.resume_all()
        return rollout_ledger(self.book, self.replicas)

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
