"""Model FLOPs of training steps and the device peaks to read them against (MFU).

A transformer's matmuls cost ~2 FLOPs per parameter per token forward and ~4 backward, plus
attention scores (``2 x layers x tokens x context x hidden`` forward, the same again for
the values). Counted here: every parameter except the input embedding (a lookup, unless it is
tied to the output head, which is a matmul), so the 151,936-token head of the Qwen2.5 shapes
is in. MFU is achieved model FLOPs over the device's dense bf16 peak; it ignores recompute,
which a framework pays and the model does not ask for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Dense bf16 peaks (no sparsity), FLOP/s, by a substring of torch.cuda.get_device_name().
BF16_PEAK_FLOPS = {"H200": 989.5e12, "H100": 989.5e12, "A100": 312e12, "L40S": 362e12}


@dataclass(frozen=True, slots=True)
class ModelFlops:
    """What FLOPs per token depend on, read from an HF ``config.json``."""

    matmul_params: int
    """Parameters that multiply activations (all but an untied input embedding)."""
    num_layers: int
    hidden_size: int

    @classmethod
    def from_config(cls, model_dir: str | Path) -> ModelFlops:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads")
        head_dim = cfg.get("head_dim") or hidden // heads
        kv_dim = (kv_heads or heads) * head_dim
        q_o = 2 * hidden * heads * head_dim
        attn = q_o + 2 * hidden * kv_dim
        mlp = 3 * hidden * cfg["intermediate_size"]
        return cls(layers * (attn + mlp) + vocab * hidden, layers, hidden)

    def forward_flops(self, num_tokens: int, sum_sq_lengths: int = 0) -> float:
        """Forward FLOPs over ``num_tokens`` real tokens; ``sum_sq_lengths``: sum over
        sequences of length^2 (causal attention scores and values, half the square)."""
        attention = 2 * self.num_layers * self.hidden_size * sum_sq_lengths
        return 2.0 * self.matmul_params * num_tokens + attention

    def train_flops(self, num_tokens: int, sum_sq_lengths: int = 0) -> float:
        """Forward + backward (3x the forward)."""
        return 3.0 * self.forward_flops(num_tokens, sum_sq_lengths)


def device_peak_flops(device: str) -> float | None:
    """Dense bf16 peak of the current CUDA device when known; None on CPU or unknown GPUs."""
    if device != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name()
    return next((peak for key, peak in BF16_PEAK_FLOPS.items() if key in name), None)


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Achieved over peak FLOP/s; None without a known peak."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / peak
