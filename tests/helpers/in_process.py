"""The small fully async run the in-process tests share: its config and its inputs.

    fully_async_config(**overrides)   64 prompts, R=4, n=4, T=2, 2 replicas, 12-token
                                      responses, partial rollout; deadlines of seconds, so a
                                      loop that stalls fails its test instead of hanging it
    scripted_inputs(cfg, ...)         RunInputs without a model: prompt i is token ids
                                      [i + 1, 5, 7] (what ScriptedWorker answers from)

Used by tests/unit/test_rollouter_loop.py and tests/unit/test_fully_async_trainer.py.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from recipe.config import RecipeConfig, load_config
from recipe.protocol import PromptRecord
from recipe.reward import RewardFunction
from recipe.run.inputs import RunInputs
from tests.helpers import rewards

PRESET = {
    "mode": "fully_async",
    "actor": {"ppo_mini_batch_size": 4},
    "rollout": {"n": 4, "response_length": 12, "num_replicas": 2, "generation_timeout_s": 15},
    "checkpoint_engine": {"timeout_s": 15},
    "async_training": {
        "staleness_threshold": 0.5,
        "trigger_parameter_sync_step": 2,
        "require_batches": 1,
        "partial_rollout": True,
    },
    "trainer": {"total_training_steps": 8, "test_freq": 0, "val_before_train": False},
    "reward": {"custom_fn": f"{rewards.PATH}:half_flat"},
    "logger": {"quiet": True},
}
NUM_PROMPTS = 64


def fully_async_config(**overrides: Any) -> RecipeConfig:
    """``PRESET`` with dotted-key ``overrides``, checked as a run's config is."""
    cfg = OmegaConf.create(PRESET)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return load_config(cfg)


def scripted_inputs(
    cfg: RecipeConfig, *, answer: Callable[[int], int] = lambda i: 2 * i + 1, val: int = 0
) -> RunInputs:
    """``NUM_PROMPTS`` train prompts whose reference answer is ``answer(i)`` (odd by default:
    ``half_flat`` then varies within every group), and ``val`` val prompts."""
    source = "openai/gsm8k"
    records = [
        PromptRecord(f"p{i:03d}", f"prompt {i}", str(answer(i)), source) for i in range(NUM_PROMPTS)
    ]
    val_records = [PromptRecord(f"v{i:02d}", f"question {i}", str(i), source) for i in range(val)]
    everything = records + val_records
    return RunInputs(
        train_records=records,
        val_records=val_records,
        reward_fn=RewardFunction(cfg.reward, cfg.rollout.response_length),
        prompt_ids={r.uid: [i + 1, 5, 7] for i, r in enumerate(everything)},
        model=SimpleNamespace(pad_token_id=0),  # type: ignore[arg-type]
    )
