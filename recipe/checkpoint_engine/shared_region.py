"""``shm`` and ``cuda_ipc``: the sender writes the stream into memory every receiver maps.

    sender (trainer rank 0)                      receivers (every engine on the host / GPU)
    pack bucket k into region[k] --> checksum -> header.sums[k] --> header.stamp[k] = id
                                                 poll stamp[k] == id (deadline) -> checksum
                                                 region[k], compare with header.sums[k]
    region = the staging buffer: engines load views of it after every replica verified

``shm``: one file in /dev/shm (header pages + stream), mapped shared by all processes.
``cuda_ipc``: the stream is a device buffer shared through a CUDA IPC handle (trainer and
engines colocated on one GPU); the small header stays in host shared memory, written only
after the bucket's copy has completed on the device, so a stamp never runs ahead of data.
On the device, checksums stay there until a group of ~1 GiB of buckets is stamped (one host
sync per group, not per bucket), and a receiver reads all of its checksums back in one sync.

Zero extra copies: the sender's pack is the only copy before the engine's own load, and one
region serves every replica. The region costs one model of memory; it lives from ``prepare``
to ``finalize`` and is reused by every push. The file is unlinked at the first push (every
receiver has mapped it by then), so a crashed process cannot leak it past its mappings.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import pickle
import time
import uuid
from collections.abc import Iterable
from typing import Any

import torch

from recipe.checkpoint_engine.base import (
    SENDER_PEER,
    CheckpointEngine,
    TransferPlan,
    TransferReport,
    WeightSyncError,
    timed_iter,
)
from recipe.checkpoint_engine.checksums import ChecksumBatch
from recipe.checkpoint_engine.host import shm_dir
from recipe.checkpoint_engine.layout import PAGE_BYTES, pack_buckets

logger = logging.getLogger(__name__)

_MAGIC = 0x5245434950452D57  # any constant: tells a header from an unrelated file
_HEAD_WORDS = 3  # magic, layout fingerprint, transfer id being written
_PUBLISH_BYTES = 1 << 30
"""cuda_ipc: buckets are stamped in groups of about this size (one host sync per group,
and the receiver checks a group while the next is packed)."""
_MAX_POLL_S = 5e-4
"""Receivers poll a stamp at most this far apart (a 1 GB push takes ~10 ms on one GPU)."""


class SharedRegionEngine(CheckpointEngine):
    """One end of the ``shm`` / ``cuda_ipc`` transport (see the module docstring)."""

    def __init__(self, plan: TransferPlan, *, rank: int, device: torch.device):
        super().__init__(plan, rank=rank, device=device)
        self._on_device = plan.backend == "cuda_ipc"
        if self._on_device and device.type != "cuda":
            raise ValueError("checkpoint_engine.backend='cuda_ipc' needs CUDA on both ends")
        num_buckets = self.layout.num_buckets
        self._header_bytes = -(-8 * (_HEAD_WORDS + 3 * num_buckets) // PAGE_BYTES) * PAGE_BYTES
        self._path: str | None = None
        self._header: torch.Tensor | None = None  # int64 words, host shared memory
        self._region: torch.Tensor | None = None  # the stream (host file or device buffer)
        self._unlinked = False
        self.publish_bytes = _PUBLISH_BYTES if self._on_device else 0
        """Sender: stamp buckets once this many bytes are packed (0: every bucket)."""
        self.defer_verify = self._on_device
        """Receiver: read all checksums back after the last bucket (else one by one)."""

    # header words: [magic, fingerprint, transfer id] + stamps[num_buckets] + sums[2*num_buckets]
    def _stamp_index(self, bucket: int) -> int:
        return _HEAD_WORDS + bucket

    def _sum_index(self, bucket: int) -> int:
        return _HEAD_WORDS + self.layout.num_buckets + 2 * bucket

    def prepare(self) -> dict[str, Any]:
        self.finalize()  # a re-prepare (after a failure) starts from a fresh region
        if self.rank != 0:
            return {}
        self._unlinked = False
        name = f"recipe-weights-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._path = os.path.join(shm_dir(), name)
        stream_bytes = 0 if self._on_device else self.layout.total_bytes
        mapped = torch.from_file(
            self._path, shared=True, size=self._header_bytes + stream_bytes, dtype=torch.uint8
        )
        self._header = mapped[: self._header_bytes].view(torch.int64)
        self._header.zero_()
        self._header[0], self._header[1] = _MAGIC, self.fingerprint
        info: dict[str, Any] = {"path": self._path, "ipc": None, "device_uuid": None}
        if self._on_device:
            self._region = torch.zeros(
                self.layout.total_bytes, dtype=torch.uint8, device=self.device
            )
            info["ipc"] = _export_ipc(self._region)
            info["device_uuid"] = _device_uuid(self.device)
        else:
            self._region = mapped[self._header_bytes :]
        logger.info(
            "shared region %s: %d B in %d buckets",
            name,
            self.layout.total_bytes,
            self.layout.num_buckets,
        )
        return info

    def init(self, info: dict[str, Any]) -> None:
        if self.rank == 0:
            return
        path = info["path"]
        if not os.path.exists(path):
            raise WeightSyncError("init", self.peer, f"shared region {path} does not exist")
        size = os.path.getsize(path)
        mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        self._header = mapped[: self._header_bytes].view(torch.int64)
        magic, fingerprint = int(self._header[0]), int(self._header[1])
        if magic != _MAGIC or fingerprint != self.fingerprint:
            raise WeightSyncError(
                "init",
                self.peer,
                f"{path} was written for another layout: sender and "
                "receiver disagree on the weight metadata",
            )
        if self._on_device:
            self._region = _import_ipc(info["ipc"], info["device_uuid"], self.device)
        else:
            self._region = mapped[self._header_bytes :]

    def send(self, tensors: Iterable[tuple[str, torch.Tensor]], transfer_id: int) -> TransferReport:
        assert self.rank == 0 and self._header is not None and self._region is not None
        if not self._unlinked and self._path is not None:
            os.unlink(self._path)  # every receiver mapped it during init
            self._unlinked = True
        start = time.perf_counter()
        report = TransferReport(transfer_id)
        header, region = self._header, self._region
        header[2] = transfer_id

        def bucket_buffer(k: int) -> torch.Tensor:
            lo, hi = self.layout.bucket_range(k)
            return region[lo:hi]

        sums, pending, pending_bytes = ChecksumBatch(self.device), [], 0
        last = self.layout.num_buckets - 1
        for k, bucket in pack_buckets(self.layout, timed_iter(tensors, report), bucket_buffer):
            self._seal_bucket(k, bucket, sums)
            pending.append(k)
            pending_bytes += bucket.numel()
            if pending_bytes >= self.publish_bytes or k == last:
                self._publish(pending, sums, report, transfer_id)
                pending, pending_bytes = [], 0
        report.seconds = time.perf_counter() - start
        return report

    def _publish(
        self, buckets: list[int], sums: ChecksumBatch, report: TransferReport, transfer_id: int
    ) -> None:
        """Stamp ``buckets`` as written, their checksums first (device data before both)."""
        assert self._header is not None
        if self._on_device:
            torch.cuda.current_stream(self.device).synchronize()
        for k, values in self._record_sums(sums, report):
            self._header[self._sum_index(k)], self._header[self._sum_index(k) + 1] = values
        for k in buckets:
            self._header[self._stamp_index(k)] = transfer_id

    def receive(self, transfer_id: int) -> TransferReport:
        assert self.rank != 0 and self._header is not None and self._region is not None
        start = time.perf_counter()
        report = TransferReport(transfer_id)
        num_buckets = self.layout.num_buckets
        deadline_s = self.plan.timeout_s
        end = time.monotonic() + deadline_s
        sums, expected = ChecksumBatch(self.device), {}
        for k in range(num_buckets):
            self._wait_stamp(k, transfer_id, end, deadline_s)
            if self.plan.verify:
                at = self._sum_index(k)
                expected[k] = [int(self._header[at]), int(self._header[at + 1])]
                lo, hi = self.layout.bucket_range(k)
                sums.add(k, self._region[lo:hi])
                if not self.defer_verify or k == num_buckets - 1:
                    self._verify_sums(sums, expected, report)
        report.seconds = time.perf_counter() - start
        return report

    def _wait_stamp(self, bucket: int, transfer_id: int, end: float, deadline_s: float) -> None:
        index, pause_s = self._stamp_index(bucket), 1e-4
        assert self._header is not None, "the region is not open"
        while int(self._header[index]) != transfer_id:
            if time.monotonic() > end:
                raise WeightSyncError(
                    "transfer",
                    self.peer,
                    f"bucket {bucket} of {self.layout.num_buckets} (transfer {transfer_id}) "
                    f"did not arrive from {SENDER_PEER} within {deadline_s:.1f} s",
                )
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, _MAX_POLL_S)

    def staging(self) -> torch.Tensor:
        assert self._region is not None, "receive() before staging()"
        return self._region

    def finalize(self) -> None:
        if self.rank == 0 and self._path is not None and not self._unlinked:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
        self._path, self._unlinked = None, True
        self._header = self._region = None


def _device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _export_ipc(tensor: torch.Tensor) -> str:
    """A CUDA IPC handle of ``tensor`` as text (``collective_rpc`` carries plain values)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return base64.b64encode(pickle.dumps(reduce_tensor(tensor))).decode("ascii")


def _import_ipc(handle: str, device_uuid: str, device: torch.device) -> torch.Tensor:
    """Map the sender's buffer. The handle names a device index in the *sender's* numbering;
    Ray may number devices differently per process, so it is rewritten by device UUID."""
    rebuild, args = pickle.loads(base64.b64decode(handle))  # our own handle, from our sender
    local = [
        i
        for i in range(torch.cuda.device_count())
        if str(torch.cuda.get_device_properties(i).uuid) == device_uuid
    ]
    if not local:
        raise WeightSyncError(
            "init",
            f"receiver on {device}",
            f"GPU {device_uuid} of the sender is not visible "
            "here: cuda_ipc needs trainer and engine on the same GPU (use nccl)",
        )
    args = list(args)
    args[6] = local[0]  # storage_device of torch's reduce_tensor for CUDA tensors
    return rebuild(*args)
