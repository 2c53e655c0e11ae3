"""Methods mixed into vLLM's worker class for weight updates and checks.

vLLM injects this class into its worker when the engine is built with
``worker_extension_cls="recipe.workers.rollout.vllm_extension.WeightUpdateExtension"``; the
engine then reaches these methods through ``collective_rpc(name, args=...)`` on every
worker (each tensor-parallel rank loads its own shard from the same full tensors).

Arguments travel by path: tensors passed through ``collective_rpc`` are serialised as
nested lists, so the file path goes across and each worker reads the file itself. Pushed
weights (``weight_receiver_call``, see ``recipe.checkpoint_engine``) likewise arrive through
shared memory or a process group; only plans, names and handles cross ``collective_rpc``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)


def iter_safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from a safetensors file one tensor at a time (bounded memory)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            yield name, f.get_tensor(name)


def rank_path(path: str, rank: int) -> str:
    """Where tensor-parallel rank ``rank`` writes a per-worker file asked for at ``path``:
    ``path`` itself for rank 0, ``<path>.rank<r>`` for the others (each holds its shards)."""
    return path if rank == 0 else f"{path}.rank{rank}"


def _tp_rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def _refresh_tied_heads(model: torch.nn.Module) -> None:
    """Re-run weight processing of unquantized heads tied to the input embedding.

    A tied LM head has no tensor of its own in the checkpoint, so vLLM's in-place reload
    skips its post-load processing; on vLLM-CPU that processing packs the weight for the
    GEMM kernel, and the head would keep computing logits from the old weights. Rerunning
    the unquantized method is cheap and idempotent (a no-op on GPUs).
    """
    num_owners: dict[int, int] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            num_owners[id(weight)] = num_owners.get(id(weight), 0) + 1
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        tied = weight is not None and num_owners.get(id(weight), 0) > 1
        if tied and method is not None and type(method).__name__ == "UnquantizedEmbeddingMethod":
            method.process_weights_after_loading(module)


def _lora_slices(manager: Any, adapter_index: int) -> dict[str, tuple[float, ...]]:
    """(sum A, A², B, B²) of each LoRA layer slice in slot ``adapter_index``, keyed by the
    checkpoint module the slice holds (``lora_readback``'s engine side). Summed in float64
    where the buffers are, then copied off the device at once (a read-back inside a pause)."""
    packed = getattr(manager, "packed_modules", {})
    names: list[str] = []
    sums: list[torch.Tensor] = []
    with torch.no_grad():
        for module_name, module in manager.modules.items():
            a_stacked = getattr(module, "lora_a_stacked", None)
            b_stacked = getattr(module, "lora_b_stacked", None)
            if a_stacked is None or b_stacked is None:  # MoE / embedding layers: untargetable
                continue
            slice_names = packed.get(module_name, [module_name])
            if len(slice_names) != len(a_stacked):
                slice_names = [f"{module_name}[{i}]" for i in range(len(a_stacked))]
            for name, a, b in zip(slice_names, a_stacked, b_stacked, strict=True):
                wide_a, wide_b = a[adapter_index].double(), b[adapter_index].double()
                names.append(name)
                sums.append(
                    torch.stack(
                        [
                            wide_a.sum(),
                            (wide_a * wide_a).sum(),
                            wide_b.sum(),
                            (wide_b * wide_b).sum(),
                        ]
                    )
                )
    values = torch.stack(sums).cpu().tolist() if sums else []
    return {name: tuple(row) for name, row in zip(names, values, strict=True)}


def _lora_dtype(manager: Any) -> str:
    """The dtype of the LoRA buffers (``torch.float32``): vLLM's resolved ``lora_dtype``."""
    for module in manager.modules.values():
        stacked = getattr(module, "lora_a_stacked", None)
        if stacked:
            return str(stacked[0].dtype)
    raise RuntimeError("the engine's LoRA manager wraps no linear layer")


def _kernel_weight_t(module: torch.nn.Module) -> torch.Tensor | None:
    """W^T of a GEMM layer computed by its own quant method (None if not a GEMM layer)."""
    method = getattr(module, "quant_method", None)
    weight = getattr(module, "weight", None)
    in_features = getattr(module, "input_size_per_partition", None)
    if in_features is None:
        in_features = getattr(module, "embedding_dim", None)
    if method is None or not hasattr(method, "apply") or weight is None or not in_features:
        return None
    identity = torch.eye(int(in_features), dtype=weight.dtype, device=weight.device)
    return method.apply(module, identity, bias=None)


class WeightUpdateExtension:
    """Mixed into vLLM's worker: ``self`` has ``model_runner`` and ``vllm_config``."""

    def load_weights_from_safetensors(self, path: str) -> int:
        """Load full HF-named checkpoint tensors from ``path`` in place; returns the count.

        Prefers the model runner's in-place ``reload_weights`` (it re-runs the per-layer
        weight processing, e.g. vLLM-CPU's GEMM repacking, which a bare ``load_weights``
        after start would skip); older vLLM without it falls back to ``load_weights``.
        """
        num_tensors = self._load_checkpoint_tensors(iter_safetensors(path))
        logger.info("loaded %d tensors from %s", num_tensors, path)
        return num_tensors

    def _load_checkpoint_tensors(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load ``(HF name, full tensor)`` pairs in place (as ``load_weights_from_safetensors``
        describes); returns the count."""
        from vllm.config import set_current_vllm_config

        runner = self.model_runner  # type: ignore[attr-defined]
        num_tensors = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal num_tensors
            for item in weights:
                num_tensors += 1
                yield item

        reload = getattr(runner, "reload_weights", None)
        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        with set_current_vllm_config(vllm_config), torch.no_grad():
            if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
                reload(weights_iterator=counted(), is_checkpoint_format=True)
                _refresh_tied_heads(runner.model)
            else:
                runner.model.load_weights(weights=counted())
        return num_tensors

    def weight_receiver_call(self, method: str, *args: Any) -> Any:
        """``WeightReceiver.<method>(*args)`` of this worker (``recipe.checkpoint_engine``):
        staging, verification and loading of pushed weights, created on first use."""
        receiver = getattr(self, "_weight_receiver", None)
        if receiver is None:
            from recipe.checkpoint_engine.endpoints import WeightReceiver

            receiver = WeightReceiver(
                self._load_checkpoint_tensors,
                self.device,  # type: ignore[attr-defined]
                self.local_rank,  # type: ignore[attr-defined]
            )
            self._weight_receiver = receiver
        return receiver.call(method, *args)

    def read_back_weights(self, path: str) -> int:
        """Write the weights this worker's kernels compute with to ``path`` (safetensors;
        tensor-parallel rank r > 0 to ``rank_path(path, r)``: its shards); returns the tensor
        count. A diagnostic for tests: one GEMM per layer.

        Non-empty parameters are written under their vLLM names. Every layer with a GEMM
        method (linear layers, the vocabulary embedding that doubles as a tied LM head) is
        also read back through its own kernel as ``<module>.weight@kernel``: applied to the
        identity matrix it returns W^T exactly (each output is one weight times 1 plus exact
        zeros), so this is what the kernel multiplies by, bit for bit, also where vLLM-CPU
        repacked the weight into a kernel-owned buffer and left the parameter empty.
        """
        from safetensors.torch import save_file

        model = self.model_runner.model  # type: ignore[attr-defined]
        tensors: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.numel() > 0:
                    tensors[name] = param.detach().cpu().clone()
            for name, module in model.named_modules():
                weight_t = _kernel_weight_t(module)
                if weight_t is not None:
                    tensors[f"{name}.weight@kernel"] = weight_t.t().contiguous().cpu()
        save_file(tensors, rank_path(path, _tp_rank()))
        return len(tensors)

    def lora_checksums(self, adapter_id: int) -> dict[str, Any]:
        """Checksums of adapter ``adapter_id`` as this worker's LoRA kernels hold it (the
        slot's ``lora_a_stacked`` / ``lora_b_stacked``; ``lora_readback`` compares them):
        ``{"active": in a slot, "dtype": the LoRA dtype, "tp_size": tensor-parallel size,
        "modules": {checkpoint module: (sum A, A², B, B²)}}``."""
        from vllm.distributed import get_tensor_model_parallel_world_size

        worker_manager = getattr(self.model_runner, "lora_manager", None)  # type: ignore[attr-defined]
        manager = getattr(worker_manager, "_adapter_manager", None)
        slots = getattr(manager, "lora_index_to_id", None)
        if manager is None or slots is None:
            raise RuntimeError(
                "this vLLM keeps no LoRA slots at model_runner.lora_manager._adapter_manager"
                ".lora_index_to_id: the served adapter cannot be read back"
            )
        reply: dict[str, Any] = {
            "active": adapter_id in slots,
            "dtype": _lora_dtype(manager),
            "tp_size": get_tensor_model_parallel_world_size(),
            "modules": {},
        }
        if reply["active"]:
            reply["modules"] = _lora_slices(manager, slots.index(adapter_id))
        return reply

    def weight_checksums(self) -> dict[str, float]:
        """Sum of each named parameter in float64, keyed by vLLM's parameter name.

        vLLM fuses some checkpoint tensors (``qkv_proj``, ``gate_up_proj``); a sum over a
        fused parameter equals the sum of the sums of its parts, so callers can compare
        against a checkpoint without knowing the fused layout's order. Empty parameters are
        left out: vLLM-CPU repacks linear weights into kernel-owned buffers and leaves the
        parameter empty, so only what stays a parameter (embeddings, norms, biases) is summed.
        """
        model = self.model_runner.model  # type: ignore[attr-defined]
        return {
            name: float(param.detach().to(torch.float64).sum())
            for name, param in model.named_parameters()
            if param.numel() > 0
        }
