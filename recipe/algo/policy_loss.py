"""Policy-loss variants selected by name (``algorithm.policy_loss``): PPO clip, GSPO, CISPO.
Dr.GRPO is ``algorithm.norm_adv_by_std_in_grpo=false`` with
``actor.loss_agg_mode=seq-mean-token-sum-norm`` (``recipe.workers.trainer.actor_loss.aggregation``).

Same conventions as ``recipe.algo.losses``: per-token tensors shaped (B, T), a 0/1 ``mask_bt``
of the response tokens to train on, optional detached rollout-correction weights
``is_weights_bt`` multiplied into each token loss, and GLOBAL ``num_tokens`` / ``num_seqs`` of
the mini-batch so that micro-batch losses sum exactly to the mini-batch loss. Each loss
returns ``(loss, PolicyLossStats)`` like ``ppo_clip_loss``; the registry
(recipe/algo/registry.py) calls each through its entry below, which takes one
``PolicyLossInputs``.

``old_logprobs_bt`` is whatever PPO's old policy is in this run: the rollout log-probs in
bypass mode, the trainer's saved proximal policy in decoupled mode. Every loss here is defined
against that anchor, so it applies unchanged to stale (off-policy) samples of async training.
"""

from __future__ import annotations

import torch

from recipe.algo.losses import (
    MAX_LOG_RATIO,
    PolicyLossInputs,
    PolicyLossStats,
    agg_loss,
    masked_mean,
    ppo_clip_loss,
)
from recipe.algo.registry import POLICY_LOSS


def _log_ratio(logprobs_bt: torch.Tensor, old_logprobs_bt: torch.Tensor) -> torch.Tensor:
    return (logprobs_bt - old_logprobs_bt).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def _stats(
    clipped_bt: torch.Tensor, log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor
) -> PolicyLossStats:
    with torch.no_grad():
        return PolicyLossStats(
            pg_clipfrac=masked_mean(clipped_bt.float(), mask_bt),
            ppo_kl=masked_mean(-log_ratio_bt, mask_bt),
            num_tokens=mask_bt.to(torch.float32).sum(),
        )


def _seq_ratio_b(log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence ratio ``exp(mean_t log r_t)`` (B,), detached."""
    with torch.no_grad():
        mask_bt = mask_bt.to(log_ratio_bt.dtype)
        mean_b = (log_ratio_bt * mask_bt).sum(dim=-1) / mask_bt.sum(dim=-1).clamp(min=1)
        return torch.exp(mean_b)


def gspo_loss(
    logprobs_bt: torch.Tensor,
    old_logprobs_bt: torch.Tensor,
    advantages_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str | None = None,
    is_weights_bt: torch.Tensor | None = None,
    num_tokens: int | float | None = None,
    num_seqs: int | float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """GSPO-token (Group Sequence Policy Optimization, Zheng et al. 2025).

    Per sequence ``s_i = exp(mean over its masked tokens of (logprob - old_logprob))``; per
    token ``s_it = sg(s_i) * exp(logprob_t - sg(logprob_t))``, whose value is ``s_i`` and whose
    gradient is ``s_i * grad logprob_t``; token loss
    ``max(-A_t * s_it, -A_t * clip(s_it, 1 - clip_low, 1 + clip_high))``. With one advantage
    per sequence this has GSPO's sequence-level gradient, and a sequence clips as a whole.

    Always aggregated as ``seq-mean-token-mean`` (the paper's sequence-level normalisation):
    ``agg_mode`` and ``num_tokens`` are accepted and ignored. The paper's clip ranges are tiny
    (``clip_low=3e-4``, ``clip_high=4e-4``) because ``s_i`` is a geometric mean, far closer to
    1 than token ratios.
    """
    del agg_mode, num_tokens  # fixed sequence-level aggregation, see docstring
    log_ratio_bt = _log_ratio(logprobs_bt, old_logprobs_bt)
    seq_ratio_bt = _seq_ratio_b(log_ratio_bt, mask_bt).unsqueeze(-1)
    ratio_bt = seq_ratio_bt * torch.exp(logprobs_bt - logprobs_bt.detach())
    unclipped_bt = -advantages_bt * ratio_bt
    clipped_bt = -advantages_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    if is_weights_bt is not None:
        loss_bt = loss_bt * is_weights_bt.detach()
    loss = agg_loss(loss_bt, mask_bt, "seq-mean-token-mean", num_seqs=num_seqs)
    return loss, _stats(clipped_bt > unclipped_bt, log_ratio_bt, mask_bt)


def cispo_loss(
    logprobs_bt: torch.Tensor,
    old_logprobs_bt: torch.Tensor,
    advantages_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    is_weights_bt: torch.Tensor | None = None,
    num_tokens: int | float | None = None,
    num_seqs: int | float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """CISPO (MiniMax-M1, 2025): ``-sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t *
    logprob_t`` with ``r_t = exp(logprob_t - old_logprob_t)``.

    The importance weight is clipped and its gradient stopped instead of the update being
    clipped, so every token keeps a gradient through ``logprob_t`` (PPO clip drops the
    gradient of clipped tokens). The denominator ``old_logprobs_bt`` is PPO's old policy of
    this run (rollout log-probs in bypass mode, the trainer's saved proximal policy in
    decoupled mode), so the loss is defined for stale samples too. The paper uses
    ``token-mean`` and effectively only an upper bound (a large ``clip_low``).
    ``pg_clipfrac`` is the fraction of tokens whose ratio was clipped (on either side).
    """
    log_ratio_bt = _log_ratio(logprobs_bt, old_logprobs_bt)
    with torch.no_grad():
        ratio_bt = torch.exp(log_ratio_bt)
        weight_bt = ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = -weight_bt * advantages_bt * logprobs_bt
    if is_weights_bt is not None:
        loss_bt = loss_bt * is_weights_bt.detach()
    loss = agg_loss(loss_bt, mask_bt, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    return loss, _stats(weight_bt != ratio_bt, log_ratio_bt, mask_bt)


# ---- the registry's entries (recipe/algo/registry.py): one typed argument each ----------


def ppo(inputs: PolicyLossInputs) -> tuple[torch.Tensor, PolicyLossStats]:
    """``algorithm.policy_loss=ppo``: ``ppo_clip_loss``."""
    i = inputs
    return ppo_clip_loss(
        i.logprobs_bt, i.old_logprobs_bt, i.advantages_bt, i.mask_bt,
        clip_low=i.clip_low, clip_high=i.clip_high, agg_mode=i.agg_mode,
        is_weights_bt=i.is_weights_bt, num_tokens=i.num_tokens, num_seqs=i.num_seqs,
    )  # fmt: skip


def gspo(inputs: PolicyLossInputs) -> tuple[torch.Tensor, PolicyLossStats]:
    """``algorithm.policy_loss=gspo``: ``gspo_loss`` (its own fixed aggregation)."""
    i = inputs
    return gspo_loss(
        i.logprobs_bt, i.old_logprobs_bt, i.advantages_bt, i.mask_bt,
        clip_low=i.clip_low, clip_high=i.clip_high,
        is_weights_bt=i.is_weights_bt, num_seqs=i.num_seqs,
    )  # fmt: skip


def cispo(inputs: PolicyLossInputs) -> tuple[torch.Tensor, PolicyLossStats]:
    """``algorithm.policy_loss=cispo``: ``cispo_loss``."""
    i = inputs
    return cispo_loss(
        i.logprobs_bt, i.old_logprobs_bt, i.advantages_bt, i.mask_bt,
        clip_low=i.clip_low, clip_high=i.clip_high, agg_mode=i.agg_mode,
        is_weights_bt=i.is_weights_bt, num_tokens=i.num_tokens, num_seqs=i.num_seqs,
    )  # fmt: skip


def policy_loss(name: str, inputs: PolicyLossInputs) -> tuple[torch.Tensor, PolicyLossStats]:
    """The policy loss ``algorithm.policy_loss`` names: a registered name or a user's
    ``FILE.py:fn`` (recipe/algo/registry.py), called with ``inputs``."""
    return POLICY_LOSS.load(name)(inputs)
