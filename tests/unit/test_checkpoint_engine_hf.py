"""The rollout-worker side of a push on ``HFRolloutWorker`` (in-process, tiny model): the
receiver lives beside the model, commits only a verified push while PAUSED, and a corrupted
push leaves the served weights and version untouched."""

from __future__ import annotations

import asyncio

import pytest
import torch

from recipe.checkpoint_engine.base import (
    ChecksumMismatchError,
    TransferPlan,
    WeightSyncError,
)
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.layout import PAGE_BYTES, BucketLayout
from recipe.faults import DivergedPolicyError
from recipe.model import ModelConfig
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.hf_worker import HFRolloutWorker
from recipe.workers.rollout.requests import GenerationRequest
from tests.helpers.weight_faults import corrupt_next_send


def _push_source(worker: HFRolloutWorker, seed: int) -> dict[str, torch.Tensor]:
    """The worker's weights plus noise, tied head left out (as the trainer yields them)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: (t + torch.randn(t.shape, generator=gen)).contiguous()
        for name, t in worker._model.state_dict().items()
        if name != "lm_head.weight"
    }


def _served(worker: HFRolloutWorker) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in worker._model.state_dict().items()}


def test_hf_worker_stages_while_running_commits_only_paused_and_refuses_a_corrupted_push(
    tiny_model_path,
):
    worker = HFRolloutWorker(ModelConfig(path=str(tiny_model_path)), RolloutConfig(backend="hf"))
    first, second = _push_source(worker, 1), _push_source(worker, 2)
    meta = [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in first.items()]
    layout = BucketLayout.build(meta, 4 * PAGE_BYTES)  # the embedding spans many buckets
    plan = TransferPlan("shm", layout, num_receivers=1, timeout_s=5.0)
    sender = make_checkpoint_engine(plan, rank=0, device=torch.device("cpu"))

    async def scenario() -> None:
        info = sender.prepare()
        assert await worker.weight_receiver_call("connect", plan.to_wire(), [[0, 1]], info) == [1]
        before = _served(worker)
        sender.send(first.items(), 1)
        (report,) = await worker.weight_receiver_call("receive", 1)  # staged while running
        assert len(report["checksums"]) == layout.num_buckets
        with pytest.raises(RuntimeError, match="only while paused"):
            await worker.commit_weights(1, 1)
        assert worker.version == 0
        assert all(torch.equal(t, before[n]) for n, t in _served(worker).items())
        await worker.pause()
        await worker.commit_weights(1, 1)
        assert worker.version == 1 and worker.is_paused()
        served = _served(worker)
        for name, tensor in first.items():
            assert torch.equal(served[name], tensor), name
        assert torch.equal(served["lm_head.weight"], first["model.embed_tokens.weight"])

        corrupt_next_send(sender, 2)
        sender.send(second.items(), 2)
        with pytest.raises(ChecksumMismatchError, match="bucket 2 of"):
            await worker.weight_receiver_call("receive", 2)
        with pytest.raises(WeightSyncError, match="no verified push 2"):
            await worker.commit_weights(2, 2)
        assert worker.version == 1
        after = _served(worker)
        assert all(torch.equal(after[n], served[n]) for n in served)
        await worker.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        sender.finalize()


def test_hf_worker_refuses_choices_it_cannot_keep_to(tiny_model_path):
    worker = HFRolloutWorker(ModelConfig(path=str(tiny_model_path)), RolloutConfig(backend="hf"))
    request = GenerationRequest("judge-0", [5, 6, 7], n=1, max_tokens=4, choices=["Score: 1"])
    with pytest.raises(ValueError, match=r"HFRolloutWorker cannot \(rollout\.backend=vllm can\)"):
        asyncio.run(worker.generate(request))


def test_hf_worker_names_weights_it_cannot_sample_from_as_a_diverged_policy(tiny_model_path):
    """Weights that overflowed (inf/NaN) make every next-token distribution non-finite: the
    HF sampler cannot draw a token, and the worker says why in a typed error that the run
    turns into one line (``fails_cleanly``), not a sampler traceback."""
    worker = HFRolloutWorker(ModelConfig(path=str(tiny_model_path)), RolloutConfig(backend="hf"))
    with torch.no_grad():
        for param in worker._model.parameters():
            param.fill_(float("inf"))
    request = GenerationRequest("g-0", [5, 6, 7], n=2, max_tokens=4, temperature=1.0)
    with pytest.raises(DivergedPolicyError, match=r"weights of version 0 give non-finite"):
        asyncio.run(worker.generate(request))
