"""Weight sync between the trainer and the rollout engines (see ``synchronizer``).

``ParameterSynchronizer`` drives pushes; ``CheckpointEngine`` backends (``shm``, ``gloo``,
``nccl``, ``cuda_ipc``, built by ``make_checkpoint_engine``) move the bytes; ``WeightSender`` /
``WeightReceiver`` are the ends that live in trainer ranks and engine workers.
"""

from recipe.checkpoint_engine.base import (
    CheckpointEngine,
    ChecksumMismatchError,
    TransferPlan,
    TransferReport,
    WeightSyncError,
    make_checkpoint_engine,
)
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer

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
