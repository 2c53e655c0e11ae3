"""LoRA on the engine side: the base loaded once, the trained adapter served by one name.

    engine start   enable_lora, max_lora_rank = actor.lora.rank, one adapter slot
    load_adapter   verify the folder (sha256 of both files; ahead, while serving, when the
                   push was staged) -> remove the old adapter -> add the new one under the
                   same name and id, from its version's folder -> reset the prefix cache
                   -> probe: a fixed prompt's log-probs under the adapter vs the base
                   -> read back: the engine's adapter slot vs the file (lora_readback.py)
    every request  ``LoRARequest(ADAPTER_NAME, ADAPTER_ID, path)`` of the served version

One name replaced in place, not a name per version: a push pauses the engine with every
request aborted and resumes the partial responses on the new version (base.py's invariant),
so no request ever runs across two adapters and a name per version would buy nothing but an
eviction rule and ``max_loras`` slots. The price of one name is that vLLM keys prefix-cache
blocks by the adapter's name (and, in newer releases, its path): the load resets the prefix
cache, or the next requests could reuse KV computed under the previous adapter. A push
writes each version to a folder of its own (``adapter-v<N>``), so the folder an engine
serves is never rewritten while a push is staged beside it.

Never a silent base policy: once an adapter was pushed, a request of a LoRA engine without
one raises (``AdapterMissingError``), and the probe after each load fails the push when the
served log-probs equal the base's although the adapter is not zero (``AdapterNotServedError``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from recipe.utils.adapter_file import AdapterFile

ADAPTER_NAME = "policy"
"""The one name the trained adapter is served under (module docstring)."""
ADAPTER_ID = 1
"""vLLM's integer id of that adapter (any positive int; one slot)."""
PROBE_PROMPT_LEN = 24
"""Tokens of the fixed probe prompt (ids ``1..24`` modulo the vocabulary)."""


class AdapterMissingError(RuntimeError):
    """A LoRA engine was asked to generate past version 0 without a loaded adapter."""


class AdapterNotServedError(RuntimeError):
    """The probe after an adapter load saw the base policy's log-probs."""


def lora_engine_args(rank: int) -> dict[str, Any]:
    """vLLM engine args for an adapter of ``rank`` (0: LoRA off, no args). One slot on the
    device and one in the CPU cache: only the served adapter is ever loaded."""
    if rank == 0:
        return {}
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1, "max_cpu_loras": 1}


def probe_prompt(vocab_size: int) -> list[int]:
    """The fixed prompt of the post-load probe."""
    return [1 + i % max(vocab_size - 1, 1) for i in range(PROBE_PROMPT_LEN)]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The post-load probe: the fixed prompt's log-probs under the adapter and the base."""

    max_abs_diff: float
    """max over prompt tokens of |adapter log-prob - base log-prob| (nats)."""
    adapter_is_zero: bool
    """Every ``lora_B`` of the folder is zero: the adapter is the base (a fresh one is)."""

    def check(self, version: int, path: str) -> None:
        """``AdapterNotServedError`` when the engine served the base for a non-zero adapter."""
        if self.max_abs_diff == 0.0 and not self.adapter_is_zero:
            raise AdapterNotServedError(
                f"adapter v{version} at {path} is loaded but the engine serves the base policy "
                "(its probe log-probs equal the base's)"
            )

    def to_metrics(self) -> dict[str, float]:
        return {"sync/adapter_probe_diff": self.max_abs_diff}


def adapter_is_zero(adapter: AdapterFile) -> bool:
    """True when every ``lora_B`` tensor of the folder is zero (B @ A adds nothing)."""
    from safetensors import safe_open

    with safe_open(adapter.weights_path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            if "lora_B" in name and bool(f.get_tensor(name).any()):
                return False
    return True


def max_abs_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise RuntimeError(f"probe log-probs of {len(a)} and {len(b)} tokens")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def lora_request(adapter: AdapterFile) -> Any:
    """vLLM's request for the served adapter (the same name and id at every version)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, adapter.path)


async def swap_adapter(engine: Any, adapter: AdapterFile, *, replace: bool) -> None:
    """Load ``adapter`` into the (paused) engine under the served name, removing the one it
    served (``replace``), then reset the prefix cache (module docstring: same name and path,
    so cached blocks of the old adapter would match)."""
    if replace:
        await engine.remove_lora(ADAPTER_ID)
    if not await engine.add_lora(lora_request(adapter)):
        raise RuntimeError(f"vLLM did not load the adapter at {adapter.path}")
    await engine.reset_prefix_cache()


async def prompt_logprobs(engine: Any, prompt_ids: list[int], request: Any) -> list[float]:
    """Log-probs of ``prompt_ids[1:]`` under the engine's weights (+ ``request``'s adapter)."""
    import uuid

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    final = None
    request_id = f"adapter-probe-{uuid.uuid4().hex[:12]}"
    async for out in engine.generate(
        {"prompt_token_ids": prompt_ids}, params, request_id, lora_request=request
    ):
        final = out
    if final is None or final.prompt_logprobs is None:
        raise RuntimeError("the adapter probe got no prompt log-probs from the engine")
    per_token = final.prompt_logprobs[1:]
    return [float(lps[tok].logprob) for tok, lps in zip(prompt_ids[1:], per_token, strict=True)]


async def probe(
    engine: Any,
    prompt_ids: list[int],
    served: Any,
    adapter_zero: bool,
    pause_again: Callable[[], Awaitable[Any]],
) -> ProbeResult:
    """``prompt_ids``' log-probs under the served adapter (``served``) and under the base, on
    a paused engine: its scheduler runs for the two requests, then ``pause_again``."""
    resume = getattr(engine, "resume_generation", None)
    if resume is not None:
        await resume()
    try:
        adapter_lps = await prompt_logprobs(engine, prompt_ids, served)
        base_lps = await prompt_logprobs(engine, prompt_ids, None)
    finally:
        await pause_again()
    return ProbeResult(max_abs_diff(adapter_lps, base_lps), adapter_zero)


async def cached_prompt_tokens(engine: Any, prompt_ids: list[int], request: Any) -> int:
    """How many of ``prompt_ids`` the prefix cache served for one greedy token (a check)."""
    import uuid

    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    cached = 0
    request_id = f"cache-check-{uuid.uuid4().hex[:12]}"
    async for out in engine.generate(
        {"prompt_token_ids": prompt_ids}, params, request_id, lora_request=request
    ):
        cached = getattr(out, "num_cached_tokens", None) or cached
    return cached
