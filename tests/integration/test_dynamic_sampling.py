"""DAPO's dynamic sampling end to end in every mode: real Ray, the tiny model, and a user's
reward file under which half the prompts (even answers) give every response the same reward.
The engines are the ``hf`` backend (transformers in the rollout workers), which starts in
seconds: what is tested is the recipes' bookkeeping, not the engine. Each step must train
its full batch of groups that all carry a signal, the filtered prompts are counted and
recorded, none of them is trained, and every prompt handed out is accounted for
(fully_async: within the staleness bound)."""

from __future__ import annotations

from typing import Any

import pytest

from recipe.algo.dynamic_sampling import has_signal
from recipe.checkpoint import read_ledger
from tests.helpers import rewards
from tests.helpers.runs import assert_ledger_balances, build_recipe

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

COMMON = {
    "logger.quiet": True,
    "rollout.n": 4,
    "reward.custom_fn": f"{rewards.PATH}:half_flat",
    "algorithm.filter_groups.enable": True,
    "trainer.test_freq": 0,
    "trainer.val_before_train": False,
    "data.num_val_prompts": 8,
    "rollout.backend": "hf",
    "rollout.response_length": 16,
}
MODES = {
    "sync": {"mode": "sync", "data.train_batch_size": 8, "actor.ppo_mini_batch_size": 8},
    "one_step_off": {
        "mode": "one_step_off",
        "data.train_batch_size": 8,
        "actor.ppo_mini_batch_size": 8,
    },
    "fully_async": {
        "mode": "fully_async",
        "actor.ppo_mini_batch_size": 4,
        "async_training.require_batches": 1,
        "async_training.trigger_parameter_sync_step": 2,
        "async_training.staleness_threshold": 0.5,
    },
}
NUM_STEPS = 2  # one_step_off: batch 0 filled at the top, batch 1 before the push


def _spy_on_batches(trainer: Any) -> list[list[list]]:
    """The groups of every batch the trainer builds (after dynamic sampling)."""
    seen: list[list[list]] = []
    make_batch = trainer.ppo.make_batch

    def recording(groups):
        seen.append([list(g) for g in groups])
        return make_batch(groups)

    trainer.ppo.make_batch = recording
    return seen


# Nightly, every mode: the streaming path's filter (flat groups replaced, recorded, never
# trained, the ledger balanced) is checked on every CI run in-process by
# tests/unit/test_fully_async_trainer.py, and the filter itself by
# tests/unit/test_dynamic_sampling.py.
@pytest.mark.nightly
@pytest.mark.parametrize("mode", list(MODES))
def test_filtered_groups_are_replaced_recorded_and_never_trained(tiny_model_path, tmp_path, mode):
    overrides = COMMON | MODES[mode] | {"trainer.total_training_steps": NUM_STEPS}
    recipe = build_recipe(tmp_path / "run", {"mode": overrides.pop("mode")}, overrides)
    trainer = recipe.trainer if mode == "fully_async" else recipe
    per_step = trainer.cfg.prompts_per_step
    seen = _spy_on_batches(trainer)
    try:
        summary = recipe.fit()
    finally:
        recipe.close()
    assert len(seen) == NUM_STEPS
    for groups in seen:
        assert len(groups) == per_step
        assert all(has_signal(g, "score") for g in groups)
    trained = {g[0].prompt_uid for groups in seen for g in groups}
    assert summary["prompts/filtered"] > 0 and summary["prompts/trained"] == len(trained)
    if mode == "fully_async":
        ledger = recipe.ledger
        assert_ledger_balances(ledger)
        assert len(ledger["filtered"]) == summary["prompts/filtered"]
        assert not set(ledger["filtered"]) & trained
        assert summary["staleness/max"] <= summary["staleness/bound"]
        return
    lines = read_ledger(tmp_path / "run")
    filtered = [uid for line in lines for uid in line.get("filtered", [])]
    assert len(filtered) == len(set(filtered)) == summary["prompts/filtered"]
    assert not set(filtered) & trained
    assert summary["prompts/admitted"] == len(trained) + len(filtered)
