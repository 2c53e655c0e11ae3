"""A world-size-1 TrainerWorker (in-process, gloo) resumed from a checkpoint takes the same
next update as the worker that never stopped: weights (HF), AdamW moments, LR schedule and RNG
all come back. World size 2 is covered by tests/integration/test_resume.py."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from recipe.workers.config import ActorConfig
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker
from tests.helpers.batches import random_train_batch


@pytest.fixture(scope="module")
def model_dir(tiny_model_path):
    return Path(tiny_model_path)


def _worker(model_dir: Path) -> TrainerWorker:
    # Cosine with warm-up over 6 optimizer steps: a scheduler restarted from step 0 would use
    # another learning rate at the resumed step.
    actor = ActorConfig(
        lr=1e-4,
        lr_schedule="cosine",
        lr_warmup_steps=2,
        ppo_mini_batch_size=3,
        ppo_micro_batch_size_per_gpu=6,
    )
    return TrainerWorker(actor, TrainerSpec(str(model_dir), total_optimizer_steps=6))


def _with_rollout_logprobs(worker: TrainerWorker, batch):
    return dataclasses.replace(batch, rollout_logprobs_bt=worker.compute_log_prob(batch)[0])


def test_resumed_worker_takes_the_same_next_update_as_the_uninterrupted_one(model_dir, tmp_path):
    first, second = random_train_batch(model_dir, seed=1), random_train_batch(model_dir, seed=2)
    original = _worker(model_dir)  # owns the process group; the others join it
    try:
        original.update_actor(_with_rollout_logprobs(original, first))
        original.update_actor(_with_rollout_logprobs(original, first))
        ckpt = tmp_path / "step_2"
        original.save_hf(ckpt)
        original.save_train_state(ckpt / "run_state")
        rng_draw = (random.random(), torch.rand(3).tolist())
        metrics = original.update_actor(_with_rollout_logprobs(original, second))
        expected = original.full_state_dict()

        resumed = _worker(model_dir)
        resumed.load_hf(ckpt)
        resumed.load_train_state(ckpt / "run_state")
        assert (random.random(), torch.rand(3).tolist()) == rng_draw  # this rank's streams
        resumed_metrics = resumed.update_actor(_with_rollout_logprobs(resumed, second))
        got = resumed.full_state_dict()
        assert resumed_metrics["actor/lr"] == metrics["actor/lr"]
        assert all(torch.equal(got[k], expected[k]) for k in expected)

        # Control: the same weights with a fresh optimizer and schedule take another step, so
        # the equality above is the optimizer state's doing.
        weights_only = _worker(model_dir)
        weights_only.load_hf(ckpt)
        control_metrics = weights_only.update_actor(_with_rollout_logprobs(weights_only, second))
        control = weights_only.full_state_dict()
        assert control_metrics["actor/lr"] != metrics["actor/lr"]
        assert max((control[k] - expected[k]).abs().max().item() for k in expected) > 1e-6
    finally:
        original.close()
