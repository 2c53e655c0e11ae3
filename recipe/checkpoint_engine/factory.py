"""The one factory of checkpoint-engine transports, keyed on ``TransferPlan.backend``.

Kept apart from base.py so the contract does not import its implementations (each backend
module imports the contract).
"""

from __future__ import annotations

import torch

from recipe.checkpoint_engine.base import ENGINE_BACKENDS, CheckpointEngine, TransferPlan
from recipe.checkpoint_engine.broadcast import BroadcastEngine
from recipe.checkpoint_engine.shared_region import SharedRegionEngine


def make_checkpoint_engine(
    plan: TransferPlan, *, rank: int, device: torch.device
) -> CheckpointEngine:
    """The engine of ``plan.backend`` (``checkpoint_engine.backend`` after ``auto``)."""
    if plan.backend in ("shm", "cuda_ipc"):
        return SharedRegionEngine(plan, rank=rank, device=device)
    if plan.backend in ("gloo", "nccl"):
        return BroadcastEngine(plan, rank=rank, device=device)
    allowed = ", ".join(repr(b) for b in ENGINE_BACKENDS)
    raise ValueError(f"checkpoint_engine.backend={plan.backend!r}: allowed one of {allowed}")
