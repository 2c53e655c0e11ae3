"""The registry of weight transports: one line per ``checkpoint_engine.backend``.

Each line names a transport, how a push moves the weights, the ``CheckpointEngine`` class that
moves them (``package.module:Class``, imported only when an end is built: the config schema
loads this module, and a bad command line must fail before torch is imported) and the
placement it needs::

    moves   BUCKETS   a CheckpointEngine streams the layout's buckets into staging on every
                      receiver; staged while serving when the engines' owner allows it
            FILE      trainer rank 0 writes one safetensors file each replica checks and loads
            ADAPTER   LoRA: the adapter's PEFT folder alone (chosen by ``actor.lora``, not by
                      ``checkpoint_engine.backend``)

The order of ``TRANSPORTS`` is ``backend=auto``'s preference: the first ``auto`` line whose
``fits`` holds for the placement is chosen. ``checkpoint_engine.backend``'s choices are
``auto`` and every ``configurable`` line. Adding a transport: one line here and the file of
its ``CheckpointEngine`` (recipe/checkpoint_engine/base.py says what it implements).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BUCKETS, FILE, ADAPTER = "buckets", "file", "adapter"
AUTO = "auto"
ADAPTER_BACKEND = "adapter"
"""The transport of a LoRA run (``actor.lora.rank > 0``)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where trainer rank 0 and the engine workers run, as the ``fits`` checks read it."""

    one_host: bool
    """Every engine worker is on trainer rank 0's host."""
    cuda: bool
    """Trainer rank 0 and every engine worker hold a CUDA device."""
    same_gpu: bool
    """... and it is one GPU for all of them."""


def _anywhere(_: Placement) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Transport:
    """One registry line (module docstring)."""

    name: str
    moves: str
    """``BUCKETS``, ``FILE`` or ``ADAPTER``."""
    engine: str = ""
    """``package.module:Class`` of the ``CheckpointEngine`` (``BUCKETS`` only)."""
    fits: Callable[[Placement], bool] = _anywhere
    needs: str = ""
    """What ``fits`` asks for, in the error of an explicit choice that does not fit."""
    auto: bool = False
    """A candidate of ``backend=auto``."""
    configurable: bool = True
    """A choice of ``checkpoint_engine.backend``."""

    @property
    def stages(self) -> bool:
        """Moves the weights into staging before the load (the engines may still serve)."""
        return self.moves == BUCKETS


_SHARED = "recipe.checkpoint_engine.shared_region:SharedRegionEngine"
_BROADCAST = "recipe.checkpoint_engine.broadcast:BroadcastEngine"

# fmt: off
TRANSPORTS: tuple[Transport, ...] = (
    Transport("cuda_ipc", BUCKETS, _SHARED, lambda p: p.same_gpu, "trainer rank 0 and every engine on one GPU", auto=True),  # noqa: E501
    Transport("nccl", BUCKETS, _BROADCAST, lambda p: p.cuda, "CUDA devices on trainer rank 0 and every engine", auto=True),  # noqa: E501
    Transport("shm", BUCKETS, _SHARED, lambda p: p.one_host, "trainer rank 0 and every engine on one host", auto=True),  # noqa: E501
    Transport("gloo", BUCKETS, _BROADCAST, auto=True),
    Transport("file", FILE),
    Transport(ADAPTER_BACKEND, ADAPTER, configurable=False),
)
# fmt: on


def backend_choices() -> tuple[str, ...]:
    """``checkpoint_engine.backend``'s choices: ``auto`` and every configurable transport."""
    return (AUTO, *(t.name for t in TRANSPORTS if t.configurable))


def engine_backends() -> tuple[str, ...]:
    """The transports moved by a ``CheckpointEngine``."""
    return tuple(t.name for t in TRANSPORTS if t.moves == BUCKETS)


def get_transport(name: str) -> Transport:
    """The registry line of ``name``; ``ValueError`` naming ``checkpoint_engine.backend``."""
    for transport in TRANSPORTS:
        if transport.name == name:
            return transport
    allowed = ", ".join(repr(t.name) for t in TRANSPORTS)
    raise ValueError(f"checkpoint_engine.backend={name!r}: allowed one of {allowed}")


def choose_transport(requested: str, placement: Placement) -> str:
    """``auto``: the first ``auto`` transport that fits; an explicit choice that does not fit
    is a ``ValueError`` naming ``checkpoint_engine.backend`` and what it needs."""
    if requested == AUTO:
        return next(t.name for t in TRANSPORTS if t.auto and t.fits(placement))
    transport = get_transport(requested)
    if not transport.fits(placement):
        raise ValueError(
            f"checkpoint_engine.backend={requested!r} does not fit this placement: it needs "
            f"{transport.needs} (use 'auto' to pick a backend that fits)"
        )
    return requested
