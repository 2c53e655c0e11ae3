"""``ReplicaClient``: the typed calls on one rollout replica's worker (``RolloutWorker``,
base.py), for every holder of a replica: ``RolloutReplicas`` (replicas.py), the fully async
rollouter's supervisor and stream, and a weight push (``ReceiverClient``,
recipe/checkpoint_engine/clients.py, is the push's view of it).

A Ray handle dispatches any attribute name and its results are untyped; the client names each
call with its arguments and the type its ObjectRef resolves to, so a renamed method or a wrong
argument is a type error (``make lint``) rather than a failure in another process at run time.
Every method starts the call and returns its ObjectRef: the driver waits with ``ray.get``, an
event loop awaits it, each with its own deadline. Equal clients call the same actor. Unit tests
bring in-process replicas with the same methods (tests/helpers/fake_engines.py).

    generate(request)               one prompt group (requests.py), its trajectories
    pause / resume / cut_episodes   serving state (base.py)
    check_health / engine_failure   is its engine alive; what its log says of a death
    process_ids                     its worker's and engine's processes
    get_version / update_weights_from_file / commit_weights / load_adapter
                                    the weights it serves
    receiver_info / connect_receivers / receive / close_receivers
                                    its engine workers' ``WeightReceiver`` (a push)
    drain_trace / shutdown          its trace slices; release the engine
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recipe.protocol import Trajectory
from recipe.utils.adapter_file import AdapterFile
from recipe.workers.rollout.requests import GenerationRequest

if TYPE_CHECKING:
    from ray import ObjectRef

Wire = dict[str, Any]
"""What crosses to a ``WeightReceiver`` and back (``collective_rpc`` carries plain dicts)."""


@dataclass(frozen=True, slots=True)
class ReplicaClient:
    """The calls on rollout worker actor ``handle`` (module docstring)."""

    handle: Any

    @classmethod
    def start(cls, worker_cls: type, options: dict[str, Any], *args: Any) -> ReplicaClient:
        """A new actor of ``worker_cls(*args)`` with Ray ``options`` (resources, scheduling);
        its engine is still starting (a call on it waits for that)."""
        import ray

        return cls(ray.remote(worker_cls).options(**options).remote(*args))

    @property
    def actor_id(self) -> str:
        """The actor's id, as Ray's errors name it."""
        return self.handle._actor_id.hex()

    def kill(self) -> None:
        """End the actor at once (its engine processes go with it)."""
        import ray

        ray.kill(self.handle, no_restart=True)

    # ---- generation and serving state -----------------------------------------------------
    def generate(self, request: GenerationRequest) -> ObjectRef[list[Trajectory]]:
        return self.handle.generate.remote(request)

    def pause(self) -> ObjectRef[None]:
        return self.handle.pause.remote()

    def resume(self) -> ObjectRef[None]:
        return self.handle.resume.remote()

    def cut_episodes(self) -> ObjectRef[None]:
        return self.handle.cut_episodes.remote()

    def is_paused(self) -> ObjectRef[bool]:
        return self.handle.is_paused.remote()

    # ---- health -------------------------------------------------------------------------
    def check_health(self) -> ObjectRef[None]:
        return self.handle.check_health.remote()

    def process_ids(self) -> ObjectRef[dict[str, Any]]:
        """The pids of its worker and engine processes (base.py)."""
        return self.handle.process_ids.remote()

    def engine_failure(self) -> ObjectRef[dict[str, Any]]:
        return self.handle.engine_failure.remote()

    # ---- weights --------------------------------------------------------------------------
    def get_version(self) -> ObjectRef[int]:
        return self.handle.get_version.remote()

    def update_weights_from_file(
        self, path: str, version: int, sha256: str | None = None
    ) -> ObjectRef[None]:
        return self.handle.update_weights_from_file.remote(path, version, sha256=sha256)

    def commit_weights(self, version: int, transfer_id: int) -> ObjectRef[Wire]:
        return self.handle.commit_weights.remote(version, transfer_id)

    def stage_adapter(self, adapter: AdapterFile, version: int) -> ObjectRef[dict[str, float]]:
        """LoRA: check the adapter folder, add it as ``version`` beside the served one and
        read it back, while still serving (its ``sync/*``)."""
        return self.handle.stage_adapter.remote(adapter, version)

    def load_adapter(self, adapter: AdapterFile, version: int) -> ObjectRef[dict[str, float]]:
        """LoRA: stage the adapter folder as ``version`` unless staged, then probe it on the
        paused engine and serve it (its ``sync/*``)."""
        return self.handle.load_adapter.remote(adapter, version)

    # ---- its engine workers' WeightReceiver (one result per engine worker) ------------------
    def receiver_info(self) -> ObjectRef[list[Wire]]:
        return self.handle.weight_receiver_call.remote("info")

    def connect_receivers(
        self, plan: Wire, ranks: list[list[int]], info: Wire
    ) -> ObjectRef[list[int]]:
        """``ranks``: [local rank, global receiver rank] of each of its engine workers."""
        return self.handle.weight_receiver_call.remote("connect", plan, ranks, info)

    def receive(self, transfer_id: int) -> ObjectRef[list[Wire]]:
        return self.handle.weight_receiver_call.remote("receive", transfer_id)

    def close_receivers(self) -> ObjectRef[list[None]]:
        return self.handle.weight_receiver_call.remote("close")

    # ---- the rest -------------------------------------------------------------------------
    def drain_trace(self, replica: int) -> ObjectRef[list[dict[str, Any]]]:
        """Its trace slices since the last call, on replica ``replica``'s process track."""
        return self.handle.drain_trace.remote(replica)

    def shutdown(self) -> ObjectRef[None]:
        return self.handle.shutdown.remote()
