"""``RolloutEngines``: the fully async rollouter's engines as a weight push sees them.

The rollouter's ``ReplicaSupervisor`` is the one owner of its engines' serving state; a push
(``ParameterSynchronizer``, through ``ServingEngines``) reaches it in one conversation of three
calls on the common path::

    trainer (driver)                         rollouter actor
    push: workers()                          (no call: the workers the last opening or heal
                                             named; asked again after a restart or retirement)
          transfer + verify (engines decode)
          pause() --------------------------> open_sync()       admission held, validation
                                                                done, DRAIN: groups in flight
                                                                drained; engines paused (CUT:
                                                                groups come back cut); dead
                                                                replicas start again
                  heal(v) ------------------> recover_replicas, install_weights: only when
                                                                a replica is coming back, it
                                                                serves v, paused
          load, agree-after
          resume() -------------------------> resume_engines()  each replica's one resume;
                                                                episodes in flight go on;
                                                                admission stays held
          repair(e) ------------------------> heal(v)           a dead replica cut the push
    then: snapshot() (a checkpoint is due), end_sync(v + 1, trained) -> SyncPause: the window
          opens; the answer is what the pause did

Every call has the deadline of what it waits for (``within``, deadlines.py): ``open_sync``
the validation's and the drained groups' ``rollout.generation_timeout_s`` and the pause's
``checkpoint_engine.timeout_s``; a restart's own deadline only for ``recover_replicas``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fully_async_policy.deadlines import Within
from fully_async_policy.driver.served_weights import ServedWeights
from recipe.checkpoint_engine.base import WeightSyncError
from recipe.workers.rollout.client import ReplicaClient

if TYPE_CHECKING:
    from fully_async_policy.driver.clients import RolloutClient


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

    def workers(self) -> list[ReplicaClient]:
        return self._served.workers()

    def pause(self) -> None:
        opening = self._within(self._rollouter.open_sync(), "open_sync")
        self._served.seen(opening.workers)
        if opening.recovering:  # a replica died: back on v before the load, pushed too
            self._served.heal(self._version())

    def resume(self) -> None:
        self._within(self._rollouter.resume_engines(), "resume_engines")

    def repair(self, error: WeightSyncError) -> bool:
        return self._served.heal(self._version())
