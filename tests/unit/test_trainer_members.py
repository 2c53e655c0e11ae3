"""Each trainer holds only members it uses: the batch recipes' engines, data, reward and cursor
live in ``BatchTrainer`` (recipe/batch_trainer.py), so the fully async trainer, whose
rollouter actor owns all of them, inherits none (recipe/separate_trainer.py)."""

from __future__ import annotations

from fully_async_policy.driver.trainer import FullyAsyncTrainer
from recipe.batch_trainer import BatchTrainer
from recipe.separate_trainer import SeparateRayPPOTrainer
from tests.helpers.fake_ranks import ScriptedRanks
from tests.helpers.in_process import fully_async_config, scripted_inputs

BATCH_ONLY = {
    "rollout",
    "_rollout",
    "inputs",
    "train_records",
    "val_records",
    "reward_fn",
    "prompt_ids",
    "cursor",
    "total_steps",
    "_start_engines",
    "_start_ranks_and_engines",
    "_plan_batch_steps",
    "_generate_scored",
    "_score",
    "_more",
    "_validate",
    "_restore_engines",
    "_resume",
}
"""What only a recipe with the engines in its own process uses."""


def test_the_fully_async_trainer_holds_none_of_the_batch_recipes_members(tmp_path):
    cfg = fully_async_config()
    trainer = FullyAsyncTrainer(cfg, tmp_path, inputs=scripted_inputs(cfg), ranks=ScriptedRanks())
    try:
        held = set(dir(trainer)) | set(vars(trainer))
        assert not held & BATCH_ONLY, sorted(held & BATCH_ONLY)
        assert trainer.ranks is not None  # what it does use is there
    finally:
        trainer.close(release_placement=False)


def test_the_batch_members_are_the_batch_layers_own():
    base = set(dir(SeparateRayPPOTrainer))
    assert not base & BATCH_ONLY, sorted(base & BATCH_ONLY)
    batch = set(dir(BatchTrainer))
    assert {"rollout", "_generate_scored", "_more", "_validate", "_resume"} <= batch
