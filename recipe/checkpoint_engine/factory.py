"""The one factory of checkpoint-engine transports, keyed on ``TransferPlan.backend``.

The class of each backend is its line in the registry (transports.py). Kept apart from
base.py so the contract does not import its implementations (each backend module imports the
contract).
"""

from __future__ import annotations

import torch

from recipe.checkpoint_engine.base import CheckpointEngine, TransferPlan
from recipe.checkpoint_engine.transports import engine_backends, get_transport
from recipe.utils.import_path import load_attribute


def make_checkpoint_engine(
    plan: TransferPlan, *, rank: int, device: torch.device
) -> CheckpointEngine:
    """The engine of ``plan.backend`` (``checkpoint_engine.backend`` after ``auto``)."""
    if plan.backend not in engine_backends():
        allowed = ", ".join(repr(b) for b in engine_backends())
        raise ValueError(f"checkpoint_engine.backend={plan.backend!r}: allowed one of {allowed}")
    transport = get_transport(plan.backend)
    _, engine_cls = load_attribute("checkpoint_engine.backend", transport.engine, "class")
    if not (isinstance(engine_cls, type) and issubclass(engine_cls, CheckpointEngine)):
        raise TypeError(f"transport {transport.name!r}: {transport.engine} is no CheckpointEngine")
    return engine_cls(plan, rank=rank, device=device)
