"""One optimizer step of the FSDP2 policy: clip, step unless the gradient is not finite, zero.

A step whose global gradient norm is NaN or inf is skipped (the weights stay as they were) and
logged with the parameters whose local gradient shard is not finite, nearest the input first;
the LR schedule advances either way, so a skipped step still counts as one.
"""

from __future__ import annotations

import logging
import math

import torch
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)


def optimizer_step(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    grad_clip: float,
) -> float:
    """Clip to ``grad_clip`` (0: no clipping), step (skipped when the gradient is not
    finite), advance the schedule, zero the gradients; the global gradient norm."""
    params = [p for p in module.parameters() if p.grad is not None]
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    norm_value = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if math.isfinite(norm_value):
        optimizer.step()
    else:
        bad = non_finite_grads(module)
        logger.warning(
            "non-finite grad norm %s: optimizer step skipped; non-finite gradients in %d "
            "tensors on this rank, first: %s",
            norm_value,
            len(bad),
            ", ".join(bad[:3]) or "none (the norm itself overflowed)",
        )
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm_value


def non_finite_grads(module: torch.nn.Module) -> list[str]:
    """Model (HF) names of the parameters whose local gradient shard holds a NaN or an inf,
    in module order (the first is nearest the input)."""
    bad = []
    for name, param in module.named_parameters():
        grad = param.grad
        if grad is None:
            continue
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        if not bool(torch.isfinite(local).all()):
            bad.append(name.removeprefix("lm."))
    return bad
