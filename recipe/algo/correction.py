"""Rollout (off-policy) correction between the proximal policy and the rollout policy.

The inference engine samples with the *rollout* (behaviour) policy, whose log-probs differ from
the trainer's *proximal* (old) policy: other kernels and precision, and in async modes an older
weight version. Per token, ``log_ratio = log pi_proximal - log pi_rollout`` (clamped to
[-20, 20] before any exp) and ``ratio = exp(log_ratio)``; a sequence's ratio is the product of
its tokens' ratios. Two knobs, applied in this order:

- ``rollout_rs`` (rejection, a mask): ``token`` drops tokens whose ratio leaves [lo, hi]
  (two-sided); ``sequence`` drops whole sequences whose ratio does; ``geometric`` drops whole
  sequences whose geometric-mean ratio ``exp(mean log_ratio)`` does (geometric-mean rejection,
  which does not penalise a sequence merely for being long).
- ``rollout_is`` (importance weights): ``token`` weights tokens by ``min(ratio, C)`` (truncated
  IS, TIS); ``sequence`` weights a sequence's tokens by ``min(seq ratio, C)`` (sequence TIS).

Rejection with IS at the same level is masked IS (MIS, token or sequence): out-of-range
ratios are dropped rather than capped. ``rollout_is=token`` with ``rollout_rs=token`` is
IcePop (two-sided token masking, token IS). IS weights are computed on the kept tokens only,
so a rejected token or sequence never enters a sequence IS product.

Everything is computed under ``torch.no_grad()`` and returned detached. ``MismatchSums``
stays on the device (no host sync) and reduces across micro-batches and ranks by addition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from recipe.algo.losses import MAX_LOG_RATIO
from recipe.utils.config_check import (
    require,
    require_choice,
    require_non_negative,
    require_positive,
)

IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")

_KEY = "algorithm.rollout_correction"


def _check_rs_bounds(low: float, high: float) -> None:
    """Raise ``ValueError`` naming the key unless ``0 <= low < high``."""
    require_non_negative(f"{_KEY}.rollout_rs_threshold_lower", low)
    lower = f"{_KEY}.rollout_rs_threshold_lower ({low!r})"
    require(high > low, f"{_KEY}.rollout_rs_threshold", high, f"a number > {lower}")


def _in_range(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Whether ``exp(log_ratio)`` is in [low, high], compared in log space (no overflow)."""
    _check_rs_bounds(low, high)
    log_low = math.log(low) if low > 0 else -math.inf
    return (log_ratio >= log_low) & (log_ratio <= math.log(high))


def _seq_log_ratio_b(log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Sum of each sequence's masked log-ratios (B,); off-mask values (even inf) are ignored."""
    return torch.where(mask_bt.bool(), log_ratio_bt, 0.0).sum(dim=-1)


def _keep_sequences(in_range_b: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence keep decision (B,) onto the sequence's masked tokens."""
    return (in_range_b.unsqueeze(-1) & mask_bt.bool()).to(mask_bt.dtype)


def token_is_weights(
    log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, threshold: float
) -> torch.Tensor:
    """Truncated per-token IS weights ``min(ratio_t, threshold)`` (B, T), 0 off the mask."""
    require_positive(f"{_KEY}.rollout_is_threshold", threshold)
    with torch.no_grad():
        weights_bt = torch.exp(log_ratio_bt.clamp(max=math.log(threshold)))
        return torch.where(mask_bt.bool(), weights_bt, 0.0)


def sequence_is_weights(
    log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, threshold: float
) -> torch.Tensor:
    """One truncated IS weight per sequence, ``min(prod_t ratio_t, threshold)`` over its
    masked tokens, broadcast onto them (B, T); 0 off the mask. Capped in log space."""
    require_positive(f"{_KEY}.rollout_is_threshold", threshold)
    with torch.no_grad():
        seq_log_ratio_b = _seq_log_ratio_b(log_ratio_bt, mask_bt)
        weight_b = torch.exp(seq_log_ratio_b.clamp(max=math.log(threshold)))
        return torch.where(mask_bt.bool(), weight_b.unsqueeze(-1), 0.0)


def token_reject_mask(
    log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Keep mask (B, T) in ``mask_bt``'s dtype: 1 on masked tokens whose ratio is in
    [low, high] (two-sided, IcePop-style), else 0. Compared in log space."""
    with torch.no_grad():
        return (_in_range(log_ratio_bt, low, high) & mask_bt.bool()).to(mask_bt.dtype)


def sequence_reject_mask(
    log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Keep mask (B, T): a sequence's masked tokens are all kept iff its sequence ratio
    ``prod_t ratio_t`` is in [low, high], else all dropped. Compared in log space."""
    with torch.no_grad():
        seq_log_ratio_b = _seq_log_ratio_b(log_ratio_bt, mask_bt)
        return _keep_sequences(_in_range(seq_log_ratio_b, low, high), mask_bt)


def geometric_reject_mask(
    log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Like ``sequence_reject_mask`` with the geometric-mean ratio ``exp(mean_t log_ratio_t)``
    over the sequence's masked tokens. A sequence without masked tokens stays all 0."""
    with torch.no_grad():
        num_tokens_b = mask_bt.bool().sum(dim=-1).clamp(min=1)
        mean_log_ratio_b = _seq_log_ratio_b(log_ratio_bt, mask_bt) / num_tokens_b
        return _keep_sequences(_in_range(mean_log_ratio_b, low, high), mask_bt)


@dataclass(slots=True)
class MismatchSums:
    """Detached float64 scalar sums (on the device) of one correction call. Sums, not means,
    so micro-batches and ranks reduce by addition; divide by ``tokens`` / ``seqs`` at the end."""

    kl_k1: torch.Tensor
    """Sum over original masked tokens of ``-log_ratio`` (nats); k1 estimate of
    KL(rollout || proximal) on rollout samples."""
    kl_k2: torch.Tensor
    """Sum over original masked tokens of ``0.5 * log_ratio**2`` (nats); k2 estimate."""
    kl_k3: torch.Tensor
    """Sum over original masked tokens of ``ratio - 1 - log_ratio`` (nats); k3 estimate."""
    is_weight: torch.Tensor
    """Sum of IS weights over kept tokens (dimensionless); the kept-token count without IS."""
    is_weight_max: torch.Tensor
    """Largest IS weight on a kept token (dimensionless); 0 when no token is kept."""
    masked_tokens: torch.Tensor
    """Tokens of the original mask removed by rejection (count)."""
    masked_seqs: torch.Tensor
    """Sequences with >= 1 original masked token and none kept after rejection (count)."""
    tokens: torch.Tensor
    """Tokens in the original mask (count)."""
    seqs: torch.Tensor
    """Sequences with >= 1 token in the original mask (count)."""


@dataclass(slots=True)
class Correction:
    """Result of ``rollout_correction``."""

    weights_bt: torch.Tensor | None
    """Detached IS weights (B, T) on kept tokens, 0 elsewhere; None without ``rollout_is``."""
    mask_bt: torch.Tensor
    """Training mask (B, T) after rejection, in the input mask's dtype."""
    sums: MismatchSums
    """Mismatch diagnostics, summed over this batch."""


_IS_FNS = {"token": token_is_weights, "sequence": sequence_is_weights}
_RS_FNS = {
    "token": token_reject_mask,
    "sequence": sequence_reject_mask,
    "geometric": geometric_reject_mask,
}


def _mismatch_sums(
    log_ratio_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    keep_bt: torch.Tensor,
    weights_bt: torch.Tensor | None,
) -> MismatchSums:
    """Diagnostics of one correction; ``keep_bt`` is a subset of ``mask_bt``."""
    mask, keep = mask_bt.bool(), keep_bt.bool()
    # 0 off the mask makes every estimator below 0 there too.
    lr_bt = torch.where(mask, log_ratio_bt.double(), 0.0)
    weights_bt = keep.double() if weights_bt is None else weights_bt.double()
    kept_weights_bt = torch.where(keep, weights_bt, 0.0)
    has_tokens_b = mask.any(dim=-1)
    return MismatchSums(
        kl_k1=(-lr_bt).sum(),
        kl_k2=(0.5 * lr_bt.square()).sum(),
        kl_k3=(torch.exp(lr_bt) - 1.0 - lr_bt).sum(),
        is_weight=kept_weights_bt.sum(),
        is_weight_max=kept_weights_bt.max(),
        masked_tokens=(mask & ~keep).sum().double(),
        masked_seqs=(has_tokens_b & ~keep.any(dim=-1)).sum().double(),
        tokens=mask.sum().double(),
        seqs=has_tokens_b.sum().double(),
    )


def rollout_correction(
    proximal_bt: torch.Tensor,
    rollout_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    *,
    is_level: str | None,
    is_threshold: float,
    rs_level: str | None,
    rs_low: float,
    rs_high: float,
) -> Correction:
    """Reject (``rs_level``) then weight (``is_level``) the masked tokens by how far the
    rollout policy's log-probs ``rollout_bt`` are from the proximal ones ``proximal_bt``.
    With both levels None the mask comes back unchanged and only the sums are computed."""
    require_choice(f"{_KEY}.rollout_is", is_level, (None, *IS_LEVELS))
    require_positive(f"{_KEY}.rollout_is_threshold", is_threshold)
    require_choice(f"{_KEY}.rollout_rs", rs_level, (None, *RS_LEVELS))
    _check_rs_bounds(rs_low, rs_high)
    with torch.no_grad():
        log_ratio_bt = proximal_bt.detach().float() - rollout_bt.detach().float()
        log_ratio_bt = log_ratio_bt.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        keep_bt = mask_bt
        if rs_level is not None:
            keep_bt = _RS_FNS[rs_level](log_ratio_bt, mask_bt, rs_low, rs_high)
        weights_bt = None
        if is_level is not None:
            weights_bt = _IS_FNS[is_level](log_ratio_bt, keep_bt, is_threshold)
        sums = _mismatch_sums(log_ratio_bt, mask_bt, keep_bt, weights_bt)
    return Correction(weights_bt=weights_bt, mask_bt=keep_bt, sums=sums)
