"""Outcome-reward advantage estimators over GRPO groups.

Every estimator maps one scalar reward per response and the group each response belongs to
(``rollout.n`` responses of one prompt share a group) to one advantage per response. The
trainer broadcasts it over the response tokens. Estimators are looked up by
``algorithm.adv_estimator`` in the registry (recipe/algo/registry.py), which calls each with
one ``AdvantageInputs``.

Both estimators work on a flat batch with arbitrary group order, so the caller never has to
sort or reshape by group; a group of one response has no baseline and gets advantage 0.

An episode of several linear segments (``Trajectory.segments``) is several rows of one group;
``share_episode_advantages`` gives each of them the episode's advantage, computed on the
episode's one counted row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recipe.algo.config import AlgorithmConfig
from recipe.algo.registry import ADV_ESTIMATOR


@dataclass(frozen=True, slots=True)
class AdvantageInputs:
    """What an advantage estimator is given: one reward per row and its group."""

    rewards_b: torch.Tensor
    group_index_b: torch.Tensor
    """Rows of one prompt's ``rollout.n`` responses share an index."""
    config: AlgorithmConfig
    """``algorithm.*`` (e.g. ``norm_adv_by_std_in_grpo``)."""
    counted_b: torch.Tensor | None = None
    """Rows in the group statistics (None: all); the others get advantage 0."""


def _group_sums(
    values_b: torch.Tensor, group_index_b: torch.Tensor, counted_b: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row group size and group sum of ``values_b`` over the group's counted rows (all
    when ``counted_b`` is None), both (B,)."""
    _, inverse_b = torch.unique(group_index_b, return_inverse=True)
    num_groups = int(inverse_b.max().item()) + 1 if inverse_b.numel() else 0
    weight_b = torch.ones_like(values_b) if counted_b is None else counted_b.to(values_b.dtype)
    counts_g = torch.zeros(num_groups, dtype=values_b.dtype, device=values_b.device).index_add_(
        0, inverse_b, weight_b
    )
    sums_g = torch.zeros(num_groups, dtype=values_b.dtype, device=values_b.device).index_add_(
        0, inverse_b, values_b * weight_b
    )
    return counts_g[inverse_b], sums_g[inverse_b]


def _only_counted(adv_b: torch.Tensor, counts_b: torch.Tensor, counted_b) -> torch.Tensor:
    """0 for rows without a baseline (a group of one counted row) and rows not counted."""
    keep_b = counts_b > 1
    if counted_b is not None:
        keep_b = keep_b & counted_b.to(torch.bool)
    return torch.where(keep_b, adv_b, torch.zeros_like(adv_b)).to(torch.float32)


def grpo_advantages(
    rewards_b: torch.Tensor,
    group_index_b: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    counted_b: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO: ``(r - mean_g) / (std_g + eps)`` with the unbiased group std (as ``torch.std``).

    ``norm_by_std=False`` gives Dr.GRPO's ``r - mean_g``. Singleton groups get 0.
    ``counted_b``: the group statistics over these rows only; the others get 0.
    Returns (B,) float32 (computed in float64 so the group statistics do not round).
    """
    rewards_b = rewards_b.detach().to(torch.float64)
    counts_b, sums_b = _group_sums(rewards_b, group_index_b, counted_b)
    mean_b = sums_b / counts_b.clamp(min=1)
    centered_b = rewards_b - mean_b
    if norm_by_std:
        sq_sums_b = _group_sums(centered_b.square(), group_index_b, counted_b)[1]
        std_b = torch.sqrt(sq_sums_b / (counts_b - 1).clamp(min=1))
        centered_b = centered_b / (std_b + eps)
    return _only_counted(centered_b, counts_b, counted_b)


def rloo_advantages(
    rewards_b: torch.Tensor, group_index_b: torch.Tensor, counted_b: torch.Tensor | None = None
) -> torch.Tensor:
    """RLOO: each response's baseline is the mean reward of the OTHER responses of its group,
    i.e. ``r_i - (sum_g - r_i) / (n_g - 1)``. Singleton groups get 0. ``counted_b``: the
    baseline over these rows only; the others get 0. Returns (B,) float32."""
    rewards_b = rewards_b.detach().to(torch.float64)
    counts_b, sums_b = _group_sums(rewards_b, group_index_b, counted_b)
    baseline_b = (sums_b - rewards_b) / (counts_b - 1).clamp(min=1)
    return _only_counted(rewards_b - baseline_b, counts_b, counted_b)


# ---- the registry's entries (recipe/algo/registry.py): one typed argument each ----------


def grpo(inputs: AdvantageInputs) -> torch.Tensor:
    """``algorithm.adv_estimator=grpo``: ``grpo_advantages`` (``norm_adv_by_std_in_grpo``)."""
    return grpo_advantages(
        inputs.rewards_b,
        inputs.group_index_b,
        norm_by_std=inputs.config.norm_adv_by_std_in_grpo,
        counted_b=inputs.counted_b,
    )


def rloo(inputs: AdvantageInputs) -> torch.Tensor:
    """``algorithm.adv_estimator=rloo``: ``rloo_advantages``."""
    return rloo_advantages(inputs.rewards_b, inputs.group_index_b, inputs.counted_b)


def compute_advantages(
    rewards_b: torch.Tensor,
    group_index_b: torch.Tensor,
    config: AlgorithmConfig,
    counted_b: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages (B,) with the estimator that ``config.adv_estimator`` names (a registered
    name or a user's ``FILE.py:fn``); rows where ``counted_b`` is False get 0 and stay out of
    their group's statistics."""
    estimator = ADV_ESTIMATOR.load(config.adv_estimator)
    if rewards_b.shape != group_index_b.shape or rewards_b.dim() != 1:
        raise ValueError(
            f"rewards_b {tuple(rewards_b.shape)} and group_index_b "
            f"{tuple(group_index_b.shape)} must both be (B,)"
        )
    return estimator(AdvantageInputs(rewards_b, group_index_b, config, counted_b))


def share_episode_advantages(
    adv_b: torch.Tensor, episode_b: torch.Tensor | None, primary_b: torch.Tensor | None
) -> torch.Tensor:
    """Every row takes the advantage of its episode's primary row (``episode_b``: (B,) episode
    ids; ``primary_b``: (B,) bool, the row that counted in the group, at most one per
    episode). An episode with no primary row (``env_error``) gets 0 on all its rows. None
    ``episode_b``: ``adv_b`` unchanged (every episode is one row).

    Every segment of an episode gets the episode's advantage; the group baseline and std are
    over episodes (one reward each), so an episode with more segments does not weigh more in
    the baseline, but its tokens in each segment are all trained with that advantage.
    """
    if episode_b is None or episode_b.numel() == 0:
        return adv_b
    assert primary_b is not None, "episode_b comes with counted_b: segment rows do not count"
    _, inverse_b = torch.unique(episode_b, return_inverse=True)
    num_episodes = int(inverse_b.max().item()) + 1
    primary_b = primary_b.to(torch.bool)
    assert int(torch.bincount(inverse_b[primary_b], minlength=num_episodes).max()) <= 1, (
        "an episode has more than one counted row"
    )
    adv_e = torch.zeros(num_episodes, dtype=adv_b.dtype, device=adv_b.device)
    adv_e[inverse_b[primary_b]] = adv_b[primary_b]
    return adv_e[inverse_b]
