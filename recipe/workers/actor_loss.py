"""The actor's loss on one micro-batch and the metric sums of one ``update_actor`` call.

``micro_loss`` returns the micro-batch's exact share of its mini-batch's loss (normalised by
the mini-batch's global token / sequence counts, see ``recipe.algo.losses``). Its metric
sums stay on the device in ``LossSums``: nothing in the micro-batch loop waits for the GPU,
and one all-reduce per update brings every rank's sums together.
"""

from __future__ import annotations

import torch

from recipe.algo.config import RolloutCorrectionConfig
from recipe.algo.losses import agg_loss, kl_penalty, ppo_clip_loss, truncated_is_weights
from recipe.workers.batch import TrainBatch
from recipe.workers.config import ActorConfig

SUM_KEYS = ("pg_loss", "kl_loss", "entropy", "clipfrac", "ppo_kl", "tis_weight", "tokens")
"""Token-weighted (or per-step) sums reduced once per update, in all-reduce buffer order."""


class LossSums:
    """Device-side running sums of ``SUM_KEYS`` (float64, no host sync until ``totals``)."""

    def __init__(self, device: torch.device):
        self._sums = torch.zeros(len(SUM_KEYS), dtype=torch.float64, device=device)
        self._index = {key: i for i, key in enumerate(SUM_KEYS)}

    def add(self, key: str, value: torch.Tensor) -> None:
        self._sums[self._index[key]] += value.detach().to(torch.float64)

    def totals(self) -> dict[str, float]:
        """The sums over all ranks of the default process group (collective)."""
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(self._sums, op=dist.ReduceOp.SUM)
        return dict(zip(SUM_KEYS, self._sums.tolist(), strict=True))


def micro_loss(
    actor: ActorConfig,
    correction: RolloutCorrectionConfig,
    micro: TrainBatch,
    logprob_bt: torch.Tensor,
    entropy_bt: torch.Tensor,
    counts: dict[str, float],
    sums: LossSums,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss; adds its metric sums to ``sums``.
    ``counts``: the mini-batch's global ``num_tokens`` and ``num_seqs``."""
    mask_bt = micro.response_mask_bt
    old_bt, is_weights_bt = micro.rollout_logprobs_bt, None
    if micro.old_logprobs_bt is not None:
        old_bt = micro.old_logprobs_bt
        is_weights_bt = truncated_is_weights(
            old_bt, micro.rollout_logprobs_bt, mask_bt, correction.tis_cap
        )
        sums.add("tis_weight", is_weights_bt.sum())
    pg_loss, stats = ppo_clip_loss(
        logprob_bt, old_bt, micro.advantages_bt, mask_bt,
        clip_low=actor.clip_ratio_low, clip_high=actor.clip_ratio_high,
        agg_mode=actor.loss_agg_mode, is_weights_bt=is_weights_bt, **counts,
    )  # fmt: skip
    loss = pg_loss
    if actor.entropy_coeff > 0:
        entropy_loss = agg_loss(entropy_bt, mask_bt, actor.loss_agg_mode, **counts)
        loss = loss - actor.entropy_coeff * entropy_loss
    if actor.use_kl_loss and micro.ref_logprobs_bt is not None:
        kl_bt = kl_penalty(logprob_bt, micro.ref_logprobs_bt, actor.kl_loss_type)
        kl_loss = agg_loss(kl_bt, mask_bt, actor.loss_agg_mode, **counts)
        loss = loss + actor.kl_loss_coef * kl_loss
        sums.add("kl_loss", kl_loss)
    sums.add("pg_loss", pg_loss)
    sums.add("entropy", (entropy_bt.detach() * mask_bt).sum())
    sums.add("clipfrac", stats.pg_clipfrac * stats.num_tokens)
    sums.add("ppo_kl", stats.ppo_kl * stats.num_tokens)
    sums.add("tokens", stats.num_tokens)
    return loss


def update_metrics(
    totals: dict[str, float],
    grad_norms: list[float],
    lr: float,
    *,
    with_ref: bool,
    with_old: bool,
) -> dict[str, float]:
    """``actor/*`` metrics of one update from the reduced sums and per-step grad norms."""
    num_steps, num_tokens = len(grad_norms), max(totals["tokens"], 1.0)
    metrics = {
        "actor/pg_loss": totals["pg_loss"] / num_steps,
        "actor/grad_norm": sum(grad_norms) / num_steps,
        "actor/lr": lr,
        "actor/entropy": totals["entropy"] / num_tokens,
        "actor/ppo_kl": totals["ppo_kl"] / num_tokens,
        "actor/clipfrac": totals["clipfrac"] / num_tokens,
    }
    if with_ref:
        metrics["actor/kl_loss"] = totals["kl_loss"] / num_steps
    if with_old:
        metrics["actor/tis_weight_mean"] = totals["tis_weight"] / num_tokens
    return metrics
