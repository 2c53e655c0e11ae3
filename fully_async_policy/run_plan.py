"""``RunPlan``: the numbers a fully async run derives from its config, computed once.

``rollout.total_rollout_steps`` counts prompts (None: ``trainer.total_epochs`` passes over the
train set); the trainer trains R of them per local step and pushes weights every T local
steps, so the run has ``total_prompts // R`` trainer steps and one weights version per T of
them (plus one for a last, shorter window).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from fully_async_policy.admission import window_budget
from recipe.config import RecipeConfig
from recipe.utils.config_check import ConfigError

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class RunPlan:
    """Derived sizes of a fully async run (prompts unless a name says otherwise)."""

    prompts_per_step: int
    """R = actor.ppo_mini_batch_size * async_training.require_batches."""
    steps_per_sync: int
    """T = async_training.trigger_parameter_sync_step (local steps per version window)."""
    total_steps: int
    """Trainer steps of the run."""
    budget: int
    """B = floor((1 + staleness_threshold) * T * R): prompts admitted per version window
    (minus those carried over); also the message queue's capacity."""

    @property
    def total_prompts(self) -> int:
        """Fresh prompts the run trains on (and the most the rollouter admits)."""
        return self.total_steps * self.prompts_per_step

    @property
    def window_demand(self) -> int:
        """W = T * R prompts trained per version window."""
        return self.steps_per_sync * self.prompts_per_step

    @property
    def num_versions(self) -> int:
        """Weight pushes of the run (a last, shorter window is pushed too)."""
        return math.ceil(self.total_steps / self.steps_per_sync)

    @property
    def staleness_bound(self) -> int:
        """Max trainer version minus a trained sample's oldest token version
        (see fully_async_policy/admission.py for the proof)."""
        return (self.budget - 1) // self.window_demand


def plan_run(cfg: RecipeConfig, num_train_prompts: int) -> RunPlan:
    """The plan of ``cfg`` on a train set of ``num_train_prompts``; logs it at startup."""
    if cfg.mode != "fully_async":
        raise ConfigError(f"mode={cfg.mode!r} is invalid here: allowed 'fully_async'")
    asy = cfg.async_training
    per_step = cfg.prompts_per_step
    steps = cfg.num_trainer_steps(num_train_prompts)
    plan = RunPlan(
        prompts_per_step=per_step,
        steps_per_sync=asy.trigger_parameter_sync_step,
        total_steps=steps,
        budget=window_budget(per_step, asy.trigger_parameter_sync_step, asy.staleness_threshold),
    )
    logger.info(
        "mode=fully_async: %d prompts -> %d trainer steps x %d prompts x %d responses, "
        "%d weight versions (push every %d steps); admission %d prompts per window, "
        "staleness <= %d",
        plan.total_prompts,
        plan.total_steps,
        per_step,
        cfg.rollout.n,
        plan.num_versions,
        plan.steps_per_sync,
        plan.budget,
        plan.staleness_bound,
    )
    return plan
