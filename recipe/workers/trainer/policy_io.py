"""``PolicyIO``: the weights half of ``TrainerWorker`` (worker.py, which mixes it in): the
policy's weights in and out of one FSDP2 rank.

    CPU slots          save_model_to_cpu / restore_model_from_cpu / drop_cpu_slot (and
                       ``_swapped_in`` for a forward or an export on a saved copy)
    pushes             iter_full_params -> iter_push_params (engine dtype) -> WeightSender;
                       weight_metadata: their names, shapes and dtypes, in order
    files              export_weights (one safetensors file), export_adapter (a PEFT folder)
    checkpoints        save_hf / load_hf (with LoRA: the adapter and its base's record),
                       save_train_state / load_train_state (optimizer, LR schedule, RNG)

Every method that gathers full tensors is collective: all ranks call it together.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from recipe.utils.adapter_file import AdapterFile
from recipe.utils.weights_file import WeightsFile, write_weights
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.adapter_io import AdapterIO
from recipe.workers.trainer.fsdp_utils import (
    PolicyModule,
    copy_tokenizer,
    full_tensor_metadata,
    iter_full_tensors,
    load_full_state_dict,
    reshard_all,
)
from recipe.workers.trainer.lora import merge_delta, merged_stream
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.train_state import load_train_state, save_train_state
from recipe.workers.trainer.weight_slots import WeightSlots


class PolicyIO:
    """Weights in and out of one trainer rank (module docstring); ``TrainerWorker`` builds
    the state it reads."""

    actor: ActorConfig
    spec: TrainerSpec
    rank: int
    world_size: int
    device: torch.device
    _policy: PolicyModule
    _slots: WeightSlots
    _adapter: AdapterIO | None
    _optimizer: torch.optim.Optimizer
    _scheduler: Any

    # ---- weights --------------------------------------------------------------------------

    def save_model_to_cpu(self, slot: str) -> None:
        """Copy this rank's parameter shards into ``slot`` (real copies, never views): on the
        device when it has room to spare, else pinned CPU (weight_slots.py)."""
        self._slots.save(slot)

    def restore_model_from_cpu(self, slot: str) -> None:
        """Overwrite this rank's parameter shards with the copy saved under ``slot``."""
        self._slots.restore(slot)

    def drop_cpu_slot(self, slot: str) -> None:
        self._slots.drop(slot)

    def _swapped_in(self, slot: str) -> AbstractContextManager[None]:
        return self._slots.swapped_in(slot)

    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) HF-named tensors on this rank's device, tied weights once.
        Collective: all ranks must iterate together. At world size 1 a tensor may alias the
        live weight: consume it before the next optimizer step. With LoRA: the merged policy
        (``W + alpha / rank * B @ A``) under the base's names."""
        reshard_all(self._policy)
        if not self.actor.lora.enabled:
            yield from iter_full_tensors(self._policy.lm)
            return
        yield from merged_stream(iter_full_tensors(self._policy.lm), merge_delta(self.actor.lora))

    def iter_push_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``iter_full_params`` in the engines' dtype (``model.dtype``, the compute dtype):
        a bfloat16 engine is sent half the bytes of the float32 master weights, cast on this
        rank's device before packing. Collective."""
        dtype = getattr(torch, self.spec.compute_dtype)
        for name, tensor in self.iter_full_params():
            yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor

    def weight_metadata(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, full shape, dtype) of every tensor ``iter_push_params`` yields, in order."""
        floating = {"float32", "float64", "bfloat16", "float16"}
        live = [
            (name, (shape, dtype)) for name, shape, dtype in full_tensor_metadata(self._policy.lm)
        ]
        named = merged_stream(live, lambda w, a, b: w) if self.actor.lora.enabled else live
        return [
            (name, shape, self.spec.compute_dtype if dtype in floating else dtype)
            for name, (shape, dtype) in named
        ]

    def weight_sender_call(self, method: str, *args: object) -> object:
        """``WeightSender.<method>(*args)`` of this rank (``recipe.checkpoint_engine``): the
        trainer's end of weight pushes, created on first use."""
        sender = getattr(self, "_weight_sender", None)
        if sender is None:
            from recipe.checkpoint_engine.endpoints import WeightSender

            sender = self._weight_sender = WeightSender(
                self.rank, self.iter_push_params, self.device
            )
        return sender.call(method, *args)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF state dict on CPU on rank 0 (empty elsewhere). Collective."""
        full = {}
        for name, tensor in self.iter_full_params():
            if self.rank == 0:
                full[name] = tensor.to("cpu", copy=True)  # never alias live weights
        return full

    def export_weights(self, path: str, slot: str | None = None) -> WeightsFile | None:
        """Rank 0 writes the full HF-named tensors to one safetensors file (written aside,
        then renamed, so a reader never sees half a file) and returns its record (bytes,
        checksum); other ranks return None.
        ``slot``: export the copy ``save_model_to_cpu(slot)`` saved instead of the live
        weights (swapped in and back out). Collective."""
        if slot is not None:
            with self._swapped_in(slot):
                return self.export_weights(path)
        state_dict = self.full_state_dict()
        return write_weights(state_dict, path) if self.rank == 0 else None

    # ---- LoRA adapter ---------------------------------------------------------------------

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's full tensors under PEFT's names, on CPU on rank 0 (empty elsewhere).
        Collective."""
        return self._adapter_io("adapter_state_dict").state_dict()

    def export_adapter(self, directory: str, slot: str | None = None) -> AdapterFile | None:
        """Rank 0 writes the adapter as a PEFT folder (``recipe.utils.adapter_file``: written
        aside, then renamed) and returns its record; other ranks return None. In the engines'
        dtype (``model.dtype``, as ``iter_push_params``): vLLM casts an adapter to it on load,
        so a bfloat16 engine serves the same weights from half the bytes. ``slot``: the
        adapter ``save_model_to_cpu(slot)`` saved. Collective."""
        adapter = self._adapter_io("export_adapter")
        dtype = getattr(torch, self.spec.compute_dtype)
        if slot is None:
            return adapter.export(directory, dtype)
        with self._swapped_in(slot):
            return adapter.export(directory, dtype)

    def _adapter_io(self, what: str) -> AdapterIO:
        if self._adapter is None:
            raise ValueError(f"{what} needs actor.lora.rank > 0 (this trainer trains no adapter)")
        return self._adapter

    def save_hf(self, path: str | Path) -> None:
        """Rank 0 writes an HF directory (weights, config, tokenizer when the source has one);
        with LoRA the adapter folder and the base's record instead. Collective."""
        if self.actor.lora.enabled:
            self._adapter_io("save_hf").save_checkpoint(path)
            return
        state_dict = self.full_state_dict()
        if self.rank == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
            self._policy.lm.save_pretrained(path, state_dict=state_dict)
            copy_tokenizer(self.spec.model_path, path)
        if self.world_size > 1:
            dist.barrier()

    def load_hf(self, path: str | Path) -> None:
        """Load policy weights from an HF directory (every rank reads it); optimizer untouched.
        With LoRA: the adapter of a ``save_hf`` checkpoint, refused unless its base is ours."""
        from transformers import AutoModelForCausalLM

        if self.actor.lora.enabled:
            self._adapter_io("load_hf").load_checkpoint(path)
            return

        source = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        reshard_all(self._policy)
        load_full_state_dict(self._policy.lm, source.state_dict())

    # ---- optimizer, LR schedule and RNG (checkpoints) ---------------------------------------

    def save_train_state(self, path: str | Path) -> None:
        """Optimizer, LR schedule and RNG into the directory ``path``
        (``recipe.workers.trainer.train_state.save_train_state``). Collective."""
        save_train_state(self._policy, self._optimizer, self._scheduler, path, self.rank)

    def load_train_state(self, path: str | Path) -> None:
        """Set the optimizer, LR schedule and this rank's RNG from ``save_train_state``'s
        files. Load the weights first (``load_hf``). Collective."""
        load_train_state(self._policy, self._optimizer, self._scheduler, path, self.rank)
