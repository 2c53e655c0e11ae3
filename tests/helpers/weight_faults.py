"""Faults the weight-sync tests inject into a sending checkpoint engine from outside it (the
product carries no fault hooks): a byte flipped in a bucket after its checksum was taken, as
a transport that corrupts data in flight would."""

from __future__ import annotations

from typing import Any


def corrupt_next_send(engine: Any, bucket_index: int) -> None:
    """``engine``'s next send flips a byte of bucket ``bucket_index`` right after
    checksumming it (stream-ordered after the checksum on a device), once."""
    seal = engine._seal_bucket

    def seal_then_corrupt(index: int, bucket: Any, sums: Any) -> None:
        seal(index, bucket, sums)
        if index == bucket_index:
            del engine._seal_bucket  # the class's own again: the fault fires once
            middle = bucket.numel() // 2
            bucket[middle : middle + 1].bitwise_xor_(0x5A)

    engine._seal_bucket = seal_then_corrupt
