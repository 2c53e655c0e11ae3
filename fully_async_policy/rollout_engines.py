"""``RolloutEngines``: the fully async rollouter's engines as a weight push sees them.

The rollouter's ``ReplicaSupervisor`` is the one owner of its engines' serving state; a push
(``ParameterSynchronizer``, through ``ServingEngines``) reaches it only by these calls::

    trainer (driver)                         rollouter actor
    push: workers() ------------------------> engine_workers()  handles of the replicas not
                                                                retired
          transfer + verify (engines decode)
          pause() --------------------------> hold_for_sync()   admission held, validation
                                                                done, (no partial rollout)
                                                                groups in flight drained
                  --------------------------> begin_sync()      engines paused (in-flight
                                                                groups come back cut)
                  heal(v) ------------------> recover_replicas, install_weights: a replica
                                                                that died is back, paused, on v
          load, agree-after
          resume() -------------------------> resume_engines()  episodes in flight go on;
                                                                admission stays held
          repair(e) ------------------------> heal(v)           a dead replica cut the push
    then: snapshot() (a checkpoint is due), end_sync(v + 1, trained): the window opens

Every call has the deadline of what it waits for (``within``, deadlines.py): the sync
phases proper ``checkpoint_engine.timeout_s`` per wait, ``hold_for_sync`` the validation's
and the drained groups' ``rollout.generation_timeout_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fully_async_policy.deadlines import Within
from fully_async_policy.messages import SyncPause
from fully_async_policy.served_weights import ServedWeights
from recipe.checkpoint_engine.base import WeightSyncError
from recipe.workers.rollout.client import ReplicaClient

if TYPE_CHECKING:
    from fully_async_policy.clients import RolloutClient


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """When generation stopped for a push (``time.perf_counter()``) and what the rollouter
    reported of it."""

    start: float
    pause: SyncPause


class RolloutEngines:
    """``ServingEngines`` (recipe/checkpoint_engine/engines.py) of the rollouter's engines."""

    stage_while_serving = True

    def __init__(
        self,
        rollouter: RolloutClient,
        served: ServedWeights,
        version: Callable[[], int],
        within: Within,
    ) -> None:
        """``version()``: the version the engines serve now (the trainer's, before the push
        lands)."""
        self._rollouter, self._served, self._version = rollouter, served, version
        self._within = within
        self._last: PauseRecord | None = None

    def workers(self) -> list[ReplicaClient]:
        return self._within(self._rollouter.engine_workers(), "engine_workers")

    def pause(self) -> None:
        start = time.perf_counter()
        self._within(self._rollouter.hold_for_sync(), "hold_for_sync")
        pause = self._within(self._rollouter.begin_sync(), "begin_sync")
        self._last = PauseRecord(start, pause)
        self._served.heal(self._version())  # replicas that died since the last sync: pushed too

    def resume(self) -> None:
        self._within(self._rollouter.resume_engines(), "resume_engines")

    def repair(self, error: WeightSyncError) -> bool:
        return self._served.heal(self._version())

    def take_pause(self) -> PauseRecord:
        """The pause of the push that just landed (once per push)."""
        record, self._last = self._last, None
        if record is None:
            raise RuntimeError("no push paused the rollouter")
        return record
