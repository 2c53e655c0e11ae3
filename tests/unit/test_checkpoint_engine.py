"""The checkpoint-engine core on CPU, in one process: layout, checksums, placement decisions,
and the real ``shm`` and ``gloo`` engines (gloo ranks on threads, a real TCPStore and
process group), including corruption and a sender that never sends."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from recipe.checkpoint_engine.base import (
    ChecksumMismatchError,
    TransferPlan,
    WeightSyncError,
)
from recipe.checkpoint_engine.checksums import ChecksumBatch
from recipe.checkpoint_engine.endpoints import WeightReceiver
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.host import EndpointSite
from recipe.checkpoint_engine.layout import (
    ALIGN_BYTES,
    PAGE_BYTES,
    BucketLayout,
    bucket_checksum,
    pack_buckets,
)
from recipe.checkpoint_engine.placement import (
    order_receivers,
    resolve_backend,
    resolve_bucket_bytes,
)
from tests.helpers.weight_faults import corrupt_next_send

BUCKET_BYTES = 2 * PAGE_BYTES  # 8 KiB: the 24 KiB weight spans three buckets


def _tensors() -> dict[str, torch.Tensor]:
    """Mixed dtypes and shapes: a weight bigger than a bucket, bf16/fp16, ints, bools, a
    scalar, and a non-contiguous view (packed as its contiguous copy)."""
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(48, 128, generator=gen)
    return {
        "embed.weight": big,  # 24 KiB float32
        "norm.weight": torch.randn(7, generator=gen).to(torch.bfloat16),
        "proj.weight": torch.randn(33, 5, generator=gen).to(torch.float16),
        "step": torch.tensor(123456789012, dtype=torch.int64),
        "mask": torch.rand(13, generator=gen) > 0.5,
        "proj.bias": torch.randn(5, 9, generator=gen).t(),  # non-contiguous
        "tiny": torch.tensor([3], dtype=torch.uint8),
    }


def _scaled(tensors: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    return {n: (t * scale if t.is_floating_point() else t) for n, t in tensors.items()}


def _metadata(tensors: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()]


def _plan(backend: str, *, num_receivers: int = 1, timeout_s: float = 10.0) -> TransferPlan:
    layout = BucketLayout.build(_metadata(_tensors()), BUCKET_BYTES)
    return TransferPlan(backend, layout, num_receivers, timeout_s)


def _assert_bitwise(staged: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    assert list(staged) == list(source)
    for name, tensor in source.items():
        got = staged[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(
            got.reshape(-1).view(torch.uint8), tensor.contiguous().reshape(-1).view(torch.uint8)
        ), name


# ---- layout and checksums ---------------------------------------------------------------


def test_layout_aligns_tensors_and_cuts_a_big_tensor_across_buckets():
    layout = BucketLayout.build(_metadata(_tensors()), BUCKET_BYTES)
    assert all(slot.offset % ALIGN_BYTES == 0 for slot in layout.slots)
    assert layout.total_bytes % PAGE_BYTES == 0 and layout.bucket_bytes == BUCKET_BYTES
    embed = layout.slots[0]
    assert embed.num_bytes == 48 * 128 * 4 > 2 * layout.bucket_bytes
    assert layout.num_buckets == -(-layout.total_bytes // BUCKET_BYTES)
    assert BucketLayout.from_wire(layout.to_wire()) == layout
    other = BucketLayout.build(_metadata(_tensors()), 4 * PAGE_BYTES)
    assert (
        other.fingerprint()
        != layout.fingerprint()
        == BucketLayout.from_wire(layout.to_wire()).fingerprint()
    )


def test_packed_buckets_hold_every_tensor_bitwise_and_zero_padding():
    tensors = _tensors()
    layout = BucketLayout.build(_metadata(tensors), BUCKET_BYTES)
    stream = torch.full((layout.total_bytes,), 0xEE, dtype=torch.uint8)
    emitted = []

    def region(k: int) -> torch.Tensor:
        lo, hi = layout.bucket_range(k)
        return stream[lo:hi]

    for k, bucket in pack_buckets(layout, tensors.items(), region):
        emitted.append(k)
        assert bucket.numel() == layout.bucket_range(k)[1] - layout.bucket_range(k)[0]
    assert emitted == list(range(layout.num_buckets))
    _assert_bitwise(dict(layout.views(stream)), tensors)
    covered = torch.zeros(layout.total_bytes, dtype=torch.bool)
    for slot in layout.slots:
        covered[slot.offset : slot.offset + slot.num_bytes] = True
    assert int(stream[~covered].sum()) == 0, "padding must be zeros"


def test_packing_refuses_tensors_that_do_not_match_the_layout():
    tensors = _tensors()
    layout = BucketLayout.build(_metadata(tensors), BUCKET_BYTES)
    buffer = torch.empty(BUCKET_BYTES, dtype=torch.uint8)
    wrong = dict(tensors, **{"norm.weight": tensors["norm.weight"].float()})
    with pytest.raises(ValueError, match=r"norm\.weight"):
        list(pack_buckets(layout, wrong.items(), lambda k: buffer))
    with pytest.raises(ValueError, match="yielded 6 tensors"):
        list(pack_buckets(layout, list(tensors.items())[:-1], lambda k: buffer))


def test_checksum_changes_with_any_flipped_byte_and_with_swapped_pages():
    gen = torch.Generator().manual_seed(1)
    bucket = torch.randint(0, 256, (4 * PAGE_BYTES,), dtype=torch.uint8, generator=gen)
    base = bucket_checksum(bucket)
    assert bucket_checksum(bucket.clone()) == base
    for index in (0, 1, PAGE_BYTES + 7, bucket.numel() - 1):
        flipped = bucket.clone()
        flipped[index] ^= 0x01
        assert bucket_checksum(flipped) != base, index
    swapped = bucket.view(4, PAGE_BYTES)[[1, 0, 2, 3]].reshape(-1)
    assert bucket_checksum(swapped)[0] == base[0] and bucket_checksum(swapped) != base


def test_a_checksum_batch_reads_back_every_pending_bucket_once_in_order():
    gen = torch.Generator().manual_seed(2)
    buckets = [
        torch.randint(0, 256, (2 * PAGE_BYTES,), dtype=torch.uint8, generator=gen) for _ in range(3)
    ]
    batch = ChecksumBatch(torch.device("cpu"))
    assert batch.resolve() == []
    batch.add(7, buckets[0])
    batch.add(3, buckets[1])
    assert len(batch) == 2
    assert batch.resolve() == [
        (7, list(bucket_checksum(buckets[0]))),
        (3, list(bucket_checksum(buckets[1]))),
    ]
    assert len(batch) == 0 and batch.seconds > 0
    batch.add(0, buckets[2])
    assert batch.resolve() == [(0, list(bucket_checksum(buckets[2])))]


# ---- placement ----------------------------------------------------------------------------


def test_receivers_are_sorted_within_each_group_then_concatenated_in_group_order():
    groups = [
        [_where("a", local_rank=1), _where("a", local_rank=0)],
        [_where("a", local_rank=0)],
        [_where("a", local_rank=r) for r in (3, 2, 0)],
    ]
    assert order_receivers(groups) == [
        [[0, 1], [1, 2]],
        [[0, 3]],
        [[0, 4], [2, 5], [3, 6]],
    ]
    with pytest.raises(ValueError, match="replica 0 reports duplicate local ranks"):
        order_receivers([[_where("a"), _where("a")]])


def _where(host: str, uuid: str | None = None, *, local_rank: int = 0) -> EndpointSite:
    device = "cuda:0" if uuid else "cpu"
    return EndpointSite(host, "10.0.0.1", 1, device, uuid, 1 << 30, local_rank=local_rank)


def test_an_endpoint_site_crosses_the_wire_intact():
    site = EndpointSite.here(torch.device("cpu"), local_rank=2)
    assert site.device_uuid is None and site.pid == os.getpid() and site.free_bytes > 0
    assert EndpointSite.from_wire(json.loads(json.dumps(site.to_wire()))) == site


def test_auto_backend_follows_the_placement():
    assert resolve_backend("auto", _where("a"), [_where("a"), _where("a")]) == "shm"
    assert resolve_backend("auto", _where("a"), [_where("a"), _where("b")]) == "gloo"
    assert resolve_backend("auto", _where("a", "g0"), [_where("a", "g0")]) == "cuda_ipc"
    assert resolve_backend("auto", _where("a", "g0"), [_where("b", "g1")]) == "nccl"
    assert resolve_backend("gloo", _where("a"), [_where("a")]) == "gloo"


@pytest.mark.parametrize(
    ("backend", "receivers"),
    [("shm", [_where("b")]), ("cuda_ipc", [_where("a", "g1")]), ("nccl", [_where("a")])],
)
def test_explicit_backend_that_cannot_serve_the_placement_names_the_key(backend, receivers):
    sender = _where("a", "g0" if backend != "shm" else None)
    with pytest.raises(ValueError, match=f"checkpoint_engine.backend='{backend}'"):
        resolve_backend(backend, sender, receivers)


def test_bucket_size_is_explicit_or_a_clamped_fraction_of_free_memory():
    mib = 1 << 20
    assert resolve_bucket_bytes(64, 0.05, 10**12, 10**12) == 64 * mib
    assert resolve_bucket_bytes(0, 0.05, 4000 * mib, 10**12) == 200 * mib
    assert resolve_bucket_bytes(0, 0.05, 10 * mib, 10**12) == 1 * mib  # floor
    assert resolve_bucket_bytes(0, 0.5, 10**13, 10**12) == 1024 * mib  # ceiling
    assert resolve_bucket_bytes(512, 0.05, 10**12, 3 * mib + 5) == 4 * mib  # model cap


# ---- real engines -------------------------------------------------------------------------


def _shm_pair(timeout_s: float = 10.0):
    plan = _plan("shm", timeout_s=timeout_s)
    sender = make_checkpoint_engine(plan, rank=0, device=torch.device("cpu"))
    receiver = make_checkpoint_engine(plan, rank=1, device=torch.device("cpu"))
    info = sender.prepare()
    receiver.prepare()
    receiver.init(info)
    sender.init(info)
    return sender, receiver


def test_shm_push_stages_every_tensor_bitwise_and_reuses_the_region():
    sender, receiver = _shm_pair()
    try:
        for transfer_id, scale in ((1, 1.0), (2, -3.0)):
            tensors = {
                n: (t * scale if t.is_floating_point() else t) for n, t in _tensors().items()
            }
            sent = sender.send(tensors.items(), transfer_id)
            got = receiver.receive(transfer_id)
            assert (
                got.checksums == sent.checksums and len(sent.checksums) == sender.layout.num_buckets
            )
            _assert_bitwise(dict(receiver.staged_tensors()), tensors)
        assert receiver.staging().data_ptr() == receiver.staging().data_ptr()
    finally:
        sender.finalize()
        receiver.finalize()


def test_shm_receiver_catches_a_corrupted_bucket():
    sender, receiver = _shm_pair()
    try:
        sender.send(_tensors().items(), transfer_id=1)
        lo, _ = sender.layout.bucket_range(2)
        receiver.staging()[lo + 5] ^= 0x10  # the shared region, as a stray write would
        with pytest.raises(ChecksumMismatchError, match="bucket 2 of"):
            receiver.receive(1)
    finally:
        sender.finalize()
        receiver.finalize()


def _grouped_push(sender, receiver, transfer_id: int):
    """A push whose stamps go out in groups and whose receiver checks every bucket at the end
    (what ``cuda_ipc`` does on a GPU), with the receiver polling while the sender packs."""
    sender.publish_bytes = 2 * BUCKET_BYTES
    receiver.defer_verify = True
    outcome: dict[str, Any] = {}

    def receive() -> None:
        try:
            outcome["report"] = receiver.receive(transfer_id)
        except Exception as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=receive)
    thread.start()
    sent = sender.send(_tensors().items(), transfer_id)
    thread.join(30)
    return sent, outcome


def test_grouped_stamps_and_deferred_verification_stage_bitwise_and_catch_corruption():
    sender, receiver = _shm_pair()
    try:
        assert sender.layout.num_buckets == 4  # two groups of two
        sent, outcome = _grouped_push(sender, receiver, 1)
        assert "error" not in outcome
        assert outcome["report"].checksums == sent.checksums
        assert len(sent.checksums) == sender.layout.num_buckets
        _assert_bitwise(dict(receiver.staged_tensors()), _tensors())
        corrupt_next_send(sender, 2)
        _, outcome = _grouped_push(sender, receiver, 2)
        assert isinstance(outcome["error"], ChecksumMismatchError)
        assert "bucket 2 of" in str(outcome["error"])
    finally:
        sender.finalize()
        receiver.finalize()


def test_shm_receiver_gives_up_at_the_deadline_naming_the_sender():
    sender, receiver = _shm_pair(timeout_s=0.5)
    try:
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"bucket 0 of .* trainer rank 0 \(sender\)"):
            receiver.receive(7)  # nobody sends transfer 7
        assert time.monotonic() - start < 2.0
    finally:
        sender.finalize()
        receiver.finalize()


def _run_ranks(jobs: list[Callable[[], Any]], join_s: float = 30.0) -> list[Any]:
    """Run one job per thread; results (or the exception raised) in job order."""
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except Exception as exc:  # handed to the test to assert on
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(join_s)
    assert not any(t.is_alive() for t in threads), "a rank hung past the test's own deadline"
    return results


def _gloo_ranks(num_receivers: int = 2, timeout_s: float = 10.0):
    plan = _plan("gloo", num_receivers=num_receivers, timeout_s=timeout_s)
    ends = [
        make_checkpoint_engine(plan, rank=r, device=torch.device("cpu"))
        for r in range(num_receivers + 1)
    ]
    info = ends[0].prepare()
    for end in ends[1:]:
        end.prepare()
    _run_ranks([lambda end=end: end.init(info) for end in ends])
    return ends


def test_gloo_broadcast_stages_every_tensor_bitwise_on_every_receiver_twice():
    ends = _gloo_ranks()
    try:
        for transfer_id in (1, 2):
            tensors = _scaled(_tensors(), float(transfer_id))
            jobs = [lambda t=tensors, i=transfer_id: ends[0].send(t.items(), i)]
            jobs += [lambda end=end, i=transfer_id: end.receive(i) for end in ends[1:]]
            sent, *received = _run_ranks(jobs)
            for report in received:
                assert not isinstance(report, Exception), report
                assert report.checksums == sent.checksums
            for end in ends[1:]:
                _assert_bitwise(dict(end.staged_tensors()), tensors)
    finally:
        for end in ends:
            end.finalize()


def test_gloo_receivers_catch_a_bucket_corrupted_after_its_checksum():
    ends = _gloo_ranks(num_receivers=1)
    try:
        corrupt_next_send(ends[0], 1)
        jobs = [lambda: ends[0].send(_tensors().items(), 1), lambda: ends[1].receive(1)]
        _, received = _run_ranks(jobs)
        assert isinstance(received, ChecksumMismatchError), received
        assert "bucket 1 of" in str(received) and received.phase == "transfer"
    finally:
        for end in ends:
            end.finalize()


def test_gloo_receiver_fails_within_the_deadline_when_the_sender_never_sends():
    ends = _gloo_ranks(num_receivers=1, timeout_s=1.0)
    try:
        start = time.monotonic()
        (error,) = _run_ranks([lambda: ends[1].receive(1)])
        assert isinstance(error, WeightSyncError), error
        assert "trainer rank 0 (sender)" in str(error) and "header" in str(error)
        assert time.monotonic() - start < 4.0
    finally:
        for end in ends:
            end.finalize()


def test_the_weight_group_listens_on_the_node_address_only_under_a_secret(monkeypatch):
    """The sender's store answers on the node's own address (127.0.0.2 here, a loopback
    address that is not 127.0.0.1), not on every interface, and a receiver joins the group
    only under the secret handed to it: one with a wrong secret never completes the
    rendezvous."""
    import socket

    import recipe.checkpoint_engine.broadcast as broadcast

    monkeypatch.setattr(broadcast, "node_ip", lambda: "127.0.0.2")
    plan = _plan("gloo", num_receivers=1, timeout_s=1.0)
    ends = [make_checkpoint_engine(plan, rank=r, device=torch.device("cpu")) for r in (0, 1)]
    try:
        info = ends[0].prepare()
        assert info["host"] == "127.0.0.2" and len(info["secret"]) == 32
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", info["port"]), timeout=2).close()
        socket.create_connection(("127.0.0.2", info["port"]), timeout=2).close()
        other = make_checkpoint_engine(plan, rank=0, device=torch.device("cpu"))
        try:
            assert other.prepare()["secret"] != info["secret"]  # one secret per group
        finally:
            other.finalize()
        ends[1].prepare()
        forged = dict(info, secret="0" * 32)
        results = _run_ranks([lambda: ends[0].init(info), lambda: ends[1].init(forged)])
        assert all(isinstance(r, Exception) for r in results), results
    finally:
        for end in ends:
            end.finalize()


def test_receiver_loads_only_a_verified_push_and_only_once():
    sender, _ = _shm_pair()
    loaded: list[dict[str, torch.Tensor]] = []

    def load(tensors) -> int:
        loaded.append({n: t.clone() for n, t in tensors})
        return len(loaded[-1])

    receiver = WeightReceiver(load, torch.device("cpu"))
    try:
        plan = sender.plan.to_wire()
        info = {"path": sender._path, "ipc": None, "device_uuid": None}
        assert receiver.connect(plan, [[0, 1]], info) == 1
        with pytest.raises(WeightSyncError, match="no verified push 1"):
            receiver.load(1)
        sender.send(_tensors().items(), 1)
        assert receiver.receive(1)["transfer_id"] == 1
        assert receiver.load(1)["num_tensors"] == len(_tensors())
        _assert_bitwise(loaded[0], _tensors())
        with pytest.raises(WeightSyncError, match="no verified push 1"):
            receiver.load(1)
    finally:
        receiver.close()
        sender.finalize()


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_push_across_processes_is_bitwise_exact_for_mixed_dtypes_and_two_receivers(backend):
    import argparse

    from recipe.tools.bench.weight_sync import run_backend, synthetic_metadata

    meta = synthetic_metadata("2M", "bfloat16")  # bf16 weights, fp32 norms, 1.5 MB embedding
    args = argparse.Namespace(
        device="cpu",
        bucket_mb=1,
        receivers=2,
        repeats=1,
        timeout_s=60.0,
        no_verify=False,
        threads=1,
    )
    result = run_backend(backend, meta, args)
    assert result["bitwise_equal"] == 1.0 and result["verify_s"] > 0


def test_verification_opt_out_skips_checksums_on_both_sides():
    plan = _plan("shm")
    plan.verify = False
    sender = make_checkpoint_engine(plan, rank=0, device=torch.device("cpu"))
    receiver = make_checkpoint_engine(plan, rank=1, device=torch.device("cpu"))
    try:
        receiver.init(sender.prepare())
        sent = sender.send(_tensors().items(), 1)
        receiver.staging()[5] ^= 0x10  # not caught: nobody checks
        got = receiver.receive(1)
        assert sent.checksums == got.checksums == [] and got.verify_s == 0.0
    finally:
        sender.finalize()
        receiver.finalize()


def test_phase_error_keeps_the_peers_error_type_and_names_both_peers():
    from recipe.checkpoint_engine.phases import _phase_error

    class RayLikeError(Exception):
        def __init__(self, cause: BaseException):
            super().__init__("wrapped")
            self.cause = cause

    inner = ChecksumMismatchError("transfer", "receiver rank 2", "bucket 4 of 9 differs")
    error = _phase_error("transfer", "rollout replica 1", RayLikeError(inner), ["trainer rank 0"])
    assert isinstance(error, ChecksumMismatchError) and error.phase == "transfer"
    assert str(error) == (
        "weight sync phase 'transfer' failed at rollout replica 1 / receiver rank 2: "
        "bucket 4 of 9 differs (still busy: trainer rank 0)"
    )
    plain = _phase_error("pause", "rollout replica 0", RuntimeError("boom\nengine dead"), [])
    assert str(plain) == "weight sync phase 'pause' failed at rollout replica 0: engine dead"
