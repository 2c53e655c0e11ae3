"""The two process-side endpoints the ``ParameterSynchronizer`` drives.

``WeightSender`` lives in every ``TrainerWorker`` rank (``weight_sender_call``); all ranks walk
the parameters together (the FSDP gather is collective) and rank 0 owns the engine and sends.
``WeightReceiver`` lives where an engine's weights live: inside vLLM's worker process (the
worker extension's ``weight_receiver_call``, reached through ``collective_rpc``) or in the HF
rollout actor. Both are driven by method name with plain arguments (ints, strings, lists,
dicts), the only things ``collective_rpc`` carries intact, and return plain dicts.

Receiver state machine (invariant: ``load`` reads only a staging buffer that verified)::

    IDLE --connect--> READY --receive(id) ok--> VERIFIED(id) --load(id)--> READY
                        ^          | fails                        | fails: engine keeps old
                        +----------+ (staging discarded)           |   weights unless the
                                                                   |   engine's own load broke
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from recipe.checkpoint_engine.base import (
    CheckpointEngine,
    TransferPlan,
    TransferReport,
    WeightSyncError,
    error_to_wire,
)
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.host import EndpointSite

logger = logging.getLogger(__name__)

NamedTensors = Iterable[tuple[str, torch.Tensor]]


class _Endpoint:
    methods: frozenset[str] = frozenset()

    def call(self, method: str, *args: Any) -> Any:
        """Dispatch a remote call by name (only the endpoint's public protocol methods)."""
        if method not in self.methods:
            raise ValueError(f"{type(self).__name__} has no method {method!r}")
        return getattr(self, method)(*args)


class WeightSender(_Endpoint):
    """A trainer rank's end of the weight push (see the module docstring)."""

    methods = frozenset({"info", "prepare", "init", "send", "commit", "get_version", "close"})

    def __init__(self, rank: int, params: Callable[[], NamedTensors], device: torch.device) -> None:
        self.rank, self.device = rank, device
        self._params = params
        self._engine: CheckpointEngine | None = None
        self._plan_wire: dict[str, Any] | None = None
        self._version = 0

    def info(self) -> dict[str, Any]:
        return EndpointSite.here(self.device).to_wire()

    def prepare(self, plan_wire: dict[str, Any]) -> dict[str, Any]:
        """Build (or, for an unchanged plan, re-arm keeping buffers) the engine; rank 0
        returns the receivers' connect info."""
        if self.rank != 0:
            return {}
        if self._engine is not None and plan_wire != self._plan_wire:
            self.close()
        if self._engine is None:
            plan = TransferPlan.from_wire(plan_wire)
            self._engine = make_checkpoint_engine(plan, rank=0, device=self.device)
            self._plan_wire = plan_wire
        return self._engine.prepare()

    def init(self, info: dict[str, Any]) -> None:
        if self._engine is not None:
            self._engine.init(info)

    def send(self, transfer_id: int, version: int) -> dict[str, Any]:
        """Push the current weights as ``version``. Collective over trainer ranks: every
        rank walks the parameters to the end, also when rank 0's transport fails, so the
        other ranks are never left blocked in the gather."""
        tensors = iter(self._params())
        if self.rank != 0:
            start = time.perf_counter()
            for _ in tensors:
                pass
            return TransferReport(transfer_id, gather_s=_since(start)).to_wire()
        try:
            if self._engine is None:
                raise WeightSyncError("transfer", "trainer rank 0", "no transport: init first")
            report = self._engine.send(tensors, transfer_id)
        except BaseException:
            for _ in tensors:  # finish the collective gather, then fail
                pass
            raise
        logger.info(
            "pushed version %d (transfer %d) in %.3f s", version, transfer_id, report.seconds
        )
        return report.to_wire()

    def commit(self, version: int) -> None:
        """Record that every engine now serves ``version`` (the trainer's side of the
        version agreement)."""
        self._version = version

    def get_version(self) -> int:
        return self._version

    def close(self) -> None:
        if self._engine is not None:
            self._engine.finalize()
        self._engine, self._plan_wire = None, None


class WeightReceiver(_Endpoint):
    """An engine worker's end of the weight push (see the module docstring).

    ``load_fn`` copies ``(name, tensor)`` views into the engine and returns how many it
    loaded; it runs only on a verified staging buffer.
    """

    methods = frozenset({"info", "connect", "receive", "load", "close"})

    def __init__(
        self,
        load_fn: Callable[[Iterator[tuple[str, torch.Tensor]]], int],
        device: torch.device,
        local_rank: int = 0,
    ) -> None:
        self.device, self.local_rank = device, local_rank
        self._load_fn = load_fn
        self._engine: CheckpointEngine | None = None
        self._key: tuple[Any, ...] | None = None
        self._verified: int | None = None

    def call(self, method: str, *args: Any) -> Any:
        """As ``_Endpoint.call``, but a ``WeightSyncError`` comes back as a value
        (``error_to_wire``): the rollout worker re-raises it with its type, phase and peer,
        which ``collective_rpc`` would otherwise reduce to text."""
        try:
            return super().call(method, *args)
        except WeightSyncError as exc:
            logger.warning("%s", exc)
            return error_to_wire(exc)

    @property
    def peer(self) -> str:
        rank = self._engine.rank if self._engine is not None else "?"
        return f"receiver rank {rank} (pid {os.getpid()}, local rank {self.local_rank})"

    def info(self) -> dict[str, Any]:
        return EndpointSite.here(self.device, local_rank=self.local_rank).to_wire()

    def connect(
        self, plan_wire: dict[str, Any], ranks: list[list[int]], info: dict[str, Any]
    ) -> int:
        """Allocate staging and join the transport; ``ranks`` maps this replica's local
        ranks to global receiver ranks. Returns this worker's global rank."""
        rank = dict((int(local), int(glob)) for local, glob in ranks)[self.local_rank]
        key = (repr(plan_wire), rank)
        if self._engine is not None and key != self._key:
            self.close()
        if self._engine is None:
            plan = TransferPlan.from_wire(plan_wire)
            self._engine = make_checkpoint_engine(plan, rank=rank, device=self.device)
            self._key = key
        self._verified = None
        self._engine.prepare()
        self._engine.init(info)
        return rank

    def receive(self, transfer_id: int) -> dict[str, Any]:
        """Stage and verify push ``transfer_id``; the engine is not touched."""
        if self._engine is None:
            raise WeightSyncError("transfer", self.peer, "not connected")
        self._verified = None
        report = self._engine.receive(transfer_id)
        self._verified = transfer_id
        return report.to_wire()

    def load(self, transfer_id: int) -> dict[str, Any]:
        """Copy the verified staged tensors of push ``transfer_id`` into the engine."""
        if self._engine is None or self._verified != transfer_id:
            raise WeightSyncError(
                "load",
                self.peer,
                f"staging holds no verified push {transfer_id} "
                f"(verified: {self._verified}); the engine keeps its weights",
            )
        self._verified = None  # consumed: never loaded twice
        start = time.perf_counter()
        num_tensors = self._load_fn(self._engine.staged_tensors())
        return {"num_tensors": num_tensors, "seconds": _since(start)}

    def close(self) -> None:
        if self._engine is not None:
            self._engine.finalize()
        self._engine, self._key, self._verified = None, None, None


def _since(start: float) -> float:
    return time.perf_counter() - start
