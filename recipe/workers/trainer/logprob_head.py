"""Log-probs and entropies of target tokens through the vocabulary projection, chunked.

A causal LM's last step, ``hidden (N, H) @ W (V, H)^T``, is the largest tensor of a training
step when V is ~150k: (N, V) float32 logits for N = 16k tokens are ~10 GB. ``chunked_logprob_
entropy`` never holds more than one (chunk, V) block. It is a custom autograd function:

    forward : per chunk  z = (h W^T + b) / temperature   (float32)
                         logprob = z[target] - lse(z),  entropy = lse(z) - softmax(z) . z
              saves      h, W, b, targets, lse, entropy  (O(N) besides the inputs)
    backward: per chunk  recompute z, p = softmax(z)
                         dL/dz = g_lp (onehot - p) - g_ent p (z - lse + entropy)
                         dL/dh = dL/dz W / temperature,  dL/dW += (dL/dz)^T h / temperature

so backward costs one recomputed projection plus the two gradient GEMMs and a few in-place
elementwise passes over a (chunk, V) block, instead of autograd's stack of saved softmax
intermediates. When the entropy is only a metric (no entropy bonus), its gradient is never
formed, and callers that do not need it at all (old log-probs) skip it.
"""

from __future__ import annotations

import torch
from torch import nn


def _chunk_logits(
    hidden_nh: torch.Tensor, weight_vh: torch.Tensor, bias_v: torch.Tensor | None, temp: float
) -> torch.Tensor:
    logits_nv = torch.nn.functional.linear(hidden_nh, weight_vh, bias_v)
    logits_nv = logits_nv.to(_out_dtype(logits_nv.dtype))
    return logits_nv / temp if temp != 1.0 else logits_nv


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs: log-softmax over V ~ 1e5 needs >= float32."""
    return torch.promote_types(dtype, torch.float32)


class _ChunkedLogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_nh, weight_vh, bias_v, targets_n, chunk_size, temperature, entropy):
        num_rows = hidden_nh.shape[0]
        logprob_n = hidden_nh.new_empty(num_rows, dtype=_out_dtype(hidden_nh.dtype))
        entropy_n = torch.zeros_like(logprob_n)
        lse_n = torch.empty_like(logprob_n)
        for start in range(0, num_rows, chunk_size):
            end = min(start + chunk_size, num_rows)
            z_nv = _chunk_logits(hidden_nh[start:end], weight_vh, bias_v, temperature)
            lse = z_nv.logsumexp(-1)
            lse_n[start:end] = lse
            logprob_n[start:end] = z_nv.gather(-1, targets_n[start:end, None]).squeeze(-1) - lse
            if entropy:
                p_nv = torch.softmax(z_nv, dim=-1)
                entropy_n[start:end] = lse - torch.linalg.vecdot(p_nv, z_nv)
        ctx.save_for_backward(hidden_nh, weight_vh, bias_v, targets_n, lse_n, entropy_n)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        ctx.set_materialize_grads(False)
        return logprob_n, entropy_n

    @staticmethod
    def backward(ctx, grad_logprob_n, grad_entropy_n):
        hidden_nh, weight_vh, bias_v, targets_n, lse_n, entropy_n = ctx.saved_tensors
        none = (None,) * 7
        if grad_logprob_n is None and grad_entropy_n is None:
            return none
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden_nh) if need_h else None
        acc_dtype = _out_dtype(weight_vh.dtype)
        grad_w = torch.zeros_like(weight_vh, dtype=acc_dtype) if need_w else None
        grad_b = torch.zeros_like(bias_v, dtype=acc_dtype) if need_b else None
        for start in range(0, hidden_nh.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden_nh.shape[0])
            h_nh = hidden_nh[start:end]
            z_nv = _chunk_logits(h_nh, weight_vh, bias_v, ctx.temperature)
            g_lp = None if grad_logprob_n is None else grad_logprob_n[start:end, None]
            g_ent = None if grad_entropy_n is None else grad_entropy_n[start:end, None]
            grad_z = _logit_grad(
                z_nv, lse_n[start:end, None], entropy_n[start:end, None], g_lp, g_ent
            )
            if g_lp is not None:
                grad_z.scatter_add_(-1, targets_n[start:end, None], g_lp.to(grad_z.dtype))
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            grad_z_low = grad_z.to(weight_vh.dtype)
            if grad_h is not None:
                grad_h[start:end] = grad_z_low @ weight_vh
            if grad_w is not None:
                grad_w += (grad_z_low.t() @ h_nh).to(acc_dtype)
            if grad_b is not None:
                grad_b += grad_z.sum(0)
        grad_w = grad_w.to(weight_vh.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias_v.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _logit_grad(z_nv, lse_n1, entropy_n1, g_lp, g_ent) -> torch.Tensor:
    """dL/dz without the one-hot term, in place in ``z_nv``'s buffer (it is ours):
    ``-g_lp p - g_ent p (log p + entropy)``, with ``log p = z - lse``."""
    logp_nv = z_nv.sub_(lse_n1)
    p_nv = logp_nv.exp()
    if g_ent is None:
        return p_nv.mul_(-g_lp)
    grad_nv = logp_nv.add_(entropy_n1).mul_(p_nv).mul_(-g_ent)
    if g_lp is not None:
        grad_nv.sub_(p_nv.mul_(g_lp))
    return grad_nv


def chunked_logprob_entropy(
    hidden_nh: torch.Tensor,
    head: nn.Module,
    targets_n: torch.Tensor,
    chunk_size: int,
    temperature: float = 1.0,
    *,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(target), entropy) per row through the linear ``head`` (an ``nn.Linear``:
    ``weight`` (V, H), optional ``bias``), ``chunk_size`` rows at a time; float32, or float64
    for float64 inputs. ``with_entropy=False``: no entropy (None), one pass less per chunk."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size={chunk_size} must be > 0")
    weight_vh, bias_v = head.weight, getattr(head, "bias", None)
    if hidden_nh.shape[0] == 0:
        # Keep the graph connected to the whole model, so that a micro-batch without target
        # tokens still runs a backward (its FSDP collectives) like the other ranks' do.
        zero = 0.0 * (hidden_nh.float().sum() + weight_vh.float().sum())
        empty_n = hidden_nh.new_zeros(0, dtype=_out_dtype(hidden_nh.dtype)) + zero
        return empty_n, empty_n.detach() if with_entropy else None
    logprob_n, entropy_n = _ChunkedLogProbEntropy.apply(
        hidden_nh, weight_vh, bias_v, targets_n, chunk_size, temperature, with_entropy
    )
    return logprob_n, entropy_n if with_entropy else None
