"""The ``CheckpointEngine`` contract: one end of one weight transport (factory.py builds one).

A weight push has one sender (trainer rank 0; the other trainer ranks only join the
collective gather) and N receivers (every rollout engine worker, global ranks 1..N)::

    sender                                    receiver r (r = 1..N)
    prepare()  -> connect info (plain dict) --> init(info)       join the process group /
    init(info)                                                     attach the shared region
    send(tensors, transfer_id)  --buckets-->  receive(transfer_id)  -> staging, checksums
                                              staged_tensors()      -> views for the engine
    finalize()                                finalize()

Buffers and process groups live from ``prepare``/``init`` to ``finalize`` and are reused by
every ``send``/``receive``. A receiver never touches the engine: it fills a staging buffer and
verifies it; the caller loads the staged views only after every replica verified (so a failed
or partial transfer leaves every engine on its old weights). Every blocking wait is bounded by
``TransferPlan.timeout_s`` and raises ``WeightSyncError`` naming the phase and the peer it
waited for.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recipe.checkpoint_engine.checksums import ChecksumBatch
from recipe.checkpoint_engine.layout import BucketLayout

SENDER_PEER = "trainer rank 0 (sender)"


class WeightSyncError(RuntimeError):
    """A sync phase failed or missed its deadline; the message names the phase and the peer."""

    def __init__(self, phase: str, peer: str, detail: str):
        super().__init__(f"weight sync phase '{phase}' failed at {peer}: {detail}")
        self.phase, self.peer, self.detail = phase, peer, detail

    def __reduce__(self) -> tuple[Any, ...]:  # keep the fields across Ray's pickling
        return type(self), (self.phase, self.peer, self.detail)


class ChecksumMismatchError(WeightSyncError):
    """A received bucket differs from what the sender packed."""


_WIRE_ERROR_KEY = "weight_sync_error"


def error_to_wire(exc: WeightSyncError) -> dict[str, Any]:
    """A ``WeightSyncError`` as a plain dict: vLLM's ``collective_rpc`` turns exceptions into
    bare ``Exception`` text, so receivers return their errors as values instead."""
    return {_WIRE_ERROR_KEY: [type(exc).__name__, exc.phase, exc.peer, exc.detail]}


def raise_wire_error(result: Any) -> Any:
    """Re-raise an ``error_to_wire`` result with its type; other results pass through."""
    if isinstance(result, dict) and _WIRE_ERROR_KEY in result:
        name, phase, peer, detail = result[_WIRE_ERROR_KEY]
        error_cls = ChecksumMismatchError if name == "ChecksumMismatchError" else WeightSyncError
        raise error_cls(phase, peer, detail)
    return result


@dataclass(slots=True)
class TransferPlan:
    """What both ends agree on before the first push (travels as a plain dict)."""

    backend: str
    """A transport moved by a ``CheckpointEngine`` (transports.py)."""
    layout: BucketLayout
    """Tensor offsets and bucket cut, computed once from the trainer's metadata."""
    num_receivers: int
    """Engine workers receiving (global ranks 1..N)."""
    timeout_s: float
    """Deadline of every blocking wait inside a phase."""
    verify: bool = True
    """Compute and compare per-bucket checksums."""

    @property
    def world_size(self) -> int:
        return self.num_receivers + 1

    def to_wire(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "layout": self.layout.to_wire(),
            "num_receivers": self.num_receivers,
            "timeout_s": self.timeout_s,
            "verify": self.verify,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> TransferPlan:
        return cls(
            backend=wire["backend"],
            layout=BucketLayout.from_wire(wire["layout"]),
            num_receivers=int(wire["num_receivers"]),
            timeout_s=float(wire["timeout_s"]),
            verify=bool(wire["verify"]),
        )


@dataclass(slots=True)
class TransferReport:
    """One end's account of one transfer (plain fields: it crosses Ray and msgpack)."""

    transfer_id: int
    """The push this report belongs to."""
    checksums: list[list[int]] = field(default_factory=list)
    """Per bucket ``[word_sum, row_weighted_sum]``; empty when verification is off."""
    seconds: float = 0.0
    """Wall time of ``send``/``receive``."""
    gather_s: float = 0.0
    """Sender: time spent waiting on the trainer's parameter iterator (FSDP all-gather)."""
    verify_s: float = 0.0
    """Time spent computing checksums."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "transfer_id": self.transfer_id,
            "checksums": [list(c) for c in self.checksums],
            "seconds": self.seconds,
            "gather_s": self.gather_s,
            "verify_s": self.verify_s,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> TransferReport:
        return cls(
            transfer_id=int(wire["transfer_id"]),
            checksums=[list(c) for c in wire["checksums"]],
            seconds=float(wire["seconds"]),
            gather_s=float(wire["gather_s"]),
            verify_s=float(wire["verify_s"]),
        )


class CheckpointEngine(ABC):
    """One end of one transport (see the module docstring). ``rank`` 0 is the sender."""

    def __init__(self, plan: TransferPlan, *, rank: int, device: torch.device):
        if not 0 <= rank <= plan.num_receivers:
            raise ValueError(f"rank {rank} is outside 0..{plan.num_receivers}")
        self.plan, self.layout, self.rank, self.device = plan, plan.layout, rank, device
        self.peer = SENDER_PEER if rank == 0 else f"receiver rank {rank}"
        self.fingerprint = self.layout.fingerprint()  # once: it hashes every slot

    @abstractmethod
    def prepare(self) -> dict[str, Any]:
        """Allocate buffers kept across syncs; the sender returns what receivers need to
        connect (plain values), a receiver returns ``{}``."""

    @abstractmethod
    def init(self, info: dict[str, Any]) -> None:
        """Connect to the peers with the sender's ``info`` (collective for group backends)."""

    @abstractmethod
    def send(self, tensors: Iterable[tuple[str, torch.Tensor]], transfer_id: int) -> TransferReport:
        """Sender: pack ``tensors`` (the layout's order) into buckets and push them."""

    @abstractmethod
    def receive(self, transfer_id: int) -> TransferReport:
        """Receiver: fill the staging buffer with push ``transfer_id`` and verify it; raises
        ``ChecksumMismatchError`` naming the bucket when verification fails."""

    @abstractmethod
    def finalize(self) -> None:
        """Release buffers, mappings and process groups. Idempotent."""

    @abstractmethod
    def staging(self) -> torch.Tensor:
        """Receiver: the flat uint8 stream of the last ``receive``."""

    def staged_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Receiver: zero-copy views of the staged tensors, in layout order."""
        return self.layout.views(self.staging())

    # ---- helpers shared by the backends -----------------------------------------------

    def _seal_bucket(self, index: int, bucket: torch.Tensor, sums: ChecksumBatch) -> None:
        """Sender: queue a packed bucket's checksum."""
        if self.plan.verify:
            sums.add(index, bucket)

    @staticmethod
    def _record_sums(sums: ChecksumBatch, report: TransferReport) -> list[tuple[int, list[int]]]:
        """Resolve ``sums`` into ``report`` (checksums in bucket order, verify time)."""
        before = sums.seconds
        resolved = sums.resolve()
        report.verify_s += sums.seconds - before
        report.checksums.extend(values for _, values in resolved)
        return resolved

    def _verify_sums(
        self, sums: ChecksumBatch, expected: dict[int, list[int]], report: TransferReport
    ) -> None:
        """Receiver: resolve the received buckets' checksums and compare each with the
        sender's ``expected[bucket]``."""
        for index, got in self._record_sums(sums, report):
            self._compare_bucket(index, got, expected[index], report)

    def _compare_bucket(
        self, index: int, got: list[int], expected: list[int], report: TransferReport
    ) -> None:
        if list(got) != list(expected):
            raise ChecksumMismatchError(
                "transfer",
                self.peer,
                f"bucket {index} of {self.layout.num_buckets} checksum {list(got)} != sender's "
                f"{list(expected)} (transfer {report.transfer_id}); staged weights discarded",
            )


def timed_iter(
    tensors: Iterable[tuple[str, torch.Tensor]], report: TransferReport
) -> Iterator[tuple[str, torch.Tensor]]:
    """Adds the time spent waiting on ``tensors`` (the FSDP gather) to ``report.gather_s``."""
    iterator = iter(tensors)
    while True:
        start = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            report.gather_s += time.perf_counter() - start
            return
        report.gather_s += time.perf_counter() - start
        yield item
