"""``EngineReplicas``: the rollout engines as the fully async rollouter, its stream and its
``ReplicaSupervisor`` drive them. ``recipe.workers.rollout.replicas.RolloutReplicas`` is the
real one (Ray actors, one per replica); unit tests fill it with in-process fakes
(tests/helpers/fake_engines.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from recipe.faults import RolloutWorkerError
from recipe.protocol import Trajectory
from recipe.utils.weights_file import WeightsFile
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.client import ReplicaClient
from recipe.workers.rollout.requests import GroupRequest


class EngineReplicas(Protocol):
    """The engines as the rollouter and its supervisor drive them: ``RolloutReplicas``'s
    surface (recipe/workers/rollout/replicas.py), which unit tests fill with in-process fakes."""

    cfg: RolloutConfig
    workers: list[ReplicaClient]
    """One client per replica (recipe/workers/rollout/client.py)."""

    def submit(
        self, group: GroupRequest, *, replica: int | None = None, track: bool = True
    ) -> Awaitable[list[Trajectory]]:
        """Start one group; its awaitable result."""
        ...

    def place_with(self, serving: Callable[[int], bool] | None) -> None:
        """Groups submitted without a replica go only to replicas ``serving(index)``."""
        ...

    def next_replica(self) -> int:
        """The replica that takes the next group (round robin over those serving)."""
        ...

    def restart(self, index: int) -> ReplicaClient:
        """A new worker for replica ``index``; its handle (the engine still starting)."""
        ...

    def wait_started(self) -> None:
        """Blocks until every replica's engine started; raises a failed start's error, or
        ``RunFailure`` past ``rollout.start_timeout_s``."""
        ...

    def wait_for_bundle(self, index: int) -> str:
        """Blocks until replica ``index``'s resources are placed; ``PlacementError`` if never."""
        ...

    async def worker_error(self, exc: BaseException) -> RolloutWorkerError | None:
        """``exc``, raised by a call on a replica, as that replica's death (None: another
        error)."""
        ...

    def drain_trace(
        self, timeout_s: float = 30.0, skip: Sequence[int] = ()
    ) -> list[dict[str, Any]]: ...

    def update_weights_from_file(self, weights: WeightsFile, version: int) -> None: ...

    def shutdown(self) -> None: ...
