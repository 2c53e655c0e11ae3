"""``LoraServing``: the LoRA half of ``VLLMRolloutWorker`` (mixed into it).

A LoRA engine keeps its base weights and serves the pushed adapter (``lora.py`` says why one
name, replaced in place)::

    check_adapter(adapter)     verify both files' sha256, sum the tensors as the engine
                               will hold them, while still serving (a push staged ahead
                               of its pause); load_adapter of that folder reuses it
    load_adapter(adapter, v)   (the checks above unless done) -> pause -> base weights back
                               if merged ones were loaded -> swap the adapter in (prefix
                               cache reset) -> probe -> read the engine's adapter back
                               (its sums vs the file's) -> serve v (resume if it ran)
    _lora_request()            the served adapter's request, for every engine request;
                               AdapterMissingError rather than a silent base past version 0
    _drop_adapter()            full weights loaded (a resume or a restarted replica gets the
                               merged policy): no adapter on top of them until the next push
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from recipe.utils.adapter_file import AdapterFile, verify_adapter_folder
from recipe.workers.rollout.lora import (
    ADAPTER_ID,
    AdapterMissingError,
    ProbeResult,
    adapter_is_zero,
    cached_prompt_tokens,
    lora_request,
    probe,
    probe_prompt,
    swap_adapter,
)
from recipe.workers.rollout.lora_readback import (
    adapter_checksums,
    engine_lora_dtype,
    read_back,
)

if TYPE_CHECKING:
    from recipe.model import HFModelConfig
    from recipe.workers.rollout.lora_readback import AdapterSums

logger = logging.getLogger(__name__)


class CheckedAdapter(NamedTuple):
    """An adapter folder's checks before it is loaded (``LoraServing._check``)."""

    zero: bool
    """Every ``lora_B`` is zero: the adapter is the base (the probe may read no difference)."""
    expected: AdapterSums
    """Its per-module sums as the engine will hold them (the read-back compares them)."""


class LoraServing:
    """Adapter state and loading of a vLLM rollout worker (module docstring)."""

    _engine: Any
    _model: HFModelConfig
    _version: int
    _paused: bool

    if TYPE_CHECKING:  # provided by RolloutWorker / VLLMEngineControl (vllm_engine.py)

        def _check_open(self) -> None: ...
        async def pause(self) -> None: ...
        async def resume(self) -> None: ...
        async def wait_until_running(self) -> None: ...
        async def _pause_engine(self) -> bool: ...

    def _init_lora(self, rank: int) -> None:
        self._lora_rank = rank
        self._adapter: AdapterFile | None = None  # the adapter served, once one was pushed
        self._policy_in_base = False  # full (merged) weights were loaded into the base
        self._checked: tuple[AdapterFile, CheckedAdapter] | None = None  # check_adapter's

    def _lora_request(self) -> Any:
        """The served adapter's ``LoRARequest`` for every request (training, validation,
        episode turns, agent endpoint turns all come through ``_stream``); None without
        LoRA or at version 0 (a fresh adapter adds nothing). Never the base silently."""
        if self._adapter is not None:
            return lora_request(self._adapter)
        if self._lora_rank and self._version > 0 and not self._policy_in_base:
            raise AdapterMissingError(
                f"LoRA engine at version {self._version} has no adapter loaded: it would "
                "sample the base policy"
            )
        return None

    async def check_adapter(self, adapter: AdapterFile) -> dict[str, float]:
        """Check a pushed adapter folder while the engine still serves: both files' sha256
        against the writer's record, whether it is zero, its sums as the engine will hold
        them; ``load_adapter`` of the same folder then skips them. Returns its
        ``sync/verify_s``."""
        start = time.perf_counter()
        self._checked = (adapter, await self._check(adapter, "check_adapter"))
        return {"sync/verify_s": time.perf_counter() - start}

    async def _check(self, adapter: AdapterFile, what: str) -> CheckedAdapter:
        self._check_open()
        if not self._lora_rank:
            raise ValueError(f"{what}: this engine was started without LoRA (lora_rank 0)")
        if adapter.rank > self._lora_rank:
            raise ValueError(f"adapter rank {adapter.rank} > the engine's {self._lora_rank}")
        await asyncio.to_thread(verify_adapter_folder, adapter)
        zero = await asyncio.to_thread(adapter_is_zero, adapter)
        dtype = engine_lora_dtype(self._engine)
        expected = await asyncio.to_thread(adapter_checksums, adapter, dtype)
        return CheckedAdapter(zero, expected)

    async def load_adapter(self, adapter: AdapterFile, version: int) -> dict[str, float]:
        """Serve the pushed ``adapter`` as ``version`` (module docstring). A running worker
        is paused around the load and resumed after it; a failure leaves it paused and
        raises. Returns ``sync/*`` figures of the load (``sync/verify_s`` 0 when
        ``check_adapter`` checked this folder before)."""
        self._check_open()
        if version <= self._version:
            raise ValueError(f"load_adapter(version={version}): serving {self._version}")
        start = time.perf_counter()
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == adapter:
            zero, expected = checked[1]
        else:
            zero, expected = await self._check(adapter, "load_adapter")
        verify_s = time.perf_counter() - start
        was_running = not self._paused
        await self.pause()
        if self._policy_in_base:
            await self._restore_base()
        replace, self._adapter = self._adapter is not None, None
        await swap_adapter(self._engine, adapter, replace=replace)
        self._adapter, self._version = adapter, version
        result = await self._probe(zero)
        result.check(version, adapter.path)
        readback_s = await read_back(self._engine, adapter, ADAPTER_ID, version, expected)
        logger.info("rollout worker serves adapter v%d from %s", version, adapter.path)
        if was_running:
            await self.resume()
        return result.to_metrics() | {
            "sync/verify_s": verify_s,
            "sync/adapter_readback_s": readback_s,
        }

    async def verify_served_adapter(self) -> float:
        """Read the served adapter back from the engine and compare it with its folder as
        the folder is now (``lora_readback``); returns the seconds. A check for tests."""
        self._check_open()
        if self._adapter is None:
            raise ValueError("verify_served_adapter: no adapter is served")
        return await read_back(self._engine, self._adapter, ADAPTER_ID, self._version)

    async def _probe(self, zero: bool) -> ProbeResult:
        """The post-load probe (``lora.probe``); the worker stays PAUSED, so only the probe
        runs while the engine's scheduler does."""
        ids = probe_prompt(self._engine.vllm_config.model_config.get_vocab_size())
        return await probe(self._engine, ids, self._lora_request(), zero, self._pause_engine)

    async def cached_prompt_tokens(self, prompt_ids: list[int]) -> int:
        """Prompt tokens the prefix cache serves a request of the served policy (a check
        for tests: right after an adapter load it must be 0)."""
        self._check_open()
        await self.wait_until_running()
        return await cached_prompt_tokens(self._engine, list(prompt_ids), self._lora_request())

    async def _restore_base(self) -> None:
        """Load ``model.path``'s own weights again, where full (merged) weights were loaded:
        an adapter on the merged policy would apply it twice."""
        for shard in sorted(Path(self._model.path).glob("*.safetensors")):
            await self._engine.collective_rpc("load_weights_from_safetensors", args=(str(shard),))
        await self._engine.reset_prefix_cache()
        self._policy_in_base = False
        logger.info("rollout worker restored the base weights of %s", self._model.path)

    async def _drop_adapter(self) -> None:
        """Full weights were loaded: with LoRA they are the merged policy, no adapter on top."""
        if not self._lora_rank:
            return
        if self._adapter is not None:
            await self._engine.remove_lora(ADAPTER_ID)
        self._adapter, self._policy_in_base = None, True
