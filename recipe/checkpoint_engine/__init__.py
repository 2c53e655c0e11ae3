"""Weight sync between the trainer and the rollout engines (see ``synchronizer``).

``ParameterSynchronizer`` drives pushes; ``CheckpointEngine`` backends (``shm``, ``gloo``,
``nccl``, ``cuda_ipc``, built by ``make_checkpoint_engine``) move the bytes; ``WeightSender`` /
``WeightReceiver`` are the ends that live in trainer ranks and engine workers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipe.checkpoint_engine.base import (
        CheckpointEngine,
        ChecksumMismatchError,
        TransferPlan,
        TransferReport,
        WeightSyncError,
    )
    from recipe.checkpoint_engine.config import CheckpointEngineConfig
    from recipe.checkpoint_engine.factory import make_checkpoint_engine
    from recipe.checkpoint_engine.layout import BucketLayout
    from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer

# Imported on first use: the config schema (``recipe.config``) loads this package, and a bad
# command line must fail before torch is imported.
_HOMES = {
    "BucketLayout": "layout",
    "CheckpointEngine": "base",
    "CheckpointEngineConfig": "config",
    "ChecksumMismatchError": "base",
    "ParameterSynchronizer": "synchronizer",
    "TransferPlan": "base",
    "TransferReport": "base",
    "WeightSyncError": "base",
    "make_checkpoint_engine": "factory",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = [
    "BucketLayout",
    "CheckpointEngine",
    "CheckpointEngineConfig",
    "ChecksumMismatchError",
    "ParameterSynchronizer",
    "TransferPlan",
    "TransferReport",
    "WeightSyncError",
    "make_checkpoint_engine",
]
