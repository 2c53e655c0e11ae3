"""Rollout workers: the generation side of the RL loop (see ``base`` for the contract).

``make_rollout_worker_cls(rollout.backend)`` picks the engine; the class is plain Python and
the caller starts it as an actor and calls it through its typed client (client.py), e.g.
``ReplicaClient.start(cls, {"num_cpus": 1}, model_cfg, rollout_cfg)``.
Backends import lazily so a machine without vLLM can still use the ``hf`` backend.
"""

from __future__ import annotations

from recipe.workers.config import ROLLOUT_BACKENDS
from recipe.workers.rollout.base import RolloutWorker
from recipe.workers.rollout.requests import GenerationRequest

__all__ = ["GenerationRequest", "RolloutWorker", "make_rollout_worker_cls"]


def make_rollout_worker_cls(backend: str) -> type[RolloutWorker]:
    """The ``RolloutWorker`` class of ``rollout.backend`` (``vllm`` or ``hf``)."""
    if backend == "vllm":
        from recipe.workers.rollout.vllm_worker import VLLMRolloutWorker

        return VLLMRolloutWorker
    if backend == "hf":
        from recipe.workers.rollout.hf_worker import HFRolloutWorker

        return HFRolloutWorker
    allowed = ", ".join(repr(b) for b in ROLLOUT_BACKENDS)
    raise ValueError(f"rollout.backend={backend!r} is invalid: allowed one of {allowed}")
