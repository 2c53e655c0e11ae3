"""Config schema of the RL algorithm (``algorithm.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recipe.utils.config_check import require_choice, require_positive

ADV_ESTIMATORS = ("grpo", "rloo")


@dataclass
class RolloutCorrectionConfig:
    bypass_mode: bool = True
    """True: PPO's old policy is the rollout log-probs. False (decoupled PPO): old log-probs
    come from the trainer (the CPU-saved pushed version in async modes) and truncated
    importance sampling corrects for the rollout policy."""
    tis_cap: float = 2.0
    """Upper bound of the truncated importance weight pi_old / pi_rollout (decoupled mode)."""

    def __post_init__(self) -> None:
        require_positive("algorithm.rollout_correction.tis_cap", self.tis_cap)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Advantage estimator over each prompt's group of ``rollout.n`` responses."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's reward std (Dr.GRPO sets this False)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """How the trainer's old policy relates to the rollout policy."""

    def __post_init__(self) -> None:
        require_choice("algorithm.adv_estimator", self.adv_estimator, ADV_ESTIMATORS)
