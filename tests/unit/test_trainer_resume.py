"""A world-size-1 TrainerWorker (in-process, gloo) resumed from a checkpoint takes the same
next update as the worker that never stopped: weights (HF), AdamW moments, LR schedule and RNG
all come back. World size 2 is covered by tests/integration/test_resume.py."""

from __future__ import annotations

import dataclasses
import json
import random
import socket
from pathlib import Path

import pytest
import torch

from recipe.algo.advantages import grpo_advantages
from recipe.protocol import Trajectory
from recipe.workers.batch import TrainBatch
from recipe.workers.config import ActorConfig
from recipe.workers.trainer import TrainerSpec, TrainerWorker


def make_batch(model_dir: Path, *, seed: int, num_prompts: int = 3, n: int = 2) -> TrainBatch:
    """Random prompts and responses of varied lengths, rewards 1 for sample 0 else 0."""
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for p in range(num_prompts):
        prompt = torch.randint(0, vocab_size, (3 + p,), generator=gen).tolist()
        for i in range(n):
            resp = torch.randint(0, vocab_size, (2 + 2 * i + p,), generator=gen).tolist()
            trajs.append(
                Trajectory(
                    f"p{p}", i, prompt, resp, [0.0] * len(resp), [0] * len(resp), "stop",
                    reward=float(i == 0),
                )
            )  # fmt: skip
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=0)
    return batch.with_advantages(grpo_advantages(batch.rewards_b, batch.group_index_b))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tiny_model_path):
    return Path(tiny_model_path)


def _worker(model_dir: Path, port: int) -> TrainerWorker:
    # Cosine with warm-up over 6 optimizer steps: a scheduler restarted from step 0 would use
    # another learning rate at the resumed step.
    actor = ActorConfig(
        lr=1e-4,
        lr_schedule="cosine",
        lr_warmup_steps=2,
        ppo_mini_batch_size=3,
        ppo_micro_batch_size_per_gpu=6,
    )
    return TrainerWorker(
        actor, TrainerSpec(str(model_dir), total_optimizer_steps=6), master_port=port
    )


def _with_rollout_logprobs(worker: TrainerWorker, batch):
    return dataclasses.replace(batch, rollout_logprobs_bt=worker.compute_log_prob(batch)[0])


def test_resumed_worker_takes_the_same_next_update_as_the_uninterrupted_one(model_dir, tmp_path):
    first, second = make_batch(model_dir, seed=1), make_batch(model_dir, seed=2)
    port = _free_port()
    original = _worker(model_dir, port)  # owns the process group; the others join it
    try:
        original.update_actor(_with_rollout_logprobs(original, first))
        original.update_actor(_with_rollout_logprobs(original, first))
        ckpt = tmp_path / "step_2"
        original.save_hf(ckpt)
        original.save_train_state(ckpt / "run_state")
        rng_draw = (random.random(), torch.rand(3).tolist())
        metrics = original.update_actor(_with_rollout_logprobs(original, second))
        expected = original.full_state_dict()

        resumed = _worker(model_dir, port)
        resumed.load_hf(ckpt)
        resumed.load_train_state(ckpt / "run_state")
        assert (random.random(), torch.rand(3).tolist()) == rng_draw  # this rank's streams
        resumed_metrics = resumed.update_actor(_with_rollout_logprobs(resumed, second))
        got = resumed.full_state_dict()
        assert resumed_metrics["actor/lr"] == metrics["actor/lr"]
        assert all(torch.equal(got[k], expected[k]) for k in expected)

        # Control: the same weights with a fresh optimizer and schedule take another step, so
        # the equality above is the optimizer state's doing.
        weights_only = _worker(model_dir, port)
        weights_only.load_hf(ckpt)
        control_metrics = weights_only.update_actor(_with_rollout_logprobs(weights_only, second))
        control = weights_only.full_state_dict()
        assert control_metrics["actor/lr"] != metrics["actor/lr"]
        assert max((control[k] - expected[k]).abs().max().item() for k in expected) > 1e-6
    finally:
        original.close()
