"""``ParameterSynchronizer``: the driver side of weight pushes and their failure policy.

    driver                     trainer ranks (WeightSender)        rollout replicas (WeightReceiver)
    init_communicator (once; again only after a failed transfer):
      metadata + placement --> rank 0                        <-- info of every engine worker
      prepare(plan) ---------> rank 0: region / store -> info
      connect ---------------> rank 0 init(info)       ||        connect(plan, ranks, info)

One push (``_sync``; the calls between the peers are ``PushTransport``'s, transport.py: every
phase has a deadline, a failure names the phase and the peer). The engines' serving state
belongs to their owner (``ServingEngines``, engines.py): the push asks
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

With LoRA (``adapter_only``, backend ``adapter``) trainer rank 0 writes the adapter's PEFT
folder and every replica checks its sha256 (transfer, verify: staged first when the owner
serves while staging); after the pause every replica loads it in place of the served adapter
(prefix cache reset) and probes that it serves it, not the base
(recipe/workers/rollout/lora.py); the base weights never move.

Invariant: an engine changes weights only in ``load``, and ``load`` runs only after every
replica verified the full push, so a failed or partial transfer leaves every engine on
version v with its old weights (paused, unless the failure came before the pause). After a
failure the synchronizer is ``is_stale``; ``engines.repair`` and then
``checkpoint_engine.on_failure`` say whether ``push`` rebuilds the transport and tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.checkpoint_engine.base import WeightSyncError
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.engines import ServingEngines
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.checkpoint_engine.peer_calls import SendingRanks
from recipe.checkpoint_engine.phases import NO_ANSWER
from recipe.checkpoint_engine.transport import PushTransport
from recipe.observability.trace import Tracer

logger = logging.getLogger(__name__)

Timer = Callable[[str], AbstractContextManager[Any]]


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
        adapter_only: bool = False,
    ) -> None:
        """``engines``: the rollout side, owner of the engines' serving state;
        ``bucket_size_bytes`` overrides ``cfg.bucket_size_mb`` (tests and benchmarks use
        sub-MiB buckets to chunk small models). ``file_root``: where ``backend=file`` writes
        its files, a directory every node reads (the run directory's private weights
        directory); None: this host's shared memory (single-host use only). ``adapter_only``:
        LoRA (``actor.lora.rank > 0``): each push moves the adapter alone and every replica
        verifies it serves it (``PushFolder.push_adapter``, folder_push.py)."""
        self.cfg = cfg
        self._trainer, self._engines = ranks, engines
        self.transport = PushTransport(
            ranks,
            cfg,
            bucket_size_bytes=bucket_size_bytes,
            file_root=file_root,
            adapter_only=adapter_only,
        )
        """The calls between the peers (transport.py)."""
        self._stale = False
        self.num_retries = 0
        """Failed pushes retried over the run (``faults/sync_retries``)."""

    @property
    def tracer(self) -> Tracer:
        """Each phase is a trace slice here (the owner sets its own tracer)."""
        return self.transport.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer) -> None:
        self.transport.tracer = tracer

    @property
    def backend(self) -> str | None:
        """The resolved transport (``None`` before ``init_communicator``)."""
        return self.transport.backend

    @property
    def layout(self) -> BucketLayout | None:
        return self.transport.layout

    @property
    def receiver_ranks(self) -> list[list[int]]:
        """Global receiver ranks of each replica's engine workers (worker-group order)."""
        return self.transport.receiver_ranks

    @property
    def is_stale(self) -> bool:
        """True after a failed sync, until one succeeds: the engines are paused on an older
        version than the trainer's weights."""
        return self._stale

    def init_communicator(self, version: int) -> None:
        """Build the transport to the replicas' current workers (transport.py)."""
        self.transport.connect(self._engines.workers(), version)

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
        self.transport.hung_peers.clear()
        try:
            metrics = self._sync(version, paused)
        except WeightSyncError as exc:
            self._stale = True
            if exc.detail.startswith(NO_ANSWER):  # hung peers: teardown does not wait on them
                self.transport.hung_peers.update(exc.peer.split(", "))
            raise
        self._stale = False
        return metrics

    def _sync(self, version: int, paused: list[bool]) -> dict[str, float]:
        """One attempt of a push: the sequence drawn in the module docstring."""
        start = time.perf_counter()
        target = version + 1
        self._stage_ready(version)  # agree-before; resolves the backend on the first push
        staged = None
        transport = self.transport
        if self._engines.stage_while_serving:
            staged = transport.stage_ahead(target)  # moved while the engines still generate
        self._pause_engines(paused)
        if self._engines.workers() != transport.workers:  # a new worker has nothing staged
            self.reset_transport()
            self._stage_ready(version)
            staged = None
        pause_start = time.perf_counter()
        metrics = transport.push(target, staged)  # as the backend's registry line moves them
        transport.agree("agree-after", target, commit=True)
        with self.tracer.span("resume", cat="sync"):
            self._engines.resume()
        metrics["sync/pause_s"] = time.perf_counter() - pause_start
        if self.cfg.release_buffers:
            transport.close()
        metrics["sync/total_s"] = time.perf_counter() - start
        moved_s = metrics["sync/transfer_s"] + metrics["sync/load_s"]
        metrics["sync/gbps"] = metrics["sync/bytes"] / max(moved_s, 1e-9) / 1e9
        metrics[f"sync/backend/{transport.backend}"] = 1.0
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
        transport = self.transport
        if transport.connected and self._engines.workers() != transport.workers:
            self.reset_transport()  # a replica runs on a new worker: it has never joined
        if not transport.connected:
            self.init_communicator(version)
        transport.agree("agree-before", version, commit=False)

    def reset_transport(self) -> None:
        """Rebuild the transport at the next sync (every end prepares and connects again):
        before retrying a failed push, or after a rollout replica was replaced by a new
        worker, whose receiver has never joined."""
        self.transport.connected = False

    def shutdown(self) -> None:
        """Release buffers and process groups on every peer. Safe to call twice."""
        self.transport.close()
        self.transport.remove_files()
