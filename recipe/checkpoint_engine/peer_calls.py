"""The driver's calls on the peers of a weight push, and what a push staged ahead.

    SendingRanks  what a push needs of the trainer's group (recipe/workers/trainer/ranks.py)
    PeerCalls     the peers: trainer rank 0 (the sender), every trainer rank, the replicas'
                  workers; one phase's calls on them, keyed by peer name, waited on together
                  with the deadline ``checkpoint_engine.timeout_s`` (phases.py)
    Staged        what a push moved before the engines paused (``PushTransport.stage_ahead``)

``PushTransport`` (transport.py) is a ``PeerCalls``; the moves it hands a push to
(bucket_push.py, folder_push.py) call the peers through it. Kept apart so those moves and the
transport share the peers without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from recipe.checkpoint_engine.clients import ReceiverClient, SenderClient
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.phases import SENDER, replica_peer, wait_phase
from recipe.observability.trace import Tracer
from recipe.utils.adapter_file import AdapterFile

# A peer's own deadline error says what it waited for; the driver waits a little longer so
# that error, not the driver's generic one, is what the caller sees.
DRIVER_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class Staged:
    """What a push moved before the engines paused (``PushTransport.stage_ahead``)."""

    metrics: dict[str, float]
    """Its ``sync/*`` figures so far (transfer, verify, bytes)."""
    transfer_id: int | None = None
    """Buckets: the transfer every replica holds in staging."""
    adapter: AdapterFile | None = None
    """LoRA: the adapter folder every replica checked."""


class SendingRanks(Protocol):
    """What a push needs of the trainer's group (recipe/workers/trainer/ranks.py)."""

    def senders(self) -> list[SenderClient]:
        """Each trainer rank's end of a push, rank 0 (the sender) first."""
        ...

    def check_alive(self) -> None:
        """Raise ``TrainerWorkerError`` naming a dead rank."""
        ...


class PeerCalls:
    """The peers of a push and one phase's calls on them (module docstring)."""

    def __init__(self, ranks: SendingRanks, cfg: CheckpointEngineConfig) -> None:
        self.cfg, self._ranks = cfg, ranks
        self.workers: list[ReceiverClient] = []
        """The replicas the transport was built for."""
        self.tracer = Tracer(0, None, enabled=False)

    def phase(self, phase: str, calls: dict[str, Any]) -> dict[str, Any]:
        """The results of ``calls`` by peer, within the deadline (a trace slice ``phase``)."""
        with self.tracer.span(phase, cat="sync"):
            return wait_phase(phase, calls, self.cfg.timeout_s + DRIVER_GRACE_S)

    def on_sender(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on trainer rank 0 (the sender), keyed by its peer name."""
        return {SENDER: call(self._ranks.senders()[0])}

    def on_ranks(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on every trainer rank (rank 0 under the sender's peer name)."""
        return {f"trainer rank {r}": call(c) for r, c in enumerate(self._ranks.senders())}

    def on_replicas(self, call: Callable[[int, ReceiverClient], Any]) -> dict[str, Any]:
        """``call(i, replica)`` on every replica the transport was built for."""
        return {replica_peer(i): call(i, w) for i, w in enumerate(self.workers)}
