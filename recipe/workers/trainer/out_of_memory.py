"""A trainer rank out of GPU memory in a forward or backward: one line that says what ran
out and what to change, instead of the allocator's traceback.

    TrainerWorker.update_actor / compute_log_prob / compute_ref_log_prob
        torch.OutOfMemoryError --> @reports_out_of_memory(phase)
            --> TrainerOutOfMemoryError(rank, phase, GPU figures, knobs to lower)
            --> Ray (RayTaskError) --> @fails_cleanly --> RunFailure --> "error: ..."

The figures are the rank's own (its PyTorch allocator) and the device's (free, total); the
rest of the device is other processes, which on a GPU shared with the rollout engines are
the engines at ``rollout.gpu_memory_utilization``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import torch

from recipe.faults import TrainerOutOfMemoryError
from recipe.workers.config import ActorConfig

UPDATE_PHASE = "update_actor"
"""The phase with a backward: the only one that ``actor.gradient_checkpointing`` helps."""
_SHARED_FRACTION = 0.1
"""Other processes holding at least this share of the GPU: it is shared with the engines
(colocated), so ``rollout.gpu_memory_utilization`` is a knob too."""
_GIB = 1024**3

P = ParamSpec("P")
R = TypeVar("R")


class _TrainerRank(Protocol):
    rank: int
    actor: ActorConfig


S = TypeVar("S", bound=_TrainerRank)


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """The current GPU at the moment of the error, in bytes."""

    free_bytes: int
    """Free on the device (``torch.cuda.mem_get_info``)."""
    total_bytes: int
    """The device's capacity."""
    reserved_bytes: int
    """Held by this process's PyTorch caching allocator (``torch.cuda.memory_reserved``)."""

    @property
    def others_bytes(self) -> int:
        """The rest: other processes, plus this process's CUDA context (under 1 GiB)."""
        return max(self.total_bytes - self.free_bytes - self.reserved_bytes, 0)

    @property
    def shared(self) -> bool:
        """Other processes hold a real share of the GPU (the engines, colocated)."""
        return self.others_bytes >= _SHARED_FRACTION * self.total_bytes


def read_gpu_memory() -> GpuMemory | None:
    """The current device's figures; None where they cannot be read (no CUDA, a broken
    context): reading them never raises a second error over the first."""
    # No torch.cuda.empty_cache() first: the figures describe the moment of the failure. The
    # traceback still pins the activations, so emptying the cache would only drop the cached
    # free blocks and understate what the rank held; and it can itself raise on a broken
    # context. The activations are freed when the error leaves the actor call.
    try:
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        reserved_bytes = torch.cuda.memory_reserved()
    except Exception:
        return None
    return GpuMemory(free_bytes, total_bytes, reserved_bytes)


def out_of_memory_fault(
    actor: ActorConfig, rank: int, phase: str, memory: GpuMemory | None
) -> TrainerOutOfMemoryError:
    """The fault for rank ``rank`` out of memory in ``phase``, with ``memory``'s figures."""
    return TrainerOutOfMemoryError(rank, phase, _figures(memory), _remedy(actor, phase, memory))


def reports_out_of_memory(
    phase: str,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Decorate a ``TrainerWorker`` entry point that runs forwards: ``torch.OutOfMemoryError``
    becomes ``TrainerOutOfMemoryError`` (its cause kept for ``RECIPE_DEBUG=1`` tracebacks,
    which then show where in the model memory ran out)."""

    def decorate(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(self, *args, **kwargs)
            except torch.OutOfMemoryError as exc:
                memory = read_gpu_memory()
                raise out_of_memory_fault(self.actor, self.rank, phase, memory) from exc

        return wrapper

    return decorate


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / _GIB:.1f} GiB"


def _figures(memory: GpuMemory | None) -> str:
    if memory is None:
        return "GPU memory figures unavailable"
    figures = (
        f"{_gib(memory.reserved_bytes)} held by its PyTorch allocator, "
        f"{_gib(memory.free_bytes)} free of {_gib(memory.total_bytes)}"
    )
    if not memory.shared:
        return figures
    return (
        f"{figures}; the remaining {_gib(memory.others_bytes)} is held by other processes, "
        "e.g. the engines at rollout.gpu_memory_utilization"
    )


def _remedy(actor: ActorConfig, phase: str, memory: GpuMemory | None) -> str:
    """The knobs that lower the peak, as one clause."""
    knobs = [_batch_knob(actor, phase)]
    if phase == UPDATE_PHASE and not actor.gradient_checkpointing:
        knobs.append("set actor.gradient_checkpointing=true")
    if memory is None or memory.shared:  # unknown figures: the engines may share the GPU
        knobs.append("lower rollout.gpu_memory_utilization")
    if len(knobs) == 1:
        return knobs[0]
    return f"{', '.join(knobs[:-1])}, or {knobs[-1]}"


def _batch_knob(actor: ActorConfig, phase: str) -> str:
    """The knob that bounds one forward's size in ``phase``."""
    if not actor.use_dynamic_bsz:  # fixed micro-batches, forwards with and without grad
        return (
            f"lower actor.ppo_micro_batch_size_per_gpu (now {actor.ppo_micro_batch_size_per_gpu})"
        )
    if phase == UPDATE_PHASE:
        return f"lower actor.ppo_max_token_len_per_gpu (now {actor.ppo_max_token_len_per_gpu})"
    if actor.log_prob_max_token_len_per_gpu is None:
        return (
            "set actor.log_prob_max_token_len_per_gpu below its default, twice "
            f"actor.ppo_max_token_len_per_gpu ({actor.log_prob_token_budget})"
        )
    return (
        f"lower actor.log_prob_max_token_len_per_gpu (now {actor.log_prob_max_token_len_per_gpu})"
    )
