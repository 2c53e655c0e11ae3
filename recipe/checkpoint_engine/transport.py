"""``PushTransport``: the peers of a weight push and the calls between them.

    trainer ranks (WeightSender, rank 0 sends)          replicas' workers (WeightReceiver)
    connect(workers, v)   metadata, placement (backend, bucket layout), prepare, connect
    agree(phase, v)       rank 0's version == every replica's (commit: rank 0 records it)
    stage(v)              transfer + verify (bucket_push.py): every replica holds v in
                          staging, its engine's own weights untouched
    stage_ahead(v)        what moves before the engines pause, where they serve meanwhile:
                          stage or the adapter's stage_adapter (``Staged``); files: nothing
    load(v, id)           every (paused) replica loads staged transfer ``id`` as v
    push(v, staged)       what the backend's registry line moves (transports.py):
                          buckets: stage(v) unless staged already, then load(v, id)
                          file, adapter (LoRA ``adapter_only``): ``PushFolder``'s push_file,
                          push_adapter (folder_push.py)
    close()               both ends released (best effort, never waiting on a hung peer)

Each call is a phase with the deadline ``checkpoint_engine.timeout_s`` whose failure names
the phase and the peer (phases.py; the calls on the peers: peer_calls.py). The order of the
phases, the engines' pause and the failure policy are ``ParameterSynchronizer``'s
(synchronizer.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipe.checkpoint_engine.base import TransferPlan, WeightSyncError
from recipe.checkpoint_engine.bucket_push import transfer_buckets
from recipe.checkpoint_engine.clients import ReceiverClient, SenderClient
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.folder_push import PushFolder
from recipe.checkpoint_engine.host import EndpointSite
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.checkpoint_engine.peer_calls import PeerCalls, SendingRanks, Staged
from recipe.checkpoint_engine.phases import SENDER, replica_peer
from recipe.checkpoint_engine.placement import (
    describe_backend_choice,
    order_receivers,
    resolve_backend,
    resolve_bucket_bytes,
)
from recipe.checkpoint_engine.transports import (
    ADAPTER,
    ADAPTER_BACKEND,
    FILE,
    Transport,
    get_transport,
)

logger = logging.getLogger(__name__)


class PushTransport(PeerCalls):
    """Calls between trainer rank 0 and the replicas' workers (module docstring)."""

    def __init__(
        self,
        ranks: SendingRanks,
        cfg: CheckpointEngineConfig,
        *,
        bucket_size_bytes: int | None = None,
        file_root: Path | None = None,
        adapter_only: bool = False,
    ) -> None:
        """``bucket_size_bytes`` overrides ``cfg.bucket_size_mb``; ``file_root``: where
        ``backend=file`` and the adapter folder are written (None: this host's shared
        memory); ``adapter_only``: the trainer trains a LoRA adapter and the engines serve it
        on their base: a push moves the adapter alone (backend ``adapter``)."""
        super().__init__(ranks, cfg)
        self.adapter_only = adapter_only
        self.connected = False
        self.backend: str | None = None
        """The resolved transport (None before the first ``connect``)."""
        self.layout: BucketLayout | None = None
        self.receiver_ranks: list[list[int]] = []
        """Global receiver ranks of each replica's engine workers (worker-group order)."""
        self.hung_peers: set[str] = set()
        """Peers that missed the last failed push's deadline: ``close`` does not wait on them."""
        self._bucket_override = bucket_size_bytes
        self._metadata: list[Any] | None = None
        self._next_transfer = 1
        self.folder = PushFolder(file_root)
        """Where ``backend=file`` and the adapter are written (folder_push.py)."""

    def connect(self, workers: Sequence[ReceiverClient], version: int) -> None:
        """Resolve backend and bucket size, compute the layout (once), build the transport
        to ``workers``, the replicas' current workers (the trainer side records
        ``version``)."""
        self.workers = list(workers)
        if self._metadata is None:
            metadata = self.on_sender(SenderClient.metadata)
            self._metadata = self.phase("metadata", metadata)[SENDER]
        infos = self.phase(
            "placement",
            self.on_sender(SenderClient.info) | self.on_replicas(lambda _, r: r.receiver_info()),
        )
        sender = EndpointSite.from_wire(infos[SENDER])
        groups = [
            [EndpointSite.from_wire(w) for w in infos[replica_peer(i)]]
            for i in range(len(self.workers))
        ]
        receivers = [worker for group in groups for worker in group]
        backend = (
            ADAPTER_BACKEND
            if self.adapter_only
            else resolve_backend(self.cfg.backend, sender, receivers)
        )
        if backend != self.backend and not self.adapter_only:
            logger.info("%s", describe_backend_choice(backend, sender, receivers))
        self.backend = backend
        self.phase("placement", self.on_sender(lambda s: s.commit(version)))
        if not self.spec.stages:
            self.folder.create()
            self.connected = True
            return
        layout = self.layout = self.layout or self._build_layout(sender.free_bytes)
        ranks = order_receivers(groups)
        plan = TransferPlan(
            self.backend, layout, len(receivers), self.cfg.timeout_s, self.cfg.verify
        ).to_wire()
        info = self.phase("prepare", self.on_sender(lambda s: s.prepare(plan)))[SENDER]
        calls = self.on_sender(lambda s: s.init(info))
        calls |= self.on_replicas(lambda i, r: r.connect_receivers(plan, ranks[i], info))
        ranks_by_peer = self.phase("connect", calls)
        self.receiver_ranks = [ranks_by_peer[replica_peer(i)] for i in range(len(groups))]
        self.connected = True
        logger.info(
            "weight sync over %s: %d receivers, %d buckets of %d B, %.1f MB per replica",
            self.backend,
            len(receivers),
            layout.num_buckets,
            layout.bucket_bytes,
            layout.model_bytes / 1e6,
        )

    @property
    def spec(self) -> Transport:
        """The registry line of the resolved backend (after the first ``connect``)."""
        assert self.backend is not None, "connect() resolves the backend"
        return get_transport(self.backend)

    @property
    def stages(self) -> bool:
        """The backend stages buckets (so they can be staged while the engines serve)."""
        return self.backend is not None and self.spec.stages

    def stage_ahead(self, target: int) -> Staged | None:
        """What can move while the engines still serve (their owner pauses them after):
        the buckets' transfer and verify, or the adapter folder written and checked; None
        for a backend that stages nothing (files)."""
        if self.spec.moves == ADAPTER:
            return self.folder.stage_adapter(self, target)
        if self.stages:
            transfer_id, metrics = self.stage(target)
            return Staged(metrics, transfer_id=transfer_id)
        return None

    def push(self, target: int, staged: Staged | None) -> dict[str, float]:
        """Every (paused) replica ends up loaded with ``target``, the way the backend's
        registry line moves weights; ``staged``: ``stage_ahead``'s result, if it ran."""
        if self.spec.moves == ADAPTER:
            return self.folder.push_adapter(self, target, staged)
        if self.spec.moves == FILE:
            return self.folder.push_file(self, target)
        if staged is None or staged.transfer_id is None:
            return self.load(target, *self.stage(target))
        return self.load(target, staged.transfer_id, staged.metrics)

    def _build_layout(self, free_bytes: int) -> BucketLayout:
        assert self._metadata is not None
        model_bytes = BucketLayout.build(self._metadata, 1 << 30).model_bytes
        bucket_bytes = self._bucket_override or resolve_bucket_bytes(
            self.cfg.bucket_size_mb, self.cfg.bucket_memory_fraction, free_bytes, model_bytes
        )
        return BucketLayout.build(self._metadata, bucket_bytes)

    def agree(self, phase: str, expected: int, *, commit: bool) -> None:
        """Trainer rank 0 and every replica hold ``expected``; with ``commit`` the trainer
        first records it (only once every engine loaded it)."""
        if commit:
            self.phase(phase, self.on_sender(lambda s: s.commit(expected)))
        versions = self.phase(
            phase,
            self.on_sender(SenderClient.get_version)
            | self.on_replicas(lambda _, r: r.get_version()),
        )
        wrong = {peer: v for peer, v in versions.items() if v != expected}
        if wrong:
            detail = f"versions {wrong} differ from {expected}, the synchronizer's"
            raise WeightSyncError(phase, ", ".join(wrong), detail)

    def stage(self, target: int) -> tuple[int, dict[str, float]]:
        """Transfer + verify: every replica holds the new weights in staging (the engines'
        own weights are untouched). Returns the transfer id and its ``sync/*`` figures."""
        transfer_id, self._next_transfer = self._next_transfer, self._next_transfer + 1
        try:
            metrics = transfer_buckets(self, transfer_id, target)
        except WeightSyncError:
            self.connected = False  # a broken group / half-written region: rebuild next time
            raise
        assert self.layout is not None
        return transfer_id, metrics | {"sync/bytes": float(self.layout.model_bytes)}

    def load(self, target: int, transfer_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every (paused) replica loads the staged transfer ``transfer_id`` as ``target``."""
        start = time.perf_counter()
        self.phase("load", self.on_replicas(lambda _, r: r.commit_weights(target, transfer_id)))
        return metrics | {"sync/load_s": time.perf_counter() - start}

    def close(self) -> None:
        """Finalize both ends (best effort, bounded by the deadline); re-init on next sync."""
        self.connected = False
        if not self.stages:  # files: no process group, no buffers to release
            return
        calls = self.on_sender(SenderClient.close)
        calls |= self.on_replicas(lambda _, r: r.close_receivers())
        calls = {peer: ref for peer, ref in calls.items() if peer not in self.hung_peers}
        try:
            self.phase("shutdown", calls)
        except WeightSyncError as exc:
            logger.warning("closing the weight transport: %s", exc)

    def remove_files(self) -> None:
        """The ``backend=file`` directory, once no push needs it."""
        self.folder.remove()
