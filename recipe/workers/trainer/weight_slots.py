"""``WeightSlots``: named copies of a module's local parameter shards (FSDP2 or plain).

The fully-async trainer computes old log-probs with the weights it last pushed, after it has
trained past them: it saves them into a slot at the push and swaps them in for the forward.
A slot lives on the parameters' device when the device has room to spare (a device copy each
way, ~1,000x faster than a host round trip on a GPU) and in pinned host memory otherwise:

    save(slot)        device copy if free memory after it >= max(4 GiB, 25% of the device),
                      else pinned CPU
    swapped_in(slot)  stash the live weights (device if >= 2 GiB stays free, else CPU),
                      copy the slot in, yield, copy the stash back

Copies are always fresh buffers (never views), also when the parameters live on CPU, so
training after ``save`` cannot change a saved slot.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from recipe.workers.trainer.fsdp_utils import reshard_all

_CURRENT = "__current__"
_GIB = 1 << 30


def _local_shards(module: nn.Module, trainable_only: bool) -> Iterator[torch.Tensor]:
    """This rank's local shard of every parameter (``trainable_only``: of those that require
    grad) (a view: writes update the parameter)."""
    for param in module.parameters():
        if trainable_only and not param.requires_grad:
            continue
        data = param.detach()
        yield data.to_local() if isinstance(data, DTensor) else data


def _fits_on_device(
    tensors: list[torch.Tensor], *, keep_free_bytes: int, keep_share: float
) -> bool:
    """True on CPU; on CUDA, True when a copy of ``tensors`` leaves at least
    ``max(keep_free_bytes, keep_share x device memory)`` free."""
    if not tensors or not tensors[0].is_cuda:
        return True
    num_bytes = sum(t.numel() * t.element_size() for t in tensors)
    free_bytes, total_bytes = torch.cuda.mem_get_info(tensors[0].device)
    return free_bytes - num_bytes >= max(keep_free_bytes, keep_share * total_bytes)


class WeightSlots:
    """Named copies of ``module``'s local parameter shards (see the module docstring)."""

    def __init__(
        self, module: nn.Module, *, pin_memory: bool = False, trainable_only: bool = False
    ):
        """``trainable_only``: slots hold the parameters that require grad alone (a LoRA
        adapter over a frozen base, which never changes)."""
        self._module = module
        self._trainable_only = trainable_only
        self._pin_memory = pin_memory
        self._slots: dict[str, list[torch.Tensor]] = {}

    @torch.no_grad()
    def save(self, slot: str) -> None:
        reshard_all(self._module)  # only sharded (DTensor) parameters are the weights
        current = list(_local_shards(self._module, self._trainable_only))
        self._slots.pop(slot, None)  # its memory counts as free for the new copy
        if _fits_on_device(current, keep_free_bytes=4 * _GIB, keep_share=0.25):
            self._slots[slot] = [t.clone() for t in current]
        else:
            self._slots[slot] = [self._host_copy(t) for t in current]

    def _host_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=self._pin_memory).copy_(
            tensor
        )

    def restore(self, slot: str) -> None:
        if slot not in self._slots:
            raise ValueError(f"no weights saved under slot {slot!r}: {sorted(self._slots)}")
        self._copy_into_module(self._slots[slot])

    def drop(self, slot: str) -> None:
        self._slots.pop(slot, None)

    def __contains__(self, slot: str) -> bool:
        return slot in self._slots

    def on_device(self, slot: str) -> bool:
        """Whether ``slot`` lives on a CUDA device (else in host memory)."""
        return bool(self._slots[slot]) and self._slots[slot][0].is_cuda

    @contextmanager
    def swapped_in(self, slot: str) -> Iterator[None]:
        """The module holds ``slot``'s weights inside the block and its own again after."""
        reshard_all(self._module)
        current = list(_local_shards(self._module, self._trainable_only))
        if _fits_on_device(current, keep_free_bytes=2 * _GIB, keep_share=0.0):
            with torch.no_grad():
                stash = [t.clone() for t in current]
            restore_current = functools.partial(self._copy_into_module, stash)
        else:
            self._slots[_CURRENT] = [self._host_copy(t) for t in current]
            restore_current = functools.partial(self.restore, _CURRENT)
        try:
            self.restore(slot)
            yield
        finally:
            restore_current()
            self.drop(_CURRENT)

    @torch.no_grad()
    def _copy_into_module(self, tensors: list[torch.Tensor]) -> None:
        reshard_all(self._module)
        for local, saved in zip(
            _local_shards(self._module, self._trainable_only), tensors, strict=True
        ):
            local.copy_(saved)
