"""Per-bucket checksums without a host sync per bucket.

    add(k, bucket) --> checksum kernels queued on the current stream (CUDA) / computed (CPU)
    resolve()      --> one copy of every pending [word_sum, row_weighted_sum] to the host

Reading a device checksum back (``int(tensor)``) stalls the host until the device has caught
up; done once per bucket it serialises packing, checksumming and the transfer (a 7B push has
~220 buckets of 64 MiB). A ``ChecksumBatch`` keeps the values on the device until the caller
needs them, then reads them all with one sync. On a CUDA device the time is the checksum
kernels' own time, measured with events (host wall time would mostly be launch time); on the
CPU it is wall time.
"""

from __future__ import annotations

import time

import torch

from recipe.checkpoint_engine.layout import bucket_checksum_tensor


class ChecksumBatch:
    """Checksums of buckets added since the last ``resolve`` (see the module docstring)."""

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._indices: list[int] = []
        self._sums: list[torch.Tensor] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._pending_s = 0.0
        self.seconds = 0.0
        """Checksum time of everything resolved so far."""

    def __len__(self) -> int:
        return len(self._indices)

    def add(self, index: int, bucket: torch.Tensor) -> None:
        """Checksum ``bucket`` (bucket ``index`` of the layout) as of now in stream order: a
        later write to it on the same stream does not change the result."""
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._sums.append(bucket_checksum_tensor(bucket))
            end.record()
            self._events.append((start, end))
        else:
            began = time.perf_counter()
            self._sums.append(bucket_checksum_tensor(bucket))
            self._pending_s += time.perf_counter() - began
        self._indices.append(index)

    def resolve(self) -> list[tuple[int, list[int]]]:
        """``(bucket index, [word_sum, row_weighted_sum])`` of every pending bucket, in the
        order added; one host sync on CUDA."""
        if not self._indices:
            return []
        values = torch.stack(self._sums).tolist()  # waits for the kernels
        for start, end in self._events:
            self._pending_s += start.elapsed_time(end) / 1e3
        self.seconds += self._pending_s
        self._pending_s = 0.0
        resolved = list(zip(self._indices, values, strict=True))
        self._indices, self._sums, self._events = [], [], []
        return resolved
