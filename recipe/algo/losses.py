"""Policy losses, KL estimators and importance weights of PPO-style RL on (B, T) token grids.

All functions take per-token tensors shaped (B, T) and a 0/1 ``mask_bt`` of the same shape
that marks the response tokens to train on; positions outside the mask never contribute.

Data parallelism: a rank sees only its shard of a mini-batch, and often only a micro-batch of
that shard. ``agg_loss`` accepts the GLOBAL token / sequence counts of the whole mini-batch
(``num_tokens`` / ``num_seqs``), so each micro-batch loss is its exact share of the
mini-batch loss: summing gradients over micro-batches and ranks (FSDP reduce-scatter with a
SUM) then reproduces the single-process gradient, whatever the world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_KINDS = ("kl", "abs", "mse", "low_var_kl")

MAX_LOG_RATIO = 20.0
"""Log-ratios are clamped to +-this: exp() beyond it overflows float32 long before it means
anything."""


def masked_mean(values_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Mean over masked positions; 0 when the mask is empty."""
    mask_bt = mask_bt.to(values_bt.dtype)
    return (values_bt * mask_bt).sum() / mask_bt.sum().clamp(min=1)


def count_tokens_and_seqs(mask_bt: torch.Tensor) -> tuple[int, int]:
    """(number of masked tokens, number of sequences with at least one masked token)."""
    per_seq_b = mask_bt.sum(dim=-1)
    return int(per_seq_b.sum().item()), int((per_seq_b > 0).sum().item())


def agg_loss(
    loss_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    mode: str,
    *,
    num_tokens: int | float | None = None,
    num_seqs: int | float | None = None,
) -> torch.Tensor:
    """Reduce token losses (B, T) to a scalar.

    - ``token-mean``: sum of masked token losses / ``num_tokens`` (default: masked tokens here).
    - ``seq-mean-token-sum``: each sequence's token sum, summed / ``num_seqs``.
    - ``seq-mean-token-mean``: each sequence's token mean, summed / ``num_seqs``.

    ``num_seqs`` defaults to the sequences here with at least one masked token (an empty
    response carries no loss and does not dilute the mean). Pass global counts to normalise a
    shard by its mini-batch; counts of 0 are treated as 1.
    """
    mask_bt = mask_bt.to(loss_bt.dtype)
    masked_bt = loss_bt * mask_bt
    if mode == "token-mean":
        denom = mask_bt.sum() if num_tokens is None else num_tokens
        return masked_bt.sum() / _at_least_one(denom)
    tokens_per_seq_b = mask_bt.sum(dim=-1)
    if mode == "seq-mean-token-sum":
        seq_b = masked_bt.sum(dim=-1)
    elif mode == "seq-mean-token-mean":
        seq_b = masked_bt.sum(dim=-1) / tokens_per_seq_b.clamp(min=1)
    else:
        raise ValueError(f"actor.loss_agg_mode={mode!r}: choose one of {AGG_MODES}")
    denom = (tokens_per_seq_b > 0).sum() if num_seqs is None else num_seqs
    return seq_b.sum() / _at_least_one(denom)


def _at_least_one(denom: torch.Tensor | int | float) -> torch.Tensor | float:
    if isinstance(denom, torch.Tensor):
        return denom.clamp(min=1)
    return max(float(denom), 1.0)


@dataclass(slots=True)
class PolicyLossStats:
    """Detached diagnostics of one ``ppo_clip_loss`` call, each a masked token mean."""

    pg_clipfrac: torch.Tensor
    """Fraction of tokens whose clipped surrogate was the active (larger) loss term."""
    ppo_kl: torch.Tensor
    """Mean of ``old_logprob - logprob`` (k1 estimate of KL(old || new))."""
    num_tokens: torch.Tensor
    """Masked tokens these means are over, a float scalar (weights them when reducing across
    shards; a tensor, so that reading it does not wait for the device)."""


@dataclass(frozen=True, slots=True)
class PolicyLossInputs:
    """What a policy loss is given: per-token tensors shaped (B, T) (the conventions of
    ``recipe.algo.losses``) and the options of this run."""

    logprobs_bt: torch.Tensor
    """The policy's log-probs of the sampled tokens (with gradient)."""
    old_logprobs_bt: torch.Tensor
    """PPO's old policy: rollout log-probs (bypass mode) or the trainer's proximal ones."""
    advantages_bt: torch.Tensor
    mask_bt: torch.Tensor
    """0/1: the response tokens to train on."""
    clip_low: float
    """``actor.clip_ratio_low``."""
    clip_high: float
    """``actor.clip_ratio_high``."""
    agg_mode: str
    """``agg_loss`` mode of ``actor.loss_agg_mode``."""
    is_weights_bt: torch.Tensor | None = None
    """Detached rollout-correction weights to multiply into each token loss."""
    num_tokens: int | float | None = None
    """The mini-batch's GLOBAL masked tokens (a micro-batch's loss is its exact share)."""
    num_seqs: int | float | None = None
    """The mini-batch's GLOBAL sequences with a masked token."""


def ppo_clip_loss(
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
    """PPO clipped surrogate ``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with
    ``r = exp(logprob - old_logprob)``, optionally times per-token importance weights
    (rollout correction, ``recipe.algo.correction``), aggregated with ``agg_loss``."""
    log_ratio_bt = (logprobs_bt - old_logprobs_bt).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio_bt = torch.exp(log_ratio_bt)
    unclipped_bt = -advantages_bt * ratio_bt
    clipped_bt = -advantages_bt * ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_bt = torch.maximum(unclipped_bt, clipped_bt)
    if is_weights_bt is not None:
        loss_bt = loss_bt * is_weights_bt.detach()
    loss = agg_loss(loss_bt, mask_bt, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        stats = PolicyLossStats(
            pg_clipfrac=masked_mean((clipped_bt > unclipped_bt).float(), mask_bt),
            ppo_kl=masked_mean(-log_ratio_bt, mask_bt),
            num_tokens=mask_bt.to(torch.float32).sum(),
        )
    return loss, stats


def kl_penalty(logprobs_bt: torch.Tensor, ref_logprobs_bt: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    ``kl`` (k1): ``log p - log q``; ``abs``: ``|log p - log q|``; ``mse`` (k2):
    ``0.5 (log p - log q)^2``; ``low_var_kl`` (k3): ``q/p - log(q/p) - 1``, non-negative and
    unbiased; its log-ratio is clamped to [-20, 20] and the result to [-10, 10] because one
    token with a huge ratio would otherwise dominate the loss.
    """
    diff_bt = logprobs_bt - ref_logprobs_bt
    if kind == "kl":
        return diff_bt
    if kind == "abs":
        return diff_bt.abs()
    if kind == "mse":
        return 0.5 * diff_bt.square()
    if kind == "low_var_kl":
        log_ratio_bt = (-diff_bt).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        k3_bt = torch.exp(log_ratio_bt) - log_ratio_bt - 1.0
        return k3_bt.clamp(-10.0, 10.0)
    raise ValueError(f"actor.kl_loss_type={kind!r}: choose one of {KL_KINDS}")


def entropy_from_logits(logits_nv: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: ``logsumexp(z) - sum(softmax(z) * z)``."""
    probs_nv = torch.softmax(logits_nv, dim=-1)
    return torch.logsumexp(logits_nv, dim=-1) - (probs_nv * logits_nv).sum(dim=-1)
