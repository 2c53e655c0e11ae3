"""The pushes written to a folder every engine's node reads (``moves=FILE``, ``ADAPTER``).

    push_file(v)       ``backend=file``: one safetensors file, checked and loaded by every
                       (paused) replica
    stage_adapter(v)   LoRA (``adapter_only``): the adapter's PEFT folder for v written, every
                       replica checks it (its engine still serving the old one)
    push_adapter(v)    stage_adapter(v) unless staged already, then every (paused) replica
                       probes it (unless its probe ahead was accepted) and switches to it
                       (recipe/workers/rollout/lora.py)

``PushFolder`` owns the push's private folder (0700) under ``file_root`` (None: this host's
shared memory); ``PushTransport`` (transport.py) hands these moves its peers (peer_calls.py).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from recipe.checkpoint_engine.host import shm_dir
from recipe.checkpoint_engine.peer_calls import PeerCalls, Staged
from recipe.checkpoint_engine.phases import SENDER

_SMALLEST = frozenset({"sync/adapter_probe_diff", "sync/adapter_probe_ahead"})
"""Figures merged over the replicas by their smallest (``adapter_metrics``)."""


def adapter_metrics(replies: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The replicas' adapter figures as one: the slowest replica's seconds, the smallest
    probe difference (the replica likeliest to serve the base), probed ahead (1.0) only
    where every replica's probe was accepted ahead of the pause."""
    merged: dict[str, float] = {}
    for reply in replies:
        for key, value in reply.items():
            pick = min if key in _SMALLEST else max
            merged[key] = pick(merged[key], value) if key in merged else value
    return merged


class PushFolder:
    """The folder of ``backend=file`` and the adapter, and the pushes through it (module
    docstring)."""

    def __init__(self, root: Path | None) -> None:
        """``root``: where the folder is made (None: this host's shared memory)."""
        self._root = root
        self._dir: Path | None = None

    def create(self) -> None:
        """Make the folder, once (until ``remove``)."""
        if self._dir is None:
            root = self._root or Path(shm_dir())
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix="push-", dir=root))  # 0700

    def push_file(self, peers: PeerCalls, target: int) -> dict[str, float]:
        """``backend=file``: one safetensors file (written aside, then renamed) in
        ``file_root``, which every engine's node reads; each replica checks the file's sha256
        against the writer's before loading it (``sync/verify_s`` is in ``sync/load_s``)."""
        assert self._dir is not None
        path = str(self._dir / f"policy-v{target}.safetensors")
        start = time.perf_counter()
        exported = peers.phase("transfer", peers.on_ranks(lambda s: s.export_weights(path)))
        transfer_s = time.perf_counter() - start
        start = time.perf_counter()
        try:
            written = exported[SENDER]
            loads = peers.on_replicas(
                lambda _, r: r.update_weights_from_file(path, target, written.sha256)
            )
            peers.phase("load", loads)
        finally:
            Path(path).unlink(missing_ok=True)
        return {
            "sync/gather_s": 0.0,
            "sync/transfer_s": transfer_s,
            "sync/verify_s": 0.0,
            "sync/load_s": time.perf_counter() - start,
            "sync/bytes": float(exported[SENDER].num_bytes),
        }

    def stage_adapter(self, peers: PeerCalls, target: int) -> Staged:
        """LoRA: trainer rank 0 writes the adapter's PEFT folder for ``target`` (aside, then
        renamed; a folder per version, so the one an engine serves is never rewritten under
        it) in ``file_root``; every replica checks both files' sha256 against the writer's
        record, adds the adapter as ``target`` beside the version it serves, reads it
        back and, while its engine serves, probes it there (``stage_adapter``), its engine
        still serving where its owner serves during a push."""
        assert self._dir is not None
        directory = str(self._dir / f"adapter-v{target}")
        start = time.perf_counter()
        exported = peers.phase("transfer", peers.on_ranks(lambda s: s.export_adapter(directory)))
        transfer_s = time.perf_counter() - start
        adapter = exported[SENDER]
        staged = peers.phase(
            "verify", peers.on_replicas(lambda _, r: r.stage_adapter(adapter, target))
        )
        metrics = {
            "sync/gather_s": 0.0,
            "sync/transfer_s": transfer_s,
            "sync/bytes": float(adapter.num_bytes),
            **adapter_metrics(staged.values()),
        }
        return Staged(metrics, adapter=adapter)

    def push_adapter(
        self, peers: PeerCalls, target: int, staged: Staged | None = None
    ) -> dict[str, float]:
        """LoRA: ``stage_adapter`` unless ``staged`` already (then inside the pause); each
        (paused) replica probes the staged version alone, unless its probe ahead of the
        pause was accepted, and switches to it (recipe/workers/rollout/lora.py). The folders
        of earlier versions are removed once every replica serves ``target``."""
        if staged is None or staged.adapter is None:
            staged = self.stage_adapter(peers, target)
        adapter = staged.adapter
        assert adapter is not None
        start = time.perf_counter()
        loaded = peers.phase(
            "load", peers.on_replicas(lambda _, r: r.load_adapter(adapter, target))
        )
        load_s = time.perf_counter() - start
        self._remove_adapters(keep=Path(adapter.path))
        return staged.metrics | adapter_metrics(loaded.values()) | {"sync/load_s": load_s}

    def _remove_adapters(self, keep: Path) -> None:
        """Every adapter folder but ``keep``, the one the replicas serve now."""
        assert self._dir is not None
        for folder in self._dir.glob("adapter-v*"):
            if folder != keep:
                shutil.rmtree(folder, ignore_errors=True)

    def remove(self) -> None:
        """The folder, once no push needs it."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
