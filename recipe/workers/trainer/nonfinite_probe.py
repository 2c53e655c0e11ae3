"""Where a non-finite gradient comes from: a probe run on a step that was skipped.

When ``actor.probe_non_finite`` is on and a step's gradient norm is not finite, the trainer
(whose weights the skipped step left as they were) runs each micro-batch of that mini-batch
again, alone, and reports for the first one whose gradients are not finite:

- the first decoder layer whose forward output is not finite, on real tokens or only on
  padding (a NaN on padding never reaches the loss, but its zero gradient times NaN
  activations poisons the weight gradients);
- whether its log-probs, loss or only its backward are non-finite;
- the same micro-batch under each scaled-dot-product attention kernel on its own (math,
  memory-efficient, flash, cuDNN): which kernels give finite gradients.

One line per finding, logged as warnings; gradients are zeroed before and after. It costs a
few forward/backward passes per skipped step, so it is off by default.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

Backward = Callable[[], torch.Tensor]
"""Runs one micro-batch's forward and returns its loss (not yet backpropagated)."""


def _finite_grads(module: nn.Module) -> bool:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return all(bool(torch.isfinite(_local(g)).all()) for g in grads)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@contextlib.contextmanager
def _layer_watch(layers: Iterable[nn.Module], attention_mask_bt: torch.Tensor) -> Iterator[list]:
    """Record (layer index, 'real tokens' | 'padding only') of layers whose output is not
    finite during the forward inside the block."""
    found: list[tuple[int, str]] = []
    real_bt = attention_mask_bt.bool()

    def hook(index: int):
        def check(_module, _inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
                return
            bad_bt = ~torch.isfinite(hidden.detach()).all(dim=-1)
            if bool(bad_bt.any()):
                where = "real tokens" if bool((bad_bt & real_bt).any()) else "padding only"
                found.append((index, where))

        return check

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def _kernels() -> list[tuple[str, object]]:
    from torch.nn.attention import SDPBackend

    names = ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")
    return [(n.lower(), getattr(SDPBackend, n)) for n in names if hasattr(SDPBackend, n)]


def _try(policy: nn.Module, loss_fn: Backward, kernel: object | None) -> str:
    from torch.nn.attention import sdpa_kernel

    policy.zero_grad(set_to_none=True)
    try:
        with sdpa_kernel([kernel]) if kernel is not None else contextlib.nullcontext():
            loss = loss_fn()
            if not bool(torch.isfinite(loss)):
                return "non-finite loss"
            loss.backward()
    except RuntimeError as exc:
        return "unavailable" if "No viable backend" in str(exc) else f"error ({str(exc)[:80]})"
    return "finite" if _finite_grads(policy) else "non-finite gradients"


def probe_micro_batches(
    policy: nn.Module,
    layers: list[nn.Module],
    micro_batches: list[tuple[torch.Tensor, Backward]],
    step: int,
) -> list[str]:
    """Findings (module docstring) for the first micro-batch whose gradients are not finite;
    ``micro_batches``: (attention mask, loss closure) per micro-batch, in order."""
    lines: list[str] = []
    try:
        for index, (mask_bt, loss_fn) in enumerate(micro_batches):
            policy.zero_grad(set_to_none=True)
            with _layer_watch(layers, mask_bt) as bad_layers:
                loss = loss_fn()
            finite_loss = bool(torch.isfinite(loss))
            if finite_loss:
                loss.backward()
            if finite_loss and _finite_grads(policy):
                continue
            rows, cols = tuple(mask_bt.shape)
            head = f"step {step} micro-batch {index} ({rows} rows x {cols} tokens)"
            if bad_layers:
                layer, where = bad_layers[0]
                lines.append(f"{head}: decoder layer {layer} output is not finite on {where}")
            else:
                what = "gradients" if finite_loss else "loss"
                lines.append(f"{head}: every layer's output is finite; its {what} is not")
            verdicts = [f"{name}: {_try(policy, loss_fn, k)}" for name, k in _kernels()]
            lines.append(f"{head} per attention kernel: " + "; ".join(verdicts))
            break
        else:
            lines.append(f"step {step}: every micro-batch alone gives finite gradients")
    finally:
        policy.zero_grad(set_to_none=True)
    for line in lines:
        logger.warning("non-finite probe: %s", line)
    return lines
