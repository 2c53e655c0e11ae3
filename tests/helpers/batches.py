"""Random trajectories and TrainBatches for tests that drive a trainer worker or group.

Prompt ``p`` has ``3 + p`` random tokens; its sample ``i`` has ``2 + 2 * i + p`` response tokens,
so rows differ in length and padding is exercised. Sample 0 of every group is rewarded 1.0 and
the others 0.0, so every group has a non-zero GRPO advantage.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from recipe.algo.advantages import grpo_advantages
from recipe.protocol import Trajectory
from recipe.workers.trainer.batch import TrainBatch


def random_trajectories(
    vocab_size: int, *, num_prompts: int = 3, n: int = 2, seed: int = 0
) -> list[Trajectory]:
    """``num_prompts`` groups of ``n`` trajectories; rollout log-probs ``-0.1 * (k + 1)`` at
    response token ``k`` (distinct values, so a misaligned copy shows)."""
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for p in range(num_prompts):
        prompt = torch.randint(0, vocab_size, (3 + p,), generator=gen).tolist()
        for i in range(n):
            resp = torch.randint(0, vocab_size, (2 + 2 * i + p,), generator=gen).tolist()
            trajs.append(
                Trajectory(
                    prompt_uid=f"p{p}",
                    sample_index=i,
                    prompt_ids=prompt,
                    response_ids=resp,
                    rollout_logprobs=[-0.1 * (k + 1) for k in range(len(resp))],
                    token_versions=[0] * len(resp),
                    finish_reason="stop",
                    reward=float(i == 0),
                )
            )
    return trajs


def random_train_batch(
    model_dir: Path, *, num_prompts: int = 3, n: int = 2, seed: int = 0
) -> TrainBatch:
    """``random_trajectories`` over the vocabulary of the model in ``model_dir``, packed with
    pad id 0 and given GRPO advantages."""
    vocab_size = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    trajs = random_trajectories(vocab_size, num_prompts=num_prompts, n=n, seed=seed)
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=0)
    return batch.with_advantages(grpo_advantages(batch.rewards_b, batch.group_index_b))
