"""``ServingEngines``: the rollout side of a weight push, as ``ParameterSynchronizer`` sees it.

The synchronizer moves weights and never pauses or resumes an engine itself: whoever serves
generation owns that state, and a push asks it through this interface::

    workers()   the replicas' current workers' clients, asked at every push (a replica restarted
                on a new worker is then reached over a rebuilt transport)
    pause()     returns once no engine request runs: the engines may change weights
    resume()    generation goes on, on the weights just loaded
    repair(e)   a push cut by ``e``: True when the replica behind it was replaced (push again,
                uncounted), False to leave it to ``checkpoint_engine.on_failure``
    stage_while_serving
                True: the push is staged and verified while the engines still generate and
                ``pause`` comes just before the load; False: ``pause`` comes first

Two owners implement it:
- ``DirectEngines`` (below): the batch recipes' own ``RolloutReplicas``, idle between batches,
  paused for the push by the calls on its workers.
- ``RolloutEngines`` (fully_async_policy/driver/rollout_engines.py): the fully async
  rollouter, whose ``ReplicaSupervisor`` is the only place its engines are paused or resumed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from recipe.checkpoint_engine.base import WeightSyncError
from recipe.checkpoint_engine.clients import ReceiverClient
from recipe.checkpoint_engine.phases import replica_peer, wait_phase


class ServingEngines(Protocol):
    """What a push needs of the rollout side (module docstring)."""

    stage_while_serving: bool

    def workers(self) -> Sequence[ReceiverClient]: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def repair(self, error: WeightSyncError) -> bool: ...


class DirectEngines:
    """``ServingEngines`` of workers called directly: each pause and resume waits on every
    worker within ``timeout_s`` (``checkpoint_engine.timeout_s``) and names the replica that
    does not answer. No replica is ever replaced, so ``repair`` declines."""

    stage_while_serving = False

    def __init__(self, workers: Callable[[], Sequence[ReceiverClient]], timeout_s: float) -> None:
        self._workers, self.timeout_s = workers, timeout_s

    def workers(self) -> list[ReceiverClient]:
        return list(self._workers())

    def pause(self) -> None:
        refs = [w.pause() for w in self.workers()]
        wait_phase("pause", {replica_peer(i): ref for i, ref in enumerate(refs)}, self.timeout_s)

    def resume(self) -> None:
        refs = [w.resume() for w in self.workers()]
        wait_phase("resume", {replica_peer(i): ref for i, ref in enumerate(refs)}, self.timeout_s)

    def repair(self, error: WeightSyncError) -> bool:
        return False
