"""The driver's rollout correction of one trainer step's batch (``recipe.algo.correction``).

    rollout engine --rollout_logprobs--+
                                       +--> rollout_correction --> rejected tokens out of
    trainer forward --proximal---------+    response_mask_bt, is_weights_bt, mismatch/*

The proximal log-probs are the trainer's forward over the batch before its update: PPO's old
policy in decoupled mode (``bypass_mode=false``; the pushed version in the async recipes), the
mismatch measurement in bypass mode. Rejected tokens leave the loss and its token counts.
"""

from __future__ import annotations

import dataclasses

import torch

from recipe.algo.config import RolloutCorrectionConfig
from recipe.algo.correction import MismatchSums, rollout_correction
from recipe.observability.tracking import MetricsAccumulator
from recipe.workers.trainer.batch import TrainBatch


def correct_batch(
    batch: TrainBatch,
    proximal_bt: torch.Tensor,
    config: RolloutCorrectionConfig,
    metrics: MetricsAccumulator,
) -> TrainBatch:
    """A copy of ``batch`` with rejections applied to ``response_mask_bt`` and importance
    weights in ``is_weights_bt``; adds ``mismatch/*`` to ``metrics``."""
    low, high = config.rs_band
    correction = rollout_correction(
        proximal_bt,
        batch.rollout_logprobs_bt,
        batch.response_mask_bt,
        is_level=config.is_level,
        is_threshold=config.rollout_is_threshold,
        rs_level=config.rs_level,
        rs_low=low,
        rs_high=high,
    )
    add_mismatch_metrics(correction.sums, metrics)
    weights_bt = None if correction.weights_bt is None else correction.weights_bt.float()
    return dataclasses.replace(
        batch, response_mask_bt=correction.mask_bt.bool(), is_weights_bt=weights_bt
    )


def add_mismatch_metrics(sums: MismatchSums, metrics: MetricsAccumulator) -> None:
    """Token-weighted means of the KL estimates and importance weights, the largest weight,
    and the fractions of tokens and sequences rejected."""

    def mean(key: str, total: torch.Tensor, count: float) -> None:
        count = max(count, 1.0)  # an empty batch reports 0, not NaN
        metrics.add(f"mismatch/{key}", float(total) / count, weight=count)

    tokens, seqs = float(sums.tokens), float(sums.seqs)
    for key in ("kl_k1", "kl_k2", "kl_k3"):
        mean(key, getattr(sums, key), tokens)
    mean("is_weight_mean", sums.is_weight, tokens - float(sums.masked_tokens))
    mean("masked_token_frac", sums.masked_tokens, tokens)
    mean("masked_seq_frac", sums.masked_seqs, seqs)
    metrics.add("mismatch/is_weight_max", float(sums.is_weight_max), reduce="max")
