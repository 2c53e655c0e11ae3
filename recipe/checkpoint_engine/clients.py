"""Typed calls on the two ends of a weight push, for the driver's ``ParameterSynchronizer``.

    SenderClient    a trainer rank (``TrainerWorker``): its ``WeightSender`` (endpoints.py),
                    its weights' metadata and file export
    ReceiverClient  a rollout replica (``RolloutWorker``): the ``WeightReceiver`` of each of its
                    engine workers, the load of a verified push, its version, its pause and
                    resume; a protocol, which the replica's own client implements
                    (``recipe.workers.rollout.client.ReplicaClient``)

The endpoints themselves are driven by method name (``weight_sender_call``,
``weight_receiver_call``): a receiver lives in vLLM's worker processes, which vLLM's
``collective_rpc`` reaches by name only. Those names appear in the two clients (here, and
recipe/workers/rollout/client.py for the receiver) and nowhere else in the driver; every
method returns the call's ObjectRef (the synchronizer waits on a phase's calls
together, with its deadline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from recipe.utils.adapter_file import AdapterFile
from recipe.utils.weights_file import WeightsFile

if TYPE_CHECKING:
    from ray import ObjectRef

Wire = dict[str, Any]
"""Plain dicts are what crosses to an endpoint and back (``collective_rpc`` carries no more)."""


class SenderClient:
    """Trainer rank ``handle``'s end of a push."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def metadata(self) -> ObjectRef[list[tuple[str, tuple[int, ...], str]]]:
        return self.handle.weight_metadata.remote()

    def info(self) -> ObjectRef[Wire]:
        return self.handle.weight_sender_call.remote("info")

    def prepare(self, plan: Wire) -> ObjectRef[Wire]:
        return self.handle.weight_sender_call.remote("prepare", plan)

    def init(self, info: Wire) -> ObjectRef[None]:
        return self.handle.weight_sender_call.remote("init", info)

    def send(self, transfer_id: int, version: int) -> ObjectRef[Wire]:
        return self.handle.weight_sender_call.remote("send", transfer_id, version)

    def commit(self, version: int) -> ObjectRef[None]:
        return self.handle.weight_sender_call.remote("commit", version)

    def get_version(self) -> ObjectRef[int]:
        return self.handle.weight_sender_call.remote("get_version")

    def close(self) -> ObjectRef[None]:
        return self.handle.weight_sender_call.remote("close")

    def export_weights(self, path: str) -> ObjectRef[WeightsFile | None]:
        return self.handle.export_weights.remote(path)

    def export_adapter(self, directory: str) -> ObjectRef[AdapterFile | None]:
        """LoRA: every rank gathers the adapter, rank 0 writes the PEFT folder (its record)."""
        return self.handle.export_adapter.remote(directory)


class ReceiverClient(Protocol):
    """A rollout replica's end of a push, its pause and resume included (one result per
    engine worker where a method says ``list``). The push types against this; the rollout
    replica's client (``recipe.workers.rollout.client.ReplicaClient``) implements it: the
    checkpoint engine sits below the workers and does not import them."""

    def receiver_info(self) -> ObjectRef[list[Wire]]: ...

    def connect_receivers(
        self, plan: Wire, ranks: list[list[int]], info: Wire
    ) -> ObjectRef[list[int]]:
        """``ranks``: [local rank, global receiver rank] of each of its engine workers."""
        ...

    def receive(self, transfer_id: int) -> ObjectRef[list[Wire]]: ...

    def close_receivers(self) -> ObjectRef[list[None]]: ...

    def commit_weights(self, version: int, transfer_id: int) -> ObjectRef[Wire]: ...

    def get_version(self) -> ObjectRef[int]: ...

    def update_weights_from_file(
        self, path: str, version: int, sha256: str | None = None
    ) -> ObjectRef[None]: ...

    def stage_adapter(self, adapter: AdapterFile, version: int) -> ObjectRef[dict[str, float]]:
        """LoRA: check the adapter folder, add it as ``version`` beside the served one and
        read it back, while still serving (its ``sync/*``)."""
        ...

    def load_adapter(self, adapter: AdapterFile, version: int) -> ObjectRef[dict[str, float]]:
        """LoRA: stage the adapter folder as ``version`` unless staged, then probe it on the
        paused engine and serve it (its ``sync/*``)."""
        ...

    def pause(self) -> ObjectRef[None]: ...

    def resume(self) -> ObjectRef[None]: ...
