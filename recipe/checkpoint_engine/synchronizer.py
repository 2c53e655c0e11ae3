"""``ParameterSynchronizer``: the driver side of weight pushes and their failure policy.

    driver                     trainer ranks (WeightSender)        rollout replicas (WeightReceiver)
    init_communicator (once; again only after a failed transfer):
      metadata + placement --> rank 0                        <-- info of every engine worker
      prepare(plan) ---------> rank 0: region / store -> info
      connect ---------------> rank 0 init(info)       ||        connect(plan, ranks, info)

One push (``_sync``; every phase has a deadline, a failure names the phase and the peer). The
engines' serving state belongs to their owner (``ServingEngines``, engines.py): the push asks
it to pause and resume and never pauses an engine itself::

      agree-before           rank 0 version == v       ==        every replica serves v
      [transfer, verify]     staged first when the owner serves while staging (fully async)
      pause                  engines.pause(): the owner quiesces its engines (a replica it
                             replaced meanwhile has nothing staged: the transport is rebuilt)
      transfer  -----------> all ranks gather, rank 0 sends ||   stage + checksum every bucket
      verify                 sender checksums == every receiver's (receivers compared too)
      load                                                       staged -> engine, caches reset,
                                                                 serve v+1 (still paused)
      agree-after            rank 0 commits v+1        ==        every replica serves v+1
      resume                 engines.resume(): generation goes on

Invariant: an engine changes weights only in ``load``, and ``load`` runs only after every
replica verified the full push, so a failed or partial transfer leaves every engine on
version v with its old weights (paused, unless the failure came before the pause). After a
failure the synchronizer is ``is_stale``; ``engines.repair`` and then
``checkpoint_engine.on_failure`` say whether ``push`` rebuilds the transport and tries again.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
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
from recipe.checkpoint_engine.engines import ServingEngines
from recipe.checkpoint_engine.host import EndpointSite, shm_dir
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.checkpoint_engine.phases import NO_ANSWER, SENDER, replica_peer, wait_phase
from recipe.checkpoint_engine.placement import (
    describe_backend_choice,
    order_receivers,
    resolve_backend,
    resolve_bucket_bytes,
)
from recipe.observability.trace import SENDER_TID, Tracer

logger = logging.getLogger(__name__)

# A peer's own deadline error says what it waited for; the driver waits a little longer so
# that error, not the driver's generic one, is what the caller sees.
_DRIVER_GRACE_S = 2.0
Timer = Callable[[str], AbstractContextManager[Any]]


class SendingRanks(Protocol):
    """What a push needs of the trainer's group (recipe/workers/trainer/ranks.py)."""

    workers: list[Any]
    """Trainer rank actors (``SenderClient`` calls them); rank 0 sends."""

    def check_alive(self) -> None:
        """Raise ``TrainerWorkerError`` naming a dead rank."""
        ...


@dataclass(frozen=True, slots=True)
class PushResult:
    """What one ``push`` did."""

    version: int
    """The version every engine serves now (the one pushed from, + 1)."""
    metrics: dict[str, float]
    """``sync/*``: seconds per phase, bytes per replica, GB/s end to end."""
    num_retries: int
    """Failed attempts retried under ``checkpoint_engine.on_failure=retry``."""


class ParameterSynchronizer:
    """Pushes the trainer group's weights into every rollout replica (module docstring).

    It holds no weights version of its own: ``push(version)`` is told the version the engines
    serve and returns the next; the recipe that calls it keeps the version (and checkpoints
    it)."""

    def __init__(
        self,
        ranks: SendingRanks,
        engines: ServingEngines,
        cfg: CheckpointEngineConfig,
        *,
        bucket_size_bytes: int | None = None,
        file_root: Path | None = None,
    ) -> None:
        """``engines``: the rollout side, owner of the engines' serving state;
        ``bucket_size_bytes`` overrides ``cfg.bucket_size_mb`` (tests and benchmarks use
        sub-MiB buckets to chunk small models). ``file_root``: where ``backend=file`` writes
        its files, a directory every node reads (the run directory's private weights
        directory); None: this host's shared memory (single-host use only)."""
        self.cfg = cfg
        self._trainer, self._engines = ranks, engines
        self._workers: list[Any] = []  # the handles the transport was built for
        self._bucket_override = bucket_size_bytes
        self._metadata: list[Any] | None = None
        self._layout: BucketLayout | None = None
        self._backend: str | None = None
        self._connected = False
        self._stale = False
        self._hung_peers: set[str] = set()
        """Peers that missed the last failed push's deadline: teardown does not wait on them."""
        self._next_transfer = 1
        self._file_dir: Path | None = None
        self._file_root = file_root
        self.num_retries = 0
        """Failed pushes retried over the run (``faults/sync_retries``)."""
        self.receiver_ranks: list[list[int]] = []
        """Global receiver ranks of each replica's engine workers (worker-group order)."""
        self.tracer = Tracer(0, None, enabled=False)
        """Each phase is a trace slice here (the owner sets its own tracer)."""

    @property
    def backend(self) -> str | None:
        """The resolved transport (``None`` before ``init_communicator``)."""
        return self._backend

    @property
    def layout(self) -> BucketLayout | None:
        return self._layout

    @property
    def is_stale(self) -> bool:
        """True after a failed sync, until one succeeds: the engines are paused on an older
        version than the trainer's weights."""
        return self._stale

    # ---- communicator -----------------------------------------------------------------

    def _phase(self, phase: str, calls: dict[str, Any]) -> dict[str, Any]:
        with self.tracer.span(phase, cat="sync"):
            return wait_phase(phase, calls, self.cfg.timeout_s + _DRIVER_GRACE_S)

    def _on_sender(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on trainer rank 0 (the sender), keyed by its peer name."""
        return {SENDER: call(SenderClient(self._trainer.workers[0]))}

    def _on_ranks(self, call: Callable[[SenderClient], Any]) -> dict[str, Any]:
        """``call`` on every trainer rank (rank 0 under the sender's peer name)."""
        return {
            f"trainer rank {r}": call(SenderClient(w)) for r, w in enumerate(self._trainer.workers)
        }

    def _on_replicas(self, call: Callable[[int, ReceiverClient], Any]) -> dict[str, Any]:
        """``call(i, replica)`` on every replica the transport was built for."""
        return {replica_peer(i): call(i, ReceiverClient(w)) for i, w in enumerate(self._workers)}

    def init_communicator(self, version: int) -> None:
        """Resolve backend and bucket size, compute the layout (once), build the transport
        to the replicas' current workers (the trainer side records ``version``)."""
        self._workers = self._engines.workers()
        if self._metadata is None:
            metadata = self._on_sender(SenderClient.metadata)
            self._metadata = self._phase("metadata", metadata)[SENDER]
        infos = self._phase(
            "placement",
            self._on_sender(SenderClient.info) | self._on_replicas(lambda _, r: r.info()),
        )
        sender = EndpointSite.from_wire(infos[SENDER])
        groups = [
            [EndpointSite.from_wire(w) for w in infos[replica_peer(i)]]
            for i in range(len(self._workers))
        ]
        receivers = [worker for group in groups for worker in group]
        backend = resolve_backend(self.cfg.backend, sender, receivers)
        if backend != self._backend:
            logger.info("%s", describe_backend_choice(backend, sender, receivers))
        self._backend = backend
        self._phase("placement", self._on_sender(lambda s: s.commit(version)))
        if self._backend == "file":
            if self._file_dir is None:
                root = self._file_root or Path(shm_dir())
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._file_dir = Path(tempfile.mkdtemp(prefix="push-", dir=root))  # 0700
            self._connected = True
            return
        layout = self._layout = self._layout or self._build_layout(sender.free_bytes)
        ranks = order_receivers(groups)
        plan = TransferPlan(
            self._backend, layout, len(receivers), self.cfg.timeout_s, self.cfg.verify
        ).to_wire()
        info = self._phase("prepare", self._on_sender(lambda s: s.prepare(plan)))[SENDER]
        calls = self._on_sender(lambda s: s.init(info))
        calls |= self._on_replicas(lambda i, r: r.connect(plan, ranks[i], info))
        ranks_by_peer = self._phase("connect", calls)
        self.receiver_ranks = [ranks_by_peer[replica_peer(i)] for i in range(len(groups))]
        self._connected = True
        logger.info(
            "weight sync over %s: %d receivers, %d buckets of %d B, %.1f MB per replica",
            self._backend,
            len(receivers),
            layout.num_buckets,
            layout.bucket_bytes,
            layout.model_bytes / 1e6,
        )

    def _build_layout(self, free_bytes: int) -> BucketLayout:
        assert self._metadata is not None
        model_bytes = BucketLayout.build(self._metadata, 1 << 30).model_bytes
        bucket_bytes = self._bucket_override or resolve_bucket_bytes(
            self.cfg.bucket_size_mb, self.cfg.bucket_memory_fraction, free_bytes, model_bytes
        )
        return BucketLayout.build(self._metadata, bucket_bytes)

    # ---- one sync -----------------------------------------------------------------------

    def push(self, version: int, *, timer: Timer | None = None) -> PushResult:
        """Push the trainer's weights into engines serving ``version``; they serve
        ``version + 1`` afterwards (the sequence: the module docstring).

        On failure the engines stay on ``version`` (never half-updated). A dead trainer rank
        is never retried (its ``TrainerWorkerError`` is raised); a push cut by a replica that
        ``engines.repair(exc)`` replaced is retried uncounted; else
        ``checkpoint_engine.on_failure`` decides: ``stop`` raises the ``WeightSyncError`` (it
        names the phase and the peer), ``retry`` rebuilds the transport and pushes again, at
        most ``max_retries`` times. The engines are paused at most once per push, whatever
        the retries. ``timer(key)`` (e.g. ``MetricsAccumulator.timer``) wraps each attempt as
        ``timing/sync_s``.
        """
        retries_left = self.cfg.max_retries if self.cfg.on_failure == "retry" else 0
        num_retries = 0
        paused: list[bool] = []  # the engines' owner paused them in this push
        while True:
            try:
                with timer("timing/sync_s") if timer is not None else nullcontext():
                    metrics = self._attempt(version, paused)
                return PushResult(version + 1, metrics, num_retries)
            except WeightSyncError as exc:
                self._trainer.check_alive()
                if self._engines.repair(exc):
                    logger.warning("weight push failed (%s); pushing again to the new worker", exc)
                elif retries_left > 0:
                    retries_left -= 1
                    num_retries += 1
                    self.num_retries += 1
                    logger.warning("weight push failed (%s); retrying, %d left", exc, retries_left)
                else:
                    raise
                self.reset_transport()

    def _attempt(self, version: int, paused: list[bool]) -> dict[str, float]:
        self._hung_peers.clear()
        try:
            metrics = self._sync(version, paused)
        except WeightSyncError as exc:
            self._stale = True
            if exc.detail.startswith(NO_ANSWER):  # hung peers: teardown does not wait on them
                self._hung_peers.update(exc.peer.split(", "))
            raise
        self._stale = False
        return metrics

    def _sync(self, version: int, paused: list[bool]) -> dict[str, float]:
        """One attempt of a push: the sequence drawn in the module docstring."""
        start = time.perf_counter()
        target = version + 1
        self._stage_ready(version)  # agree-before; resolves the backend on the first push
        staged = None
        if self._engines.stage_while_serving and self._backend != "file":
            staged = self._stage(target)  # transfer + verify while the engines still generate
        self._pause_engines(paused)
        if self._engines.workers() != self._workers:  # a new worker has nothing staged
            self.reset_transport()
            self._stage_ready(version)
            staged = None
        pause_start = time.perf_counter()
        if self._backend == "file":
            metrics = self._push_file(target)
        else:
            metrics = self._load(target, *(staged or self._stage(target)))
        self._agree("agree-after", target, commit=True)
        with self.tracer.span("resume", cat="sync"):
            self._engines.resume()
        metrics["sync/pause_s"] = time.perf_counter() - pause_start
        if self.cfg.release_buffers:
            self._close_transport()
        metrics["sync/total_s"] = time.perf_counter() - start
        moved_s = metrics["sync/transfer_s"] + metrics["sync/load_s"]
        metrics["sync/gbps"] = metrics["sync/bytes"] / max(moved_s, 1e-9) / 1e9
        metrics[f"sync/backend/{self._backend}"] = 1.0
        logger.debug("weights v%d pushed: %s", target, {k: round(v, 4) for k, v in metrics.items()})
        return metrics

    def _pause_engines(self, paused: list[bool]) -> None:
        """Have the engines' owner pause them, once per push (a retry finds them paused)."""
        if paused:
            return
        with self.tracer.span("pause", cat="sync"):
            self._engines.pause()
        paused.append(True)

    def _stage_ready(self, version: int) -> None:
        """Connected to the replicas' current workers, all of them serving ``version``."""
        if self._connected and self._engines.workers() != self._workers:
            self.reset_transport()  # a replica runs on a new worker: it has never joined
        if not self._connected:
            self.init_communicator(version)
        self._agree("agree-before", version, commit=False)

    def _agree(self, phase: str, expected: int, *, commit: bool) -> None:
        """Trainer rank 0 and every replica hold ``expected``; with ``commit`` the trainer
        first records it (only once every engine loaded it)."""
        if commit:
            self._phase(phase, self._on_sender(lambda s: s.commit(expected)))
        versions = self._phase(
            phase,
            self._on_sender(SenderClient.get_version)
            | self._on_replicas(lambda _, r: r.get_version()),
        )
        wrong = {peer: v for peer, v in versions.items() if v != expected}
        if wrong:
            detail = f"versions {wrong} differ from {expected}, the synchronizer's"
            raise WeightSyncError(phase, ", ".join(wrong), detail)

    def _stage(self, target: int) -> tuple[int, dict[str, float]]:
        """Transfer + verify: every replica holds the new weights in staging (the engines'
        own weights are untouched). Returns the transfer id and its ``sync/*`` figures."""
        transfer_id, self._next_transfer = self._next_transfer, self._next_transfer + 1
        calls = self._on_ranks(lambda s: s.send(transfer_id, target))
        calls |= self._on_replicas(lambda _, r: r.receive(transfer_id))
        start = time.perf_counter()
        start_us = time.time() * 1e6
        try:
            wire = self._phase("transfer", calls)
            transfer_s = time.perf_counter() - start
            sent = TransferReport.from_wire(wire[SENDER])
            received = [
                [TransferReport.from_wire(w) for w in wire[replica_peer(i)]]
                for i in range(len(self._workers))
            ]
            # The sender (trainer rank 0) gathers shards before sending; it reports how long.
            gather_us = start_us + sent.gather_s * 1e6
            self.tracer.complete("gather", start_us, gather_us, tid=SENDER_TID, cat="sync")
            verify_s = self._verify(sent, received)
        except WeightSyncError:
            self._connected = False  # a broken group / half-written region: rebuild next time
            raise
        assert self._layout is not None
        return transfer_id, {
            "sync/gather_s": sent.gather_s,
            "sync/transfer_s": transfer_s,
            "sync/verify_s": verify_s,
            "sync/bytes": float(self._layout.model_bytes),
        }

    def _load(self, target: int, transfer_id: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every (paused) replica loads the staged transfer ``transfer_id`` as ``target``."""
        start = time.perf_counter()
        self._phase("load", self._on_replicas(lambda _, r: r.commit_weights(target, transfer_id)))
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

    def _push_file(self, target: int) -> dict[str, float]:
        """``backend=file``: one safetensors file (written aside, then renamed) in
        ``file_root``, which every engine's node reads; each replica checks the file's sha256
        against the writer's before loading it (``sync/verify_s`` is in ``sync/load_s``)."""
        assert self._file_dir is not None
        path = str(self._file_dir / f"policy-v{target}.safetensors")
        start = time.perf_counter()
        exported = self._phase("transfer", self._on_ranks(lambda s: s.export_weights(path)))
        transfer_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            written = exported[SENDER]
            loads = self._on_replicas(
                lambda _, r: r.update_weights_from_file(path, target, written.sha256)
            )
            self._phase("load", loads)
        finally:
            Path(path).unlink(missing_ok=True)
        return {
            "sync/gather_s": 0.0,
            "sync/transfer_s": transfer_s,
            "sync/verify_s": 0.0,
            "sync/load_s": time.perf_counter() - start,
            "sync/bytes": float(exported[SENDER].num_bytes),
        }

    def reset_transport(self) -> None:
        """Rebuild the transport at the next sync (every end prepares and connects again):
        before retrying a failed push, or after a rollout replica was replaced by a new
        worker, whose receiver has never joined."""
        self._connected = False

    # ---- teardown -----------------------------------------------------------------------

    def _close_transport(self) -> None:
        """Finalize both ends (best effort, bounded by the deadline); re-init on next sync."""
        self._connected = False
        if self._backend in (None, "file"):
            return
        calls = self._on_sender(SenderClient.close) | self._on_replicas(lambda _, r: r.close())
        calls = {peer: ref for peer, ref in calls.items() if peer not in self._hung_peers}
        try:
            self._phase("shutdown", calls)
        except WeightSyncError as exc:
            logger.warning("closing the weight transport: %s", exc)

    def shutdown(self) -> None:
        """Release buffers and process groups on every peer. Safe to call twice."""
        self._close_transport()
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
            self._file_dir = None
