"""``ReplicaSupervisor``: keeps the fully async rollouter's engines serving when one dies.

A rollout replica is dead when its actor died (``RayActorError``: the process was killed or
crashed) or when it is alive but fails ``check_health`` (its vLLM engine core process died:
every call then raises ``EngineDeadError``); the batch recipes judge it by the same classifier
(``recipe.workers.rollout.deaths.replica_death``). A replica that does not answer a health
check in time is busy or hung, not dead: that is a matter for the weight-sync deadline
(``checkpoint_engine.on_failure``), not for a restart. States of one replica (``states``; the
steps between them are checked, states.py)::

    SERVING --dies--> RESTARTING --engine up, served version 0, not paused--> SERVING
                           |--engine up, otherwise--> WAITING_WEIGHTS
                           '--its node is gone, no room elsewhere--> RETIRED
    WAITING_WEIGHTS --install_weights(v) (the trainer's copy of push v; none for v=0)--> SERVING
    rollout.max_restarts used up, or a restart that failed: FAILED (the run fails naming it)

Invariant: only a SERVING replica takes groups (``in_service``: the rollouter's groups,
validation's too, go round robin over the replicas it names, ``RolloutReplicas.place_with``),
and a replica enters SERVING only when it holds the weights every other replica serves, so no
group is ever generated on the wrong weights. A replica that comes up while the rollouter is
paused for a sync waits for the trainer (the push may be changing the version) and joins
paused. The groups a death cuts are the rollouter's to re-admit. A replica restarts on its own
bundle of the engines' placement group (``recipe.workers.cluster``); when the bundle's node
left the cluster and Ray finds no room for it within ``ray.placement_timeout_s``, the replica
is RETIRED: no weights are pushed to it and the run goes on with the others (the last one
retired fails the run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fully_async_policy.rollouter.engine_replicas import EngineReplicas
from fully_async_policy.rollouter.states import ReplicaState, ReplicaStates
from recipe.faults import RolloutWorkerError
from recipe.utils.weights_file import WeightsFile
from recipe.workers.cluster import PlacementError
from recipe.workers.rollout.client import ReplicaClient
from recipe.workers.rollout.deaths import ReplicaDeath, replica_death

logger = logging.getLogger(__name__)


class ReplicaSupervisor:
    """Death detection, bounded restarts and re-entry of the rollouter's replicas."""

    def __init__(
        self,
        group: EngineReplicas,
        *,
        served_version: Callable[[], int],
        max_restarts: int,
        on_fatal: Callable[[BaseException], None],
        timeout_s: float = 120.0,
    ) -> None:
        """``group``: the rollouter's ``RolloutReplicas`` (its groups are placed here from now
        on); ``served_version()``: the weights version the replicas serve (the rollouter's);
        ``on_fatal(error)`` is called when a replica dies with no restart left (or fails to
        come back up); ``timeout_s`` bounds a pause or resume of one replica
        (``checkpoint_engine.timeout_s``)."""
        self.group = group
        self._served_version = served_version
        self.states = ReplicaStates(len(group.workers))
        """Each replica's state (module docstring)."""
        self.max_restarts = max_restarts
        self.timeout_s = timeout_s
        self.num_restarts = 0
        """Replicas restarted so far (``faults/rollout_restarts``)."""
        self.paused = False
        """Mirrors the rollouter: nothing may generate (a sync is changing the weights)."""
        self.holding = False
        """No new group may start (a sync is coming, or the run is stopping)."""
        self.closing = False
        self.error: BaseException | None = None
        self.weights_wanted = asyncio.Event()
        """Set while a restarted replica waits for the served weights."""
        self._on_fatal = on_fatal
        self._restarting: dict[int, asyncio.Task] = {}  # the bring-up of each RESTARTING one
        self._died_of: dict[int, str | None] = {}  # root error of each replica's last death
        self._changed = asyncio.Event()  # any replica joined service, or holding changed
        group.place_with(self._serves)

    @property
    def in_service(self) -> list[bool]:
        """Per replica: it takes new groups (SERVING)."""
        return [self.states[i] is ReplicaState.SERVING for i in range(len(self.states))]

    @property
    def retired(self) -> set[int]:
        """Replicas whose node left the cluster with no room for them elsewhere."""
        return set(self.states.where(ReplicaState.RETIRED))

    # ---- placing groups ---------------------------------------------------------------------

    async def pick(self) -> int | None:
        """A serving replica for the next group, waiting while none serves; None while
        ``holding`` (the caller defers the group)."""
        while True:
            if self.holding or self.error is not None:
                return None
            if any(self.in_service):
                return self.group.next_replica()
            self._changed.clear()
            await self._changed.wait()

    def _serves(self, index: int) -> bool:
        """Replica ``index`` takes new groups (the group's placement asks)."""
        return self.states[index] is ReplicaState.SERVING

    def hold(self, holding: bool) -> None:
        self.holding = holding
        self._changed.set()

    # ---- failures ---------------------------------------------------------------------------

    async def on_failure(self, index: int, worker: ReplicaClient, exc: BaseException) -> bool:
        """A call on ``worker`` (replica ``index``) raised ``exc``. True: the replica died and
        is restarting (or was replaced already), the caller re-admits what it lost; False:
        another error, for the caller to raise."""
        if self.closing:
            return False
        if self._replaced(index, worker) or self.error is not None:  # the run is failing anyway
            return True
        death = await replica_death(worker, exc)
        if death is None:
            return False
        # Nobody restarted it (or failed the run) while its health was being checked.
        if not self._replaced(index, worker) and self.error is None:
            self._restart(index, death)
        return True

    def _replaced(self, index: int, worker: ReplicaClient) -> bool:
        """``worker`` is no longer replica ``index``'s worker, or is being replaced."""
        return self.group.workers[index] is not worker or index in self._restarting

    def _restart(self, index: int, death: ReplicaDeath) -> None:
        if death.repeats(self._died_of.get(index)):
            # Same root error, nothing finished since the last restart: a restart only
            # replays it (a bad engine setting, a model the engine cannot run).
            self._fail_replica(
                RolloutWorkerError(
                    index,
                    f"{death.reason}; its restart died of the same error before finishing a "
                    "response, so it is not restarted again",
                )
            )
            return
        self._died_of[index] = death.error
        if self.num_restarts >= self.max_restarts:
            self._fail_replica(
                RolloutWorkerError(
                    index,
                    f"{death.reason}; rollout.max_restarts={self.max_restarts} restarts are "
                    "used up",
                )
            )
            return
        self.num_restarts += 1
        logger.warning(
            "rollout replica %d died (%s): restarting it (restart %d of rollout.max_restarts=%d)",
            index,
            death.reason,
            self.num_restarts,
            self.max_restarts,
        )
        self.states.move(index, ReplicaState.RESTARTING)
        self._restarting[index] = asyncio.create_task(self._bring_up(index))

    async def _bring_up(self, index: int) -> None:
        try:
            try:
                await asyncio.to_thread(self.group.wait_for_bundle, index)
            except PlacementError as exc:
                self._retire(index, exc)
                return
            worker = self.group.restart(index)
            # The constructor (engine start) has run.
            await self._within(worker.get_version(), "its engine start", self._start_s)
            # The model on disk is version 0. While paused, a push may be changing the
            # version: the trainer, which knows, decides.
            if self._served_version() == 0 and not self.paused:
                await self._serve(index)
            else:
                self.states.move(index, ReplicaState.WAITING_WEIGHTS)
                self.weights_wanted.set()
                logger.info("rollout replica %d is up; it waits for the served weights", index)
        except Exception as exc:
            self._fail_replica(RolloutWorkerError(index, f"its restart failed: {exc}"))
        finally:
            del self._restarting[index]

    @property
    def _start_s(self) -> tuple[str, float]:
        return "rollout.start_timeout_s", self.group.cfg.start_timeout_s

    async def _within(self, ref: Any, what: str, deadline: tuple[str, float]) -> Any:
        """Await ``ref`` within ``deadline`` (its config key, seconds); past it a
        ``TimeoutError`` naming ``what`` and the key (a restart that hangs fails like one
        that crashes)."""
        key, timeout_s = deadline
        try:
            return await asyncio.wait_for(_awaitable(ref), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{what} got no answer within {key}={timeout_s:g} s") from None

    async def _serve(self, index: int) -> None:
        if self.paused:
            pause = self.group.workers[index].pause()
            await self._within(pause, "its pause", ("checkpoint_engine.timeout_s", self.timeout_s))
        self.states.move(index, ReplicaState.SERVING)
        self._changed.set()
        logger.info("rollout replica %d serves version %d again", index, self._served_version())

    def _retire(self, index: int, reason: PlacementError) -> None:
        """Go on without replica ``index`` (its node is gone); the last one fails the run."""
        retired = self.retired
        left = [i for i in range(len(self.states)) if i != index and i not in retired]
        if not left:
            self._fail_replica(RolloutWorkerError(index, f"{reason}; no rollout replica is left"))
            return
        self.states.move(index, ReplicaState.RETIRED)
        logger.warning(
            "%s; the run goes on with %d of %d rollout replicas",
            reason,
            len(left),
            len(self.in_service),
        )

    def up(self) -> list[tuple[int, ReplicaClient]]:
        """(index, worker) of every replica that is neither restarting nor retired."""
        gone = (ReplicaState.RESTARTING, ReplicaState.RETIRED)
        return [(i, w) for i, w in enumerate(self.group.workers) if self.states[i] not in gone]

    def _fail_replica(self, error: RolloutWorkerError) -> None:
        """Replica ``error.replica`` is FAILED and the run fails with ``error``."""
        self.states.move(error.replica, ReplicaState.FAILED)
        self._fail(error)

    def _fail(self, error: BaseException) -> None:
        logger.error("%s", error)
        self.error = self.error or error
        self._changed.set()
        self._on_fatal(error)

    # ---- the trainer's side of a restart ----------------------------------------------------

    async def check_all(self) -> None:
        """Health-check every replica and restart the dead ones (not waiting for them)."""
        if self.closing:
            return
        up = self.up()
        deaths = await asyncio.gather(*(replica_death(w, None) for _, w in up))
        for (index, worker), death in zip(up, deaths, strict=True):
            if death is not None and not self._replaced(index, worker):
                self._restart(index, death)

    async def recover(self) -> list[int]:
        """Restart the dead replicas (``check_all``) and wait for every restart; returns the
        replicas that wait for the served weights (``install_weights``)."""
        await self.check_all()
        while self._restarting:
            await asyncio.gather(*self._restarting.values(), return_exceptions=True)
        if self.error is not None:
            raise self.error
        return self.states.where(ReplicaState.WAITING_WEIGHTS)

    async def install_weights(self, index: int, weights: WeightsFile | None, version: int) -> None:
        """Load the served weights (``version``, a verified safetensors file; None: version
        0, the model on disk it already holds) into restarted replica ``index``, then let it
        serve."""
        if weights is not None:
            worker = self.group.workers[index]
            load = worker.update_weights_from_file(weights.path, version, weights.sha256)
            await self._within(load, "its weights load", self._start_s)
        await self._serve(index)
        if not self.states.where(ReplicaState.WAITING_WEIGHTS):
            self.weights_wanted.clear()

    # ---- pausing around syncs -----------------------------------------------------------------

    async def pause_all(self) -> None:
        """Pause every replica that is up; one found dead is restarted (it generates nothing).
        The only place the rollouter's engines are paused: ``paused`` is their state."""
        self.paused = True
        await self._each("pause", lambda w: w.pause())

    async def resume_all(self) -> None:
        self.paused = False
        await self._each("resume", lambda w: w.resume())

    async def cut_episodes_all(self) -> None:
        """End the multi-turn episodes waiting in paused replicas, as ``aborted`` (the run
        is stopping, or a checkpoint saves them; ``RolloutWorker.cut_episodes``)."""
        await self._each("cut_episodes", lambda w: w.cut_episodes())

    async def _each(self, what: str, call: Callable[[ReplicaClient], Awaitable[None]]) -> None:
        """``call(worker)`` on every replica that is up, each within ``timeout_s``: a hung
        replica fails it naming ``what`` and the replica (a sync never waits silently)."""
        up = self.up()
        results = await asyncio.gather(
            *(asyncio.wait_for(_awaitable(call(w)), self.timeout_s) for _, w in up),
            return_exceptions=True,
        )
        for (index, worker), result in zip(up, results, strict=True):
            if isinstance(result, TimeoutError):
                from recipe.checkpoint_engine.base import WeightSyncError

                detail = f"no answer within checkpoint_engine.timeout_s={self.timeout_s:g} s"
                raise WeightSyncError(what, f"rollout replica {index}", detail)
            if isinstance(result, Exception) and not await self.on_failure(index, worker, result):
                raise result

    def close(self) -> None:
        """No more restarts (the engines are being shut down)."""
        self.closing = True
        for task in self._restarting.values():
            task.cancel()
        self.weights_wanted.set()  # release a waiting trainer


async def _awaitable(ref: Any) -> Any:
    return await ref
