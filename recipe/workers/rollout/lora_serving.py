"""``LoraServing``: the LoRA half of ``VLLMRolloutWorker`` (mixed into it).

A LoRA engine keeps its base weights and serves each pushed version's adapter under a name of
its own (``lora.py`` says why)::

    stage_adapter(adapter, v)  verify both files' sha256, sum the tensors as the engine will
                               hold them; then, unless full (merged) weights are loaded, add
                               it as v beside the served version, read it back and, once
                               this engine probed before, probe it beside what the engine
                               decodes, kept when ``ahead_verdict`` accepts it: while the
                               engine still serves where a push is staged ahead of its pause
                               (fully_async)
    load_adapter(adapter, v)   (stage_adapter unless staged) -> pause -> (merged weights
                               loaded: base weights back, then add, read back) -> probe, on
                               the paused engine alone, unless the one ahead was accepted
                               -> serve v (its probe's log-probs: the next probe ahead's
                               served reference) -> resume -> remove the previous version
    _lora_request()            the served adapter's request, for every engine request;
                               AdapterMissingError rather than a silent base past version 0
    _drop_adapter()            full weights loaded (a resume or a restarted replica gets the
                               merged policy): no adapter on top of them until the next push
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.utils.adapter_file import AdapterFile, verify_adapter_folder
from recipe.workers.rollout.lora import (
    AdapterMissingError,
    ProbeResult,
    adapter_is_zero,
    add_adapter,
    ahead_verdict,
    cached_prompt_tokens,
    lora_request,
    max_abs_diff,
    probe,
    probe_prompt,
    prompt_logprobs,
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


@dataclass(frozen=True, slots=True)
class StagedAdapter:
    """A pushed version's adapter, checked (and added beside the served one when ``added``)."""

    adapter: AdapterFile
    version: int
    zero: bool
    """Every ``lora_B`` is zero: the adapter is the base (the probe may read no difference)."""
    expected: AdapterSums
    """Its per-module sums as the engine will hold them (the read-back compares them)."""
    added: bool = False
    """Added to the engine as ``version`` (in one of its slots) and read back."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``sync/*`` of its checks so far."""
    probe: tuple[ProbeResult, list[float]] | None = None
    """Its probe taken ahead of the pause and accepted (``ahead_verdict``), with the probe
    prompt's log-probs under it: the pause then holds only the switch."""

    def same(self, adapter: AdapterFile, version: int) -> bool:
        return self.adapter == adapter and self.version == version


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
        async def _pause_idle_engine(self) -> None: ...

    def _init_lora(self, rank: int) -> None:
        self._lora_rank = rank
        self._adapter: AdapterFile | None = None  # the adapter served, once one was pushed
        self._policy_in_base = False  # full (merged) weights were loaded into the base
        self._staged: StagedAdapter | None = None  # stage_adapter's, until load_adapter
        self._base_probe: list[float] | None = None  # the probe prompt's log-probs, base
        self._served_probe: list[float] | None = None  # ... under the served adapter

    def _lora_request(self) -> Any:
        """The served adapter's ``LoRARequest`` for every request (training, validation,
        episode turns, agent endpoint turns all come through ``_stream``); None without
        LoRA or at version 0 (a fresh adapter adds nothing). Never the base silently."""
        if self._adapter is not None:
            return lora_request(self._adapter, self._version)
        if self._lora_rank and self._version > 0 and not self._policy_in_base:
            raise AdapterMissingError(
                f"LoRA engine at version {self._version} has no adapter loaded: it would "
                "sample the base policy"
            )
        return None

    async def stage_adapter(self, adapter: AdapterFile, version: int) -> dict[str, float]:
        """Check ``adapter`` and, unless merged weights are loaded, add it as ``version``
        beside the served version, read it back and probe it beside the requests the
        engine decodes (module docstring); ``load_adapter`` of the same then only probes
        (unless that probe was accepted) and switches. Returns its ``sync/*``."""
        self._check_push(adapter, version, "stage_adapter")
        await self._discard_staged()
        staged = await self._check(adapter, version)
        if not self._policy_in_base:
            staged = await self._add(staged)
            try:
                staged = await self._probe_ahead(staged)
            except BaseException:
                await self._remove(staged)
                raise
        self._staged = staged
        return staged.metrics

    async def load_adapter(self, adapter: AdapterFile, version: int) -> dict[str, float]:
        """Serve the pushed ``adapter`` as ``version`` (module docstring). A running worker
        is paused around the probe (none where the staging's was accepted) and the switch and
        resumed after them; a failure leaves it paused and raises. Returns the ``sync/*``
        figures of what it did beyond the staging (the probe's always)."""
        self._check_push(adapter, version, "load_adapter")
        staged, self._staged = self._staged, None
        metrics: dict[str, float] = {}
        if staged is None or not staged.same(adapter, version):
            if staged is not None:
                await self._remove(staged)
            staged = await self._check(adapter, version)
            metrics = staged.metrics
        was_running = not self._paused
        await self.pause()
        if not staged.added:
            if self._policy_in_base:
                await self._restore_base()
            staged = await self._add(staged)
            metrics = staged.metrics
        result, adapter_lps = await self._probe(staged)
        previous = self._version if self._adapter is not None else None
        self._adapter, self._version, self._served_probe = adapter, version, adapter_lps
        logger.info("rollout worker serves adapter v%d from %s", version, adapter.path)
        if was_running:
            await self.resume()
        if previous is not None:  # no request names it: the pause aborted them all
            await self._engine.remove_lora(previous)
        return metrics | result.to_metrics()

    def _check_push(self, adapter: AdapterFile, version: int, what: str) -> None:
        self._check_open()
        if not self._lora_rank:
            raise ValueError(f"{what}: this engine was started without LoRA (lora_rank 0)")
        if adapter.rank > self._lora_rank:
            raise ValueError(f"adapter rank {adapter.rank} > the engine's {self._lora_rank}")
        if version <= self._version:
            raise ValueError(f"{what}(version={version}): serving {self._version}")

    async def _check(self, adapter: AdapterFile, version: int) -> StagedAdapter:
        """Both files' sha256 against the writer's record, whether the adapter is zero, its
        sums as the engine will hold them (off the event loop)."""
        start = time.perf_counter()
        await asyncio.to_thread(verify_adapter_folder, adapter)
        zero = await asyncio.to_thread(adapter_is_zero, adapter)
        dtype = engine_lora_dtype(self._engine)
        expected = await asyncio.to_thread(adapter_checksums, adapter, dtype)
        metrics = {"sync/verify_s": time.perf_counter() - start}
        return StagedAdapter(adapter, version, zero, expected, metrics=metrics)

    async def _add(self, staged: StagedAdapter) -> StagedAdapter:
        """Add ``staged`` beside the served version (vLLM puts it in a slot at once) and read
        the slot back against the file; out again if the read-back fails."""
        adapter, version = staged.adapter, staged.version
        start = time.perf_counter()
        await add_adapter(self._engine, adapter, version)
        try:
            readback_s = await read_back(self._engine, adapter, version, version, staged.expected)
        except BaseException:
            await self._engine.remove_lora(version)
            raise
        metrics = staged.metrics | {
            "sync/adapter_readback_s": readback_s,
            "sync/adapter_add_s": time.perf_counter() - start,
        }
        return dataclasses.replace(staged, added=True, metrics=metrics)

    async def _probe_ahead(self, staged: StagedAdapter) -> StagedAdapter:
        """The adapter's probe request beside whatever the engine decodes, and the served
        version's (the batch's noise), with the verdict where ``ahead_verdict`` accepts it.
        Only on an engine that probed before (the base's log-probs cached, and the served
        version's), running, for an adapter not zero."""
        served = self._served_probe if self._adapter is not None else self._base_probe
        if staged.zero or self._paused or self._base_probe is None or served is None:
            return staged
        ids = self._probe_ids()
        served_request = None
        if self._adapter is not None:
            served_request = lora_request(self._adapter, self._version)
        lps, served_now = await asyncio.gather(
            prompt_logprobs(self._engine, ids, lora_request(staged.adapter, staged.version)),
            prompt_logprobs(self._engine, ids, served_request),
        )
        noise = max_abs_diff(served_now, served)
        staged = dataclasses.replace(
            staged, metrics=staged.metrics | {"sync/adapter_probe_noise": noise}
        )
        verdict = ahead_verdict(lps, self._base_probe, (served, served_now), staged.zero)
        if verdict is None:
            logger.info("adapter v%d: its probe ahead proves nothing", staged.version)
            return staged
        return dataclasses.replace(staged, probe=(verdict, lps))

    async def _probe(self, staged: StagedAdapter) -> tuple[ProbeResult, list[float]]:
        """The added ``staged``'s verdict and log-probs: its probe accepted ahead, else the
        probe (``lora.probe``) on the paused engine, where its requests are the only ones;
        out of the engine again if that one sees the base."""
        if staged.probe is not None:
            return staged.probe
        adapter, version = staged.adapter, staged.version
        try:
            adapter_lps, self._base_probe = await probe(
                self._engine,
                self._probe_ids(),
                lora_request(adapter, version),
                self._pause_idle_engine,
                self._base_probe,
            )
            result = ProbeResult(max_abs_diff(adapter_lps, self._base_probe), staged.zero)
            result.check(version, adapter.path)
        except BaseException:
            await self._engine.remove_lora(version)
            raise
        return result, adapter_lps

    def _probe_ids(self) -> list[int]:
        return probe_prompt(self._engine.vllm_config.model_config.get_vocab_size())

    async def _remove(self, staged: StagedAdapter) -> None:
        if staged.added:
            await self._engine.remove_lora(staged.version)

    async def _discard_staged(self) -> None:
        """A staged version not loaded (its push failed and is tried again): out of the
        engine, so the version's folder is read afresh."""
        staged, self._staged = self._staged, None
        if staged is not None:
            await self._remove(staged)

    async def verify_served_adapter(self) -> float:
        """Read the served adapter back from the engine and compare it with its folder as
        the folder is now (``lora_readback``); returns the seconds. A check for tests."""
        self._check_open()
        if self._adapter is None:
            raise ValueError("verify_served_adapter: no adapter is served")
        return await read_back(self._engine, self._adapter, self._version, self._version)

    async def base_probe_drift(self) -> float:
        """The probe prompt's base log-probs computed now against those every probe compares
        with, taken at the first (max abs difference: 0.0 where reusing them holds). A check
        for tests, while nothing else generates."""
        self._check_open()
        if self._base_probe is None:
            raise ValueError("base_probe_drift: no probe has run on this engine")
        await self.wait_until_running()
        base_lps = await prompt_logprobs(self._engine, self._probe_ids(), None)
        return max_abs_diff(base_lps, self._base_probe)

    async def adapter_versions(self) -> list[int]:
        """The versions whose adapters the engine holds (the served one, and one staged
        beside it until it is served). A check for tests."""
        self._check_open()
        return sorted(int(i) for i in await self._engine.list_loras())

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
        self._base_probe = self._served_probe = None  # taken again from the weights loaded
        logger.info("rollout worker restored the base weights of %s", self._model.path)

    async def _drop_adapter(self) -> None:
        """Full weights were loaded: with LoRA they are the merged policy, no adapter on top."""
        if not self._lora_rank:
            return
        await self._discard_staged()
        if self._adapter is not None:
            await self._engine.remove_lora(self._version)
        self._adapter, self._policy_in_base, self._served_probe = None, True, None
