"""Build a recipe in-process from a preset, and read what its run directory holds.

The in-process integration tests build a recipe object (not ``python -m recipe``) so they can
wrap its steps and look at its state; these are the pieces every such module repeated.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from recipe.checkpoint import read_ledger
from recipe.config import load_config
from recipe.main import recipe_class


def build_recipe(run_dir: Path, preset: dict[str, Any], overrides: dict[str, Any]) -> Any:
    """The recipe of ``preset["mode"]`` writing to ``run_dir``: ``preset`` is a nested dict,
    ``overrides`` dotted keys on top of it (new keys allowed, as Hydra's ``+key=``).

    ``load_config`` does not compose the presets in ``configs/``: ``preset`` spells out the
    mode preset a test relies on."""
    cfg = OmegaConf.create(preset)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    recipe_cfg = load_config(cfg)
    return recipe_class(recipe_cfg.mode)(recipe_cfg, run_dir)


def agent_preset(ppo_mini_batch_size: int, **actor: Any) -> dict[str, Any]:
    """The fully_async preset of the agent runs: a sync every step, one batch per step,
    partial rollouts, staleness 0.5 (so episodes span syncs); ``actor`` keys on top."""
    return {
        "mode": "fully_async",
        "actor": {"ppo_mini_batch_size": ppo_mini_batch_size, **actor},
        "async_training": {
            "staleness_threshold": 0.5,
            "trigger_parameter_sync_step": 1,
            "require_batches": 1,
            "partial_rollout": True,
        },
        "logger": {"quiet": True},
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run: one record per step (step 0: the initial validation)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def spy_on_groups(recipe: Any) -> list[tuple[int, list]]:
    """(trainer version, groups) of every step of a fully async recipe, recorded as its
    trainer takes them; the list fills while ``recipe.fit()`` runs."""
    seen: list[tuple[int, list]] = []
    trainer = recipe.trainer
    take = trainer.feed.take

    def recording(num_groups: int, version: int) -> list:
        groups = take(num_groups, version)
        seen.append((trainer.version, groups))
        return groups

    trainer.feed.take = recording
    return seen


def assert_ledger_balances(ledger: dict[str, list[str]]) -> None:
    """Every admitted prompt was trained exactly once, filtered, or is still in flight."""
    assert len(set(ledger["trained"])) == len(ledger["trained"])
    accounted = Counter(ledger["trained"]) + Counter(ledger["in_flight"])
    assert Counter(ledger["admitted"]) == accounted + Counter(ledger.get("filtered", []))


def ledger_trained_once(run_dir: Path, num_steps: int) -> tuple[list[dict], list[str]]:
    """(the ledger of record, the uids it trained) of a finished run, after checking that it
    holds steps 1..``num_steps`` once each and that no prompt was trained twice."""
    ledger = read_ledger(run_dir)
    assert [r["step"] for r in ledger] == list(range(1, num_steps + 1))
    trained = [uid for r in ledger for uid in r["trained"]]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    return ledger, trained


def check_startup(summary: dict[str, Any]) -> dict[str, float]:
    """The run's start-up split (recipe/run/startup.py) in ``summary``: every phase, the
    ranks' and the engines' side by side counted once, a resume and an initial validation
    after them, the rest in ``other_s``. Returns the
    phases by name (without the ``startup/`` prefix)."""
    import pytest

    startup = {k.removeprefix("startup/"): v for k, v in summary.items() if "startup/" in k}
    assert {"inputs_s", "ray_s", "trainer_init_s", "engines_s", "first_push_s"} <= set(startup)
    assert all(seconds >= 0 for seconds in startup.values()), startup
    side_by_side = max(startup["trainer_init_s"], startup["engines_s"])
    later = ("initial_val_s", "resume_s")  # after both sides are up; each may be absent
    # fully_async starts Ray inside its input checks, beside the prompts' encoding
    ray_inside = summary.get("mode") == "fully_async"
    assert not ray_inside or startup["ray_s"] <= startup["inputs_s"]
    ray_serial = 0.0 if ray_inside else startup["ray_s"]
    serial = startup["inputs_s"] + ray_serial + sum(startup.get(k, 0.0) for k in later)
    assert startup["to_first_step_s"] >= serial + side_by_side
    assert startup["to_first_step_s"] == pytest.approx(serial + side_by_side + startup["other_s"])
    return startup
