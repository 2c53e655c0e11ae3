"""Config schema of the RL algorithm (``algorithm.*``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from recipe.algo.correction import IS_LEVELS, RS_LEVELS
from recipe.algo.registry import ADV_ESTIMATOR, POLICY_LOSS
from recipe.utils.config_check import require, require_choice, require_positive

logger = logging.getLogger(__name__)


@dataclass
class RolloutCorrectionConfig:
    """Off-policy correction between the trainer's proximal policy and the rollout policy
    (``recipe.algo.correction``); verl's key names."""

    bypass_mode: bool = True
    """True (the default): PPO's old policy is the rollout log-probs, so its clip keeps each
    update near the policy that sampled. False (decoupled PPO): old log-probs come from the
    trainer (the CPU-saved pushed version in the async modes) and importance weights correct
    for the rollout policy. The default follows the staleness study (docs/results.md): on the
    tiny task bypass ended at or above decoupled at every staleness threshold from 0.5 to 4,
    and on SmolLM2-135M they were level; both cost the same (the trainer's forward over the
    batch runs in both modes, to measure the mismatch)."""
    rollout_is: str | None = "auto"
    """Truncated importance weights pi_proximal / pi_rollout: ``token``, ``sequence``, or
    ``none`` (also null). ``auto``: ``token`` in decoupled mode, ``none`` in bypass mode (there
    PPO's ratio is already taken against the rollout policy; weights would count it twice)."""
    rollout_is_threshold: float = 2.0
    """Upper bound of an importance weight (TIS)."""
    rollout_rs: str | None = "none"
    """Rejection (masked IS): ``token`` masks tokens whose ratio leaves the band (with
    ``rollout_is=token``: IcePop), ``sequence`` whole sequences by their product ratio,
    ``geometric`` by their geometric-mean ratio; ``none`` (also null) rejects nothing. Works
    in both modes: bypass mode takes the proximal log-probs from the trainer's forward that
    measures the mismatch."""
    rollout_rs_threshold: float | None = None
    """Upper end of the accepted ratio band; None: ``rollout_is_threshold``."""
    rollout_rs_threshold_lower: float | None = None
    """Lower end of the band; None: 1 / the upper end."""

    def __post_init__(self) -> None:
        key = "algorithm.rollout_correction"
        self.rollout_is = "none" if self.rollout_is is None else self.rollout_is
        self.rollout_rs = "none" if self.rollout_rs is None else self.rollout_rs
        require_choice(f"{key}.rollout_is", self.rollout_is, ("auto", "none", *IS_LEVELS))
        require_choice(f"{key}.rollout_rs", self.rollout_rs, ("none", *RS_LEVELS))
        require_positive(f"{key}.rollout_is_threshold", self.rollout_is_threshold)
        if self.rollout_rs_threshold is not None:
            require_positive(f"{key}.rollout_rs_threshold", self.rollout_rs_threshold)
        low, high = self.rs_band
        require(
            0 <= low < high,
            f"{key}.rollout_rs_threshold_lower",
            self.rollout_rs_threshold_lower,
            f"a number in [0, {high:g}) (below rollout_rs_threshold)",
        )
        if self.bypass_mode and self.rollout_is in IS_LEVELS:
            logger.warning(
                "%s.rollout_is=%r has no effect with bypass_mode=true: PPO's ratio is already "
                "taken against the rollout policy; set bypass_mode=false for decoupled PPO "
                "with importance weights",
                key,
                self.rollout_is,
            )

    @property
    def is_level(self) -> str | None:
        """The importance-weight level in effect (None: no weights)."""
        if self.bypass_mode or self.rollout_is == "none":
            return None
        return "token" if self.rollout_is == "auto" else self.rollout_is

    @property
    def rs_level(self) -> str | None:
        """The rejection level in effect (None: nothing rejected)."""
        return None if self.rollout_rs == "none" else self.rollout_rs

    @property
    def rs_band(self) -> tuple[float, float]:
        """(low, high) accepted ratios of rejection."""
        high = self.rollout_rs_threshold or self.rollout_is_threshold
        low = (
            1.0 / high
            if self.rollout_rs_threshold_lower is None
            else self.rollout_rs_threshold_lower
        )
        return low, high


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: groups whose responses all score alike carry no GRPO signal
    (every advantage is 0); they are filtered out, counted and recorded, and more prompts are
    generated in their place (``recipe.algo.dynamic_sampling``)."""

    enable: bool = False
    """Filter groups whose ``metric`` has zero variance and generate more in their place."""
    metric: str = "score"
    """``score`` (the reward), or a key the reward function returns beside it (``acc``)."""
    max_num_gen_batches: int = 10
    """Generation rounds per trainer step (sync, one_step_off) or per version window
    (fully_async, counted in windows' worth of prompts) before the run stops with one line
    saying that too many groups were filtered; 0: no limit."""

    def __post_init__(self) -> None:
        require(bool(self.metric), "algorithm.filter_groups.metric", self.metric, "a reward key")
        require(
            self.max_num_gen_batches >= 0,
            "algorithm.filter_groups.max_num_gen_batches",
            self.max_num_gen_batches,
            ">= 0 (0: no limit)",
        )


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Advantage estimator over each prompt's group of ``rollout.n`` responses: ``grpo`` or
    ``rloo`` (the registry, ``recipe.algo.registry``), or ``path/to/file.py:function``."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's reward std (Dr.GRPO sets this False)."""
    policy_loss: str = "ppo"
    """``ppo`` (clip), ``gspo`` (sequence-level ratio, ``recipe.algo.policy_loss``) or
    ``cispo`` (clipped, stop-gradient importance weight on every token), the registry's
    (``recipe.algo.registry``); or ``path/to/file.py:function`` (or ``package.module:function``)
    taking one ``PolicyLossInputs``."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """How the trainer's old policy relates to the rollout policy."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling (zero-variance groups filtered and replaced)."""

    def __post_init__(self) -> None:
        ADV_ESTIMATOR.check(self.adv_estimator)
        POLICY_LOSS.check(self.policy_loss)
