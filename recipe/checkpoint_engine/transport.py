"""``PushTransport``: the peers of a weight push and the calls between them.

    trainer ranks (WeightSender, rank 0 sends)          replicas' workers (WeightReceiver)
    connect(workers, v)   metadata, placement (backend, bucket layout), prepare, connect
    agree(phase, v)       rank 0's version == every replica's (commit: rank 0 records it)
    stage(v)              transfer + verify: every replica holds v in staging, its engine's
                          own weights untouched
    stage_adapter(v)      LoRA: the adapter's PEFT folder for v written, every replica
                          checks it (its engine still serving the old one)
    stage_ahead(v)        what moves before the engines pause, where they serve meanwhile:
                          stage or stage_adapter (``Staged``); files: nothing
    load(v, id)           every (paused) replica loads staged transfer ``id`` as v
    push(v, staged)       what the backend's registry line moves (transports.py):
                          buckets: stage(v) unless staged already, then load(v, id)
                          file (push_file): one safetensors file, checked and loaded
                          adapter (push_adapter, LoRA ``adapter_only``): stage_adapter(v)
                          unless staged already, then every (paused) replica probes it and
                          switches to it
                          (recipe/workers/rollout/lora.py)
    close()               both ends released (best effort, never waiting on a hung peer)

Each call is a phase with the deadline ``checkpoint_engine.timeout_s`` whose failure names
the phase and the peer (phases.py). The order of the phases, the engines' pause and the
failure policy are ``ParameterSynchronizer``'s (synchronizer.py).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from recipe.checkpoint_engine.base import (
    ChecksumMismatchError,
    TransferPlan,
    TransferReport,
    WeightSyncError,
)
from recipe.checkpoint_engine.clients import ReceiverClient, SenderClient
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.host import EndpointSite, shm_dir
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.checkpoint_engine.phases import SENDER, replica_peer, wait_phase
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
from recipe.observability.trace import SENDER_TID, Tracer
from recipe.utils.adapter_file import AdapterFile

logger = logging.getLogger(__name__)

# A peer's own deadline error says what it waited for; the driver waits a little longer so
# that error, not the driver's generic one, is what the caller sees.
_DRIVER_GRACE_S = 2.0


@dataclass(frozen=True, slots=True)
class Staged:
    """What a push moved before the engines paused (``PushTransport.stage_ahead``)."""

    metrics: dict[str, float]
    """Its ``sync/*`` figures so far (transfer, verify, bytes)."""
    transfer_id: int | None = None
    """Buckets: the transfer every replica holds in staging."""
    adapter: AdapterFile | None = None
    """LoRA: the adapter folder every replica checked."""


def adapter_metrics(replies: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The replicas' adapter figures as one: the slowest replica's seconds, the smallest
    probe difference (the replica likeliest to serve the base)."""
    merged: dict[str, float] = {}
    for reply in replies:
        for key, value in reply.items():
            pick = min if key == "sync/adapter_probe_diff" else max
            merged[key] = pick(merged[key], value) if key in merged else value
    return merged


class SendingRanks(Protocol):
    """What a push needs of the trainer's group (recipe/workers/trainer/ranks.py)."""

    def senders(self) -> list[SenderClient]:
        """Each trainer rank's end of a push, rank 0 (the sender) first."""
        ...

    def check_alive(self) -> None:
        """Raise ``TrainerWorkerError`` naming a dead rank."""
        ...


class PushTransport:
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
        self.cfg, self._ranks = cfg, ranks
        self.adapter_only = adapter_only
        self.workers: list[ReceiverClient] = []
        """The replicas the transport was built for."""
        self.connected = False
        self.backend: str | None = None
        """The resolved transport (None before the first ``connect``)."""
        self.layout: BucketLayout | None = None
        self.receiver_ranks: list[list[int]] = []
        """Global receiver ranks of each replica's engine workers (worker-group order)."""
        self.hung_peers: set[str] = set()
        """Peers that missed the last failed push's deadline: ``close`` does not wait on them."""
        self.tracer = Tracer(0, None, enabled=False)
        self._bucket_override = bucket_size_bytes
        self._metadata: list[Any] | None = None
        self._next_transfer = 1
        self._file_dir: Path | None = None
        self._file_root = file_root

    def phase(self, phase: str, calls: dict[str, Any]) -> dict[str, Any]:
        with self.tracer.span(phase, cat="sync"):
            return wait_phase(phase, calls, self.cfg.timeout_s + _DRIVER_GRACE_S)

    def on_sender(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on trainer rank 0 (the sender), keyed by its peer name."""
        return {SENDER: call(self._ranks.senders()[0])}

    def on_ranks(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on every trainer rank (rank 0 under the sender's peer name)."""
        return {f"trainer rank {r}": call(c) for r, c in enumerate(self._ranks.senders())}

    def on_replicas(self, call: Callable[[int, ReceiverClient], Any]) -> dict[str, Any]:
        """``call(i, replica)`` on every replica the transport was built for."""
        return {replica_peer(i): call(i, w) for i, w in enumerate(self.workers)}

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
            if self._file_dir is None:
                root = self._file_root or Path(shm_dir())
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._file_dir = Path(tempfile.mkdtemp(prefix="push-", dir=root))  # 0700
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
            return self.stage_adapter(target)
        if self.stages:
            transfer_id, metrics = self.stage(target)
            return Staged(metrics, transfer_id=transfer_id)
        return None

    def push(self, target: int, staged: Staged | None) -> dict[str, float]:
        """Every (paused) replica ends up loaded with ``target``, the way the backend's
        registry line moves weights; ``staged``: ``stage_ahead``'s result, if it ran."""
        if self.spec.moves == ADAPTER:
            return self.push_adapter(target, staged)
        if self.spec.moves == FILE:
            return self.push_file(target)
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
        calls = self.on_ranks(lambda s: s.send(transfer_id, target))
        calls |= self.on_replicas(lambda _, r: r.receive(transfer_id))
        start = time.perf_counter()
        start_us = time.time() * 1e6
        try:
            wire = self.phase("transfer", calls)
            transfer_s = time.perf_counter() - start
            sent = TransferReport.from_wire(wire[SENDER])
            received = [
                [TransferReport.from_wire(w) for w in wire[replica_peer(i)]]
                for i in range(len(self.workers))
            ]
            # The sender (trainer rank 0) gathers shards before sending; it reports how long.
            gather_us = start_us + sent.gather_s * 1e6
            self.tracer.complete("gather", start_us, gather_us, tid=SENDER_TID, cat="sync")
            verify_s = self._verify(sent, received)
        except WeightSyncError:
            self.connected = False  # a broken group / half-written region: rebuild next time
            raise
        assert self.layout is not None
        return transfer_id, {
            "sync/gather_s": sent.gather_s,
            "sync/transfer_s": transfer_s,
            "sync/verify_s": verify_s,
            "sync/bytes": float(self.layout.model_bytes),
        }

    def load(self, target: int, transfer_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every (paused) replica loads the staged transfer ``transfer_id`` as ``target``."""
        start = time.perf_counter()
        self.phase("load", self.on_replicas(lambda _, r: r.commit_weights(target, transfer_id)))
        return metrics | {"sync/load_s": time.perf_counter() - start}

    def _verify(self, sent: TransferReport, received: list[list[TransferReport]]) -> float:
        """Driver-side comparison of every receiver's checksums with the sender's (replica
        i's engine workers in ``received[i]``); returns the verification cost (sender's
        checksum time + the slowest receiver's)."""
        receiver_s = 0.0
        for i, workers in enumerate(received):
            for worker in workers:
                receiver_s = max(receiver_s, worker.verify_s)
                if not self.cfg.verify or worker.checksums == sent.checksums:
                    continue
                pairs = zip(worker.checksums, sent.checksums, strict=False)
                bad = next((k for k, (a, b) in enumerate(pairs) if a != b), "count")
                detail = f"bucket {bad} differs from the sender's checksum"
                raise ChecksumMismatchError("verify", replica_peer(i), detail)
        return sent.verify_s + receiver_s

    def push_file(self, target: int) -> dict[str, float]:
        """``backend=file``: one safetensors file (written aside, then renamed) in
        ``file_root``, which every engine's node reads; each replica checks the file's sha256
        against the writer's before loading it (``sync/verify_s`` is in ``sync/load_s``)."""
        assert self._file_dir is not None
        path = str(self._file_dir / f"policy-v{target}.safetensors")
        start = time.perf_counter()
        exported = self.phase("transfer", self.on_ranks(lambda s: s.export_weights(path)))
        transfer_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            written = exported[SENDER]
            loads = self.on_replicas(
                lambda _, r: r.update_weights_from_file(path, target, written.sha256)
            )
            self.phase("load", loads)
        finally:
            Path(path).unlink(missing_ok=True)
        return {
            "sync/gather_s": 0.0,
            "sync/transfer_s": transfer_s,
            "sync/verify_s": 0.0,
            "sync/load_s": time.perf_counter() - start,
            "sync/bytes": float(exported[SENDER].num_bytes),
        }

    def stage_adapter(self, target: int) -> Staged:
        """LoRA: trainer rank 0 writes the adapter's PEFT folder for ``target`` (aside, then
        renamed; a folder per version, so the one an engine serves is never rewritten under
        it) in ``file_root``; every replica checks both files' sha256 against the writer's
        record, adds the adapter as ``target`` beside the version it serves and reads it
        back (``stage_adapter``), its engine still serving where its owner serves
        during a push."""
        assert self._file_dir is not None
        directory = str(self._file_dir / f"adapter-v{target}")
        start = time.perf_counter()
        exported = self.phase("transfer", self.on_ranks(lambda s: s.export_adapter(directory)))
        transfer_s = time.perf_counter() - start
        adapter = exported[SENDER]
        staged = self.phase(
            "verify", self.on_replicas(lambda _, r: r.stage_adapter(adapter, target))
        )
        metrics = {
            "sync/gather_s": 0.0,
            "sync/transfer_s": transfer_s,
            "sync/bytes": float(adapter.num_bytes),
            **adapter_metrics(staged.values()),
        }
        return Staged(metrics, adapter=adapter)

    def push_adapter(self, target: int, staged: Staged | None = None) -> dict[str, float]:
        """LoRA: ``stage_adapter`` unless ``staged`` already; each (paused) replica probes
        the staged version alone and switches to it, staging it inside the pause where it
        was not
        (recipe/workers/rollout/lora.py). The folders of earlier versions are removed once
        every replica serves ``target``."""
        if staged is None or staged.adapter is None:
            staged = self.stage_adapter(target)
        adapter = staged.adapter
        assert adapter is not None
        start = time.perf_counter()
        loaded = self.phase("load", self.on_replicas(lambda _, r: r.load_adapter(adapter, target)))
        load_s = time.perf_counter() - start
        self._remove_adapters(keep=Path(adapter.path))
        return staged.metrics | adapter_metrics(loaded.values()) | {"sync/load_s": load_s}

    def _remove_adapters(self, keep: Path) -> None:
        """Every adapter folder but ``keep``, the one the replicas serve now."""
        assert self._file_dir is not None
        for folder in self._file_dir.glob("adapter-v*"):
            if folder != keep:
                shutil.rmtree(folder, ignore_errors=True)

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
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
            self._file_dir = None
