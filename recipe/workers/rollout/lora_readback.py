"""Checksums of the adapter the engine holds, read back after each load and compared with the
pushed file's: the load fails unless the engine computes with exactly the pushed tensors.

    engine side   WeightUpdateExtension.lora_checksums(adapter_id): for every LoRA layer,
                  each slice's A and B in the adapter's slot of ``lora_a_stacked`` /
                  ``lora_b_stacked`` (the buffers the LoRA kernels read), keyed by the
                  checkpoint module the slice came from (``qkv_proj`` slice 0 -> ``q_proj``)
    file side     adapter_checksums(adapter, dtype): the same sums of the folder's tensors,
                  prepared as vLLM prepares them (cast to the served dtype, B times
                  ``alpha / rank``: vLLM merges the scaling into B before it copies B in);
                  computed before the pause, so only the engine's side is in it
    compare       every module of the file has the file's sums in the engine, every other
                  LoRA slot of the engine is zero (no leftover of an earlier adapter)

A checksum is (sum, sum of squares) in float64: what the engine holds differs from the file
in summation order only, so sums agree to ~1e-15 relative; any other difference (an older
adapter, a module not loaded, a wrong scaling) moves them far beyond ``REL_TOL``.
Tensor-parallel engines hold slices of A or of B depending on the layer; the read-back
compares the full tensors only at ``tensor_parallel_size`` 1 and skips otherwise (logged).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recipe.utils.adapter_file import AdapterFile
from recipe.workers.rollout.lora import AdapterNotServedError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Checksum = tuple[float, float, float, float]
"""(sum A, sum A², sum B, sum B²) of one module's adapter, float64."""
REL_TOL = 1e-9
"""Relative tolerance of a sum (float64 sums of the same values differ by ~1e-15)."""
ABS_TOL = 1e-9
"""Absolute tolerance, for sums near zero."""
_PEFT_PREFIX = "base_model.model."


class AdapterReadBackError(AdapterNotServedError):
    """The adapter weights the engine holds are not the pushed file's."""


def tensor_sums(tensor: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) of ``tensor`` in float64."""
    import torch

    wide = tensor.detach().to(device="cpu", dtype=torch.float64)
    return float(wide.sum()), float((wide * wide).sum())


def module_of(peft_name: str) -> tuple[str, bool]:
    """(module name as vLLM names it, is A) of a PEFT tensor name:
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` ->
    (``model.layers.0.self_attn.q_proj``, True)."""
    name = peft_name.removeprefix(_PEFT_PREFIX)
    for marker, is_a in ((".lora_A.", True), (".lora_B.", False)):
        if marker in name:
            return name.split(marker)[0], is_a
    raise ValueError(f"adapter tensor {peft_name!r} is neither lora_A nor lora_B")


@dataclass(frozen=True, slots=True)
class AdapterSums:
    """A pushed folder's checksums, its tensors prepared as an engine of ``dtype`` holds them."""

    dtype: str
    """The engine's LoRA dtype they were computed in (``torch.float32``)."""
    modules: dict[str, Checksum]
    """Per module, as vLLM names it."""


def engine_lora_dtype(engine: Any) -> str:
    """The LoRA dtype of an ``AsyncLLM`` engine (vLLM resolves ``auto`` to the model's)."""
    return str(engine.vllm_config.lora_config.lora_dtype)


def adapter_checksums(adapter: AdapterFile, dtype_name: str) -> AdapterSums:
    """The folder's checksums per module, its tensors prepared as the engine prepares them
    (module docstring); ``dtype_name`` is the engine's LoRA dtype (``torch.float32``)."""
    import torch
    from safetensors import safe_open

    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    scaling = adapter.alpha / adapter.rank
    sums: dict[str, list[float]] = {}
    with safe_open(adapter.weights_path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            module, is_a = module_of(name)
            tensor = f.get_tensor(name).to(dtype)
            if not is_a and scaling != 1:
                tensor *= scaling  # in the served dtype, as vLLM's LoRALayerWeights.optimize
            offset = 0 if is_a else 2
            sums.setdefault(module, [0.0] * 4)[offset : offset + 2] = tensor_sums(tensor)
    return AdapterSums(dtype_name, {m: (s[0], s[1], s[2], s[3]) for m, s in sums.items()})


def first_difference(expected: Mapping[str, Checksum], served: Mapping[str, Checksum]) -> str:
    """The first module whose served checksums differ from the file's ('' when none do):
    a module of the file must hold its sums, every other served module must be zero."""
    zero: Checksum = (0.0, 0.0, 0.0, 0.0)
    for module in sorted(expected.keys() | served.keys()):
        want = expected.get(module, zero)
        if module not in served:
            return f"{module} holds no LoRA weights in the engine"
        got = served[module]
        close = (
            math.isclose(w, g, rel_tol=REL_TOL, abs_tol=ABS_TOL)
            for w, g in zip(want, got, strict=True)
        )
        if not all(close):
            return (
                f"{module}: the engine holds (sum A, A², B, B²) {_fmt(got)}, the file {_fmt(want)}"
            )
    return ""


def _fmt(checksum: Checksum) -> str:
    return "(" + ", ".join(f"{x:.9g}" for x in checksum) + ")"


def check_read_back(
    expected: Mapping[str, Checksum], served: Mapping[str, Checksum], version: int, path: str
) -> None:
    """``AdapterReadBackError`` naming the version, the folder and the first difference."""
    if not expected:
        raise AdapterReadBackError(f"adapter v{version} at {path} holds no LoRA tensors")
    difference = first_difference(expected, served)
    if difference:
        raise AdapterReadBackError(
            f"adapter v{version} at {path} is not what the engine serves: {difference}"
        )


async def read_back(
    engine: Any,
    adapter: AdapterFile,
    adapter_id: int,
    version: int,
    expected: AdapterSums | None = None,
) -> float:
    """Read the engine's adapter ``adapter_id`` back (every worker; rank 0 compared) and
    check it against ``adapter``'s file (``expected``: its sums computed beforehand, outside
    the pause); returns the seconds it took."""
    start = time.perf_counter()
    replies = await engine.collective_rpc("lora_checksums", args=(adapter_id,))
    reply = replies[0]
    if reply["tp_size"] > 1:
        logger.warning(
            "adapter v%d: checksums not read back at tensor_parallel_size %d (slices)",
            version,
            reply["tp_size"],
        )
        return time.perf_counter() - start
    if not reply["active"]:
        raise AdapterReadBackError(
            f"adapter v{version} at {adapter.path} is in no LoRA slot of the engine"
        )
    served: dict[str, Checksum] = {m: tuple(sums) for m, sums in reply["modules"].items()}
    if expected is None or expected.dtype != reply["dtype"]:
        expected = await asyncio.to_thread(adapter_checksums, adapter, reply["dtype"])
    check_read_back(expected.modules, served, version, adapter.path)
    return time.perf_counter() - start
