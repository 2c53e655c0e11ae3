"""``gloo`` and ``nccl``: the sender broadcasts buckets in a dedicated process group.

    sender (rank 0)                                     receivers (ranks 1..N)
    TCPStore on this node's address -> {host, port, secret} --(Ray)--> join ProcessGroupGloo /
                                                         ProcessGroupNCCL under the secret
    header [id, buckets, bytes, fingerprint] -------->  check it is the expected push + layout
    pack k+1 into buf[(k+1)%2] || broadcast buf[k%2] ->  straight into staging[bucket k];
                                                         checksum k while k+1 arrives
                                                         (on the device: read back once)
    checksums [buckets, 2] -------------------------->  compare -> ChecksumMismatchError

The group is built with its own store (``torch.distributed`` default groups of the trainer and
of vLLM stay untouched), lives across syncs, and is rebuilt only after a failure. Double
buffering: packing bucket k+1 (and the FSDP gather feeding it) overlaps the broadcast of k.
Receivers post every bucket's broadcast at once into disjoint staging slices, so there is no
receive-side copy. gloo ops time out after ``timeout_s`` by themselves; NCCL waits are bounded
with ``Work.wait(timeout)`` and the communicator is aborted on expiry.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from recipe.checkpoint_engine.base import (
    SENDER_PEER,
    CheckpointEngine,
    TransferPlan,
    TransferReport,
    WeightSyncError,
    timed_iter,
)
from recipe.checkpoint_engine.checksums import ChecksumBatch
from recipe.checkpoint_engine.layout import pack_buckets
from recipe.utils.rendezvous import StoreAddress, StoreServer, node_ip

logger = logging.getLogger(__name__)

_NUM_BUFFERS = 2


class BroadcastEngine(CheckpointEngine):
    """One end of the ``gloo`` / ``nccl`` transport (see the module docstring)."""

    def __init__(self, plan: TransferPlan, *, rank: int, device: torch.device):
        super().__init__(plan, rank=rank, device=device)
        self._nccl = plan.backend == "nccl"
        if self._nccl and device.type != "cuda":
            raise ValueError("checkpoint_engine.backend='nccl' needs CUDA on both ends")
        # gloo moves host memory; a CUDA trainer packs into pinned buffers.
        self._buffer_device = device if self._nccl else torch.device("cpu")
        self._server: StoreServer | None = None
        self._store: Any = None
        self._group: Any = None
        self._buffers: list[torch.Tensor] = []
        self._staging: torch.Tensor | None = None

    def prepare(self) -> dict[str, Any]:
        if self._group is not None:  # a re-prepare (after a failure) builds a fresh group
            self._break_group()
        timeout = datetime.timedelta(seconds=self.plan.timeout_s)
        if self.rank != 0:
            self._staging = self._alloc(self.layout.total_bytes, self._staging)
            return {}
        pin = self.device.type == "cuda" and not self._nccl
        self._buffers = [
            self._alloc(self.layout.bucket_bytes, old, pin=pin)
            for old in (self._buffers or [None] * _NUM_BUFFERS)
        ]
        self._server = StoreServer.open(
            self.plan.world_size, timeout, host=node_ip(), namespace="weights"
        )
        address = self._server.address
        return {"host": address.host, "port": address.port, "secret": address.secret}

    def _alloc(self, num_bytes: int, old: torch.Tensor | None, pin: bool = False) -> torch.Tensor:
        if old is not None and old.numel() == num_bytes:
            return old  # buffers survive a rebuild of the group
        return torch.empty(num_bytes, dtype=torch.uint8, device=self._buffer_device, pin_memory=pin)

    def init(self, info: dict[str, Any]) -> None:
        timeout = datetime.timedelta(seconds=self.plan.timeout_s)
        address = StoreAddress(info["host"], int(info["port"]), info["secret"], "weights")
        try:
            # The sender serves the store (prepare); receivers connect to it.
            own = self._server.store if self._server is not None else None
            prefixed = address.connect(self.plan.world_size, timeout, store=own)
            if self._nccl:
                options = dist.ProcessGroupNCCL.Options()
                # The watchdog's limit lies past ours, so our deadline fires first and aborts
                # the communicator cleanly instead of the watchdog tearing the process down.
                options._timeout = 2 * timeout + datetime.timedelta(seconds=60)
                self._group = dist.ProcessGroupNCCL(
                    prefixed, self.rank, self.plan.world_size, options
                )
            else:
                self._group = dist.ProcessGroupGloo(
                    prefixed, self.rank, self.plan.world_size, timeout
                )
        except RuntimeError as exc:
            raise WeightSyncError("init", self.peer, f"joining the weight group: {exc}") from exc
        self._store = prefixed

    def _broadcast(self, tensor: torch.Tensor) -> Any:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self._group.broadcast([tensor], options)

    def _wait(self, work: Any, what: str) -> None:
        """Wait for one op; any failure breaks the group (it is rebuilt at the next init)."""
        try:
            if self._nccl:  # an NCCL wait only orders streams: poll against the deadline
                end = time.monotonic() + self.plan.timeout_s
                while not work.is_completed():
                    if time.monotonic() > end:
                        raise RuntimeError(f"no progress within {self.plan.timeout_s:.1f} s")
                    time.sleep(1e-4)
            work.wait()
        except RuntimeError as exc:
            self._break_group()
            peer = self.peer if self.rank == 0 else f"{self.peer} waiting on {SENDER_PEER}"
            raise WeightSyncError("transfer", peer, f"{what}: {exc}") from exc

    def _break_group(self) -> None:
        group, self._group = self._group, None
        abort = getattr(group, "abort", None)
        if self._nccl and abort is not None:
            abort()  # frees a communicator stuck on a dead peer

    def _header(self, transfer_id: int) -> torch.Tensor:
        values = [
            transfer_id,
            self.layout.num_buckets,
            self.layout.total_bytes,
            self.fingerprint,
        ]
        return torch.tensor(values, dtype=torch.int64, device=self._buffer_device)

    def send(self, tensors: Iterable[tuple[str, torch.Tensor]], transfer_id: int) -> TransferReport:
        assert self.rank == 0
        if self._group is None:
            raise WeightSyncError("transfer", self.peer, "the weight group is down: init first")
        start = time.perf_counter()
        report = TransferReport(transfer_id)
        self._wait(self._broadcast(self._header(transfer_id)), "broadcasting the header")
        works: list[Any] = [None] * _NUM_BUFFERS

        def bucket_buffer(k: int) -> torch.Tensor:
            slot = k % _NUM_BUFFERS
            if works[slot] is not None:  # the broadcast that last used this buffer
                self._wait(works[slot], f"broadcasting bucket {k - _NUM_BUFFERS}")
                works[slot] = None
            return self._buffers[slot]

        batch = ChecksumBatch(self._buffer_device)
        for k, bucket in pack_buckets(self.layout, timed_iter(tensors, report), bucket_buffer):
            self._seal_bucket(k, bucket, batch)
            works[k % _NUM_BUFFERS] = self._broadcast(bucket)
        for work in works:
            if work is not None:
                self._wait(work, "broadcasting the last buckets")
        self._record_sums(batch, report)
        sums = torch.tensor(
            report.checksums or [[0, 0]] * self.layout.num_buckets,
            dtype=torch.int64,
            device=self._buffer_device,
        )
        self._wait(self._broadcast(sums), "broadcasting the checksums")
        report.seconds = time.perf_counter() - start
        return report

    def receive(self, transfer_id: int) -> TransferReport:
        assert self.rank != 0
        if self._group is None:
            raise WeightSyncError("transfer", self.peer, "the weight group is down: init first")
        start = time.perf_counter()
        report = TransferReport(transfer_id)
        staging = self._staging = self._alloc(self.layout.total_bytes, self._staging)
        header = torch.zeros(4, dtype=torch.int64, device=self._buffer_device)
        self._wait(self._broadcast(header), "receiving the header")
        expected = self._header(transfer_id).tolist()
        if header.tolist() != expected:
            self._break_group()
            raise WeightSyncError(
                "transfer",
                self.peer,
                f"the sender announced push "
                f"{header.tolist()}, expected {expected} [id, buckets, bytes, "
                "layout fingerprint]",
            )
        ranges = [self.layout.bucket_range(k) for k in range(self.layout.num_buckets)]
        works = [self._broadcast(staging[lo:hi]) for lo, hi in ranges]
        sums = torch.zeros(
            self.layout.num_buckets, 2, dtype=torch.int64, device=self._buffer_device
        )
        sums_work = self._broadcast(sums)
        batch = ChecksumBatch(self._buffer_device)
        for k, work in enumerate(works):
            self._wait(work, f"receiving bucket {k} of {len(works)}")
            if self.plan.verify:  # overlaps the arrival of the next buckets
                lo, hi = ranges[k]
                batch.add(k, staging[lo:hi])
        self._wait(sums_work, "receiving the checksums")
        self._verify_sums(batch, dict(enumerate(sums.tolist())), report)
        report.seconds = time.perf_counter() - start
        return report

    def staging(self) -> torch.Tensor:
        assert self._staging is not None, "receive() before staging()"
        return self._staging

    def finalize(self) -> None:
        group, self._group = self._group, None
        if group is not None and self._nccl and hasattr(group, "abort"):
            group.abort()
        self._store = self._server = None
        self._buffers, self._staging = [], None
