"""The actor's loss on one micro-batch and the metric sums of one ``update_actor`` call.

``micro_loss`` returns the micro-batch's exact share of its mini-batch's loss (normalised by
the mini-batch's global token / sequence counts, see ``recipe.algo.losses``). Its metric
sums stay on the device in ``LossSums``: nothing in the micro-batch loop waits for the GPU,
and one all-reduce per update brings every rank's sums together.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from recipe.algo.losses import PolicyLossInputs, agg_loss, kl_penalty
from recipe.algo.policy_loss import policy_loss
from recipe.workers.config import DR_GRPO_AGG_MODE, ActorConfig
from recipe.workers.trainer.batch import TrainBatch


class TrainerSpecLike(Protocol):
    """The ``TrainerSpec`` fields the loss reads."""

    policy_loss: str
    response_length: int


SUM_KEYS = ("pg_loss", "kl_loss", "entropy", "clipfrac", "ppo_kl", "tokens")
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
    spec: TrainerSpecLike,
    micro: TrainBatch,
    logprob_bt: torch.Tensor,
    entropy_bt: torch.Tensor,
    counts: dict[str, float],
    sums: LossSums,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss; adds its metric sums to ``sums``.
    ``counts``: the mini-batch's global ``num_tokens`` and ``num_seqs``. PPO's old policy is
    the trainer's (decoupled mode) or the rollout's (bypass mode); rollout-correction weights
    and rejections were applied to the batch by the driver (``recipe.algo.correction``)."""
    mask_bt = micro.response_mask_bt
    old_bt = (
        micro.old_logprobs_bt if micro.old_logprobs_bt is not None else micro.rollout_logprobs_bt
    )
    agg_mode, counts = aggregation(actor.loss_agg_mode, counts, spec.response_length)
    inputs = PolicyLossInputs(
        logprob_bt, old_bt, micro.advantages_bt, mask_bt,
        clip_low=actor.clip_ratio_low, clip_high=actor.clip_ratio_high,
        agg_mode=agg_mode, is_weights_bt=micro.is_weights_bt, **counts,
    )  # fmt: skip
    pg_loss, stats = policy_loss(spec.policy_loss, inputs)
    loss = pg_loss
    if actor.entropy_coeff > 0:
        entropy_loss = agg_loss(entropy_bt, mask_bt, agg_mode, **counts)
        loss = loss - actor.entropy_coeff * entropy_loss
    if actor.use_kl_loss and micro.ref_logprobs_bt is not None:
        kl_bt = kl_penalty(logprob_bt, micro.ref_logprobs_bt, actor.kl_loss_type)
        kl_loss = agg_loss(kl_bt, mask_bt, agg_mode, **counts)
        loss = loss + actor.kl_loss_coef * kl_loss
        sums.add("kl_loss", kl_loss)
    sums.add("pg_loss", pg_loss)
    sums.add("entropy", (entropy_bt.detach() * mask_bt).sum())
    sums.add("clipfrac", stats.pg_clipfrac * stats.num_tokens)
    sums.add("ppo_kl", stats.ppo_kl * stats.num_tokens)
    sums.add("tokens", stats.num_tokens)
    return loss


def aggregation(
    mode: str, counts: dict[str, float], response_length: int
) -> tuple[str, dict[str, float]]:
    """(``agg_loss`` mode, counts) of ``actor.loss_agg_mode``. Dr.GRPO's
    ``seq-mean-token-sum-norm`` divides every sequence's token sum by the constant
    ``rollout.response_length`` (no length bias): ``seq-mean-token-sum`` over
    ``num_seqs * response_length``."""
    if mode != DR_GRPO_AGG_MODE:
        return mode, counts
    return "seq-mean-token-sum", counts | {"num_seqs": counts["num_seqs"] * response_length}


def update_metrics(
    totals: dict[str, float],
    grad_norms: list[float],
    lr: float,
    *,
    with_ref: bool,
) -> dict[str, float]:
    """``actor/*`` metrics of one update from the reduced sums and per-step grad norms."""
    num_steps, num_tokens = len(grad_norms), max(totals["tokens"], 1.0)
    metrics = {
        "actor/pg_loss": totals["pg_loss"] / num_steps,
        # A non-finite norm stays in the mean: a skipped step shows as NaN/inf, not as 0.
        "actor/grad_norm": sum(grad_norms) / num_steps,
        "actor/optimizer_steps": float(num_steps),
        "actor/skipped_steps": float(sum(not math.isfinite(n) for n in grad_norms)),
        "actor/lr": lr,
        "actor/entropy": totals["entropy"] / num_tokens,
        "actor/ppo_kl": totals["ppo_kl"] / num_tokens,
        "actor/clipfrac": totals["clipfrac"] / num_tokens,
    }
    if with_ref:
        metrics["actor/kl_loss"] = totals["kl_loss"] / num_steps
    return metrics
