"""The device backends across real processes: ``cuda_ipc`` (trainer and engine on one GPU)
and ``nccl`` (two GPUs). Each push goes through ``recipe.tools.bench.weight_sync``'s sender and
receiver processes and is checked bitwise (a hash of every tensor on both sides)."""

from __future__ import annotations

import argparse

import pytest
import torch

from recipe.tools.bench.weight_sync import run_backend, synthetic_metadata

pytestmark = pytest.mark.gpu


def _args(**overrides) -> argparse.Namespace:
    defaults = dict(
        device="cuda",
        bucket_mb=8,
        receivers=1,
        repeats=1,
        timeout_s=60.0,
        no_verify=False,
        threads=1,
    )
    return argparse.Namespace(**{**defaults, **overrides})


def test_cuda_ipc_push_is_bitwise_exact_on_one_gpu():
    meta = synthetic_metadata("10M", "bfloat16")
    result = run_backend("cuda_ipc", meta, _args())
    assert result["bitwise_equal"] == 1.0 and result["verify_s"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nccl needs 2 GPUs")
def test_nccl_push_is_bitwise_exact_on_every_other_gpu():
    meta = synthetic_metadata("10M", "bfloat16")
    # One receiver per GPU besides the sender's (NCCL allows one rank per device).
    result = run_backend("nccl", meta, _args(receivers=torch.cuda.device_count() - 1))
    assert result["bitwise_equal"] == 1.0


def test_device_checksums_match_the_cpu_ones_and_ignore_later_writes_in_stream_order():
    from recipe.checkpoint_engine.checksums import ChecksumBatch
    from recipe.checkpoint_engine.layout import PAGE_BYTES, bucket_checksum

    gen = torch.Generator().manual_seed(3)
    host = torch.randint(0, 256, (8 * PAGE_BYTES,), dtype=torch.uint8, generator=gen)
    bucket = host.cuda()
    batch = ChecksumBatch(bucket.device)
    batch.add(0, bucket)
    bucket[5].bitwise_xor_(0x10)  # queued after the checksum on the same stream
    batch.add(1, bucket)
    (first, before), (second, after) = batch.resolve()
    assert (first, second) == (0, 1)
    assert before == list(bucket_checksum(host)) and after != before
    assert batch.seconds > 0
