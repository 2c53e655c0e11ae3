"""Typed clients of the fully async recipe's two actors, used by the trainer in the driver.

A Ray handle dispatches any attribute name and its results are untyped; a client names each
call the trainer makes, with its arguments and the type its ObjectRef resolves to, so a
renamed method or a wrong argument is a type error (``make lint``) rather than a failure in
another process at run time. Every method starts the call and returns its ObjectRef: the
caller waits with its own deadline through the client's ``waits``.

    RolloutClient  FullyAsyncRollouter (rollouter/actor.py): the streaming loop, syncs
                   (open_sync, resume_engines, end_sync), restarts, snapshots, progress
    QueueClient    MessageQueue (message_queue.py) of PromptGroups: the trainer's end
    Waits          how the caller waits on what a call returns: ``RayWaits`` (``ray.get``,
                   ``ray.wait``) for actors; a unit test brings in-process actors and their
                   own waits (tests/helpers/local_actors.py)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fully_async_policy.message_queue import QueueStats
from fully_async_policy.messages import (
    EndOfStream,
    PromptGroup,
    RolloutLedger,
    RolloutProgress,
    SyncOpening,
    SyncPause,
)
from recipe.utils.weights_file import WeightsFile
from recipe.workers.rollout.client import ReplicaClient

if TYPE_CHECKING:
    from ray import ObjectRef

    from recipe.workers.rollout.replicas import RolloutReplicas

T = TypeVar("T")


class Waits(Protocol):
    """Waiting on the results of calls on actors. A wait past ``timeout`` raises
    ``TimeoutError`` (Ray's ``GetTimeoutError`` is one)."""

    def get(self, ref: ObjectRef[T], *, timeout: float | None = None) -> T:
        """The result of one call (its error raised here)."""
        ...

    def first_ready(self, refs: Sequence[Any], *, timeout: float | None) -> list[Any]:
        """Those of ``refs`` done within ``timeout`` (none when it passed), at least one."""
        ...


class RayWaits:
    """``Waits`` on Ray ObjectRefs."""

    def get(self, ref: ObjectRef[T], *, timeout: float | None = None) -> T:
        import ray

        return ray.get(ref, timeout=timeout)

    def first_ready(self, refs: Sequence[Any], *, timeout: float | None) -> list[Any]:
        import ray

        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
        return ready


class RolloutClient:
    """The trainer's calls on the ``FullyAsyncRollouter`` actor ``handle``."""

    def __init__(self, handle: Any, waits: Waits | None = None) -> None:
        self.handle = handle
        self.waits: Waits = waits or RayWaits()

    # ---- the loop -----------------------------------------------------------------------
    def start(self, engines: RolloutReplicas | None = None) -> ObjectRef[None]:
        return self.handle.start.remote(engines)

    def run(self) -> ObjectRef[None]:
        return self.handle.run.remote()

    def stop(self) -> ObjectRef[RolloutLedger]:
        return self.handle.stop.remote()

    def shutdown(self) -> ObjectRef[None]:
        return self.handle.shutdown.remote()

    def readmit(self, groups: list[tuple[int, str]]) -> ObjectRef[None]:
        return self.handle.readmit.remote(groups)

    # ---- syncs and checkpoints ----------------------------------------------------------
    def engine_workers(self) -> ObjectRef[list[ReplicaClient]]:
        return self.handle.engine_workers.remote()

    def open_sync(self) -> ObjectRef[SyncOpening]:
        return self.handle.open_sync.remote()

    def resume_engines(self) -> ObjectRef[None]:
        return self.handle.resume_engines.remote()

    def end_sync(self, version: int, num_trained: int) -> ObjectRef[SyncPause | None]:
        return self.handle.end_sync.remote(version, num_trained)

    def snapshot(self) -> ObjectRef[dict[str, Any]]:
        return self.handle.snapshot.remote()

    def restore(self, checkpoint: str) -> ObjectRef[None]:
        return self.handle.restore.remote(checkpoint)

    def load_weights(self, weights: WeightsFile, version: int) -> ObjectRef[None]:
        return self.handle.load_weights.remote(weights, version)

    # ---- dead replicas ------------------------------------------------------------------
    def wait_replica_request(self) -> ObjectRef[None]:
        return self.handle.wait_replica_request.remote()

    def recover_replicas(self) -> ObjectRef[list[int]]:
        return self.handle.recover_replicas.remote()

    def install_weights(
        self, replica: int, weights: WeightsFile | None, version: int
    ) -> ObjectRef[None]:
        return self.handle.install_weights.remote(replica, weights, version)

    # ---- progress -----------------------------------------------------------------------
    def poll(self) -> ObjectRef[RolloutProgress]:
        return self.handle.poll.remote()

    def validate(self) -> ObjectRef[dict[str, float]]:
        return self.handle.validate.remote()

    def busy_replicas(self) -> ObjectRef[list[int]]:
        return self.handle.busy_replicas.remote()

    def drain_trace(self) -> ObjectRef[list[dict[str, Any]]]:
        return self.handle.drain_trace.remote()


class QueueClient:
    """The trainer's calls on the ``MessageQueue`` actor ``handle``."""

    def __init__(self, handle: Any, waits: Waits | None = None) -> None:
        self.handle = handle
        self.waits: Waits = waits or RayWaits()

    def get_batch(self, num_groups: int) -> ObjectRef[list[PromptGroup] | EndOfStream]:
        return self.handle.get_batch.remote(num_groups)

    def drain(self) -> ObjectRef[list[PromptGroup]]:
        return self.handle.drain.remote()

    def close(self) -> ObjectRef[None]:
        return self.handle.close.remote()

    def stats(self) -> ObjectRef[QueueStats]:
        return self.handle.stats.remote()
