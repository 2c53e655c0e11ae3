"""``RolloutGroup``: the driver's handle on ``rollout.num_replicas`` rollout worker actors.

    driver --generate(groups)--> replica 0 (engine) ... replica k-1 (engine)
           <--list[list[Trajectory]] in request order--

Each prompt group goes to one replica (round robin); every replica is an async Ray actor,
so all groups of a call are in flight at once and each finishes on its own. Sampling seeds
are derived from (``rollout.seed``, prompt uid, weights version), so a run is repeatable
for a given data order and two recipes sample the same prompt the same way on equal weights.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import PromptRecord, Trajectory
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import make_rollout_worker_cls
from recipe.workers.rollout.base import GenerationRequest

logger = logging.getLogger(__name__)


def request_seed(base_seed: int, prompt_uid: str, version: int) -> int:
    digest = hashlib.blake2b(f"{base_seed}:{prompt_uid}:{version}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


class RolloutGroup:
    """``num_replicas`` engines as Ray actors, driven from one process."""

    def __init__(
        self, model: HFModelConfig, cfg: RolloutConfig, *, device: str, gpu_fraction: float = 1.0
    ) -> None:
        """``gpu_fraction``: the share of a GPU each replica reserves in Ray (< 1 colocated)."""
        import ray

        if cfg.tensor_parallel_size != 1:
            raise ValueError(
                f"rollout.tensor_parallel_size={cfg.tensor_parallel_size} is not supported yet: "
                "allowed 1 (scale out with rollout.num_replicas)"
            )
        self.cfg = cfg
        self.version = 0
        worker_cls = make_rollout_worker_cls(cfg.backend)
        resources: dict[str, Any] = {"num_cpus": 1}
        if device == "cuda":
            resources["num_gpus"] = gpu_fraction
        actor_cls = ray.remote(**resources)(worker_cls)
        # The worker gets the resolved path: no replica builds or resolves the default itself.
        model_cfg = ModelConfig(
            path=str(model.path), dtype=model.dtype, trust_remote_code=model.trust_remote_code
        )
        self.workers = [actor_cls.remote(model_cfg, cfg) for _ in range(cfg.num_replicas)]
        # Constructors are where engines start: wait so failures surface here.
        ray.get([w.get_version.remote() for w in self.workers])
        self._next_replica = 0

    def generate(
        self,
        records: Sequence[PromptRecord],
        prompt_ids: Sequence[list[int]],
        *,
        n: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
    ) -> list[list[Trajectory]]:
        """One group per record, all in flight at once; results in ``records`` order."""
        import ray

        refs = [
            self.submit(record.uid, ids, n=n, temperature=temperature, top_p=top_p, top_k=top_k)
            for record, ids in zip(records, prompt_ids, strict=True)
        ]
        return ray.get(refs)

    def submit(
        self,
        prompt_uid: str,
        prompt_ids: list[int],
        *,
        n: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
        resume: list[Trajectory] | None = None,
    ) -> Any:
        """Start one group on the next replica; returns its Ray ObjectRef."""
        request = GenerationRequest(
            prompt_uid=prompt_uid,
            prompt_ids=list(prompt_ids),
            n=n,
            max_tokens=self.cfg.response_length,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=request_seed(self.cfg.seed, prompt_uid, self.version),
            resume=resume,
        )
        worker = self.workers[self._next_replica]
        self._next_replica = (self._next_replica + 1) % len(self.workers)
        return worker.generate.remote(request)

    def pause(self) -> None:
        import ray

        ray.get([w.pause.remote() for w in self.workers])

    def resume(self) -> None:
        import ray

        ray.get([w.resume.remote() for w in self.workers])

    def update_weights_from_file(self, path: str, version: int) -> None:
        """Every replica loads ``path`` and serves ``version``; raises if any fails."""
        import ray

        ray.get([w.update_weights_from_file.remote(path, version) for w in self.workers])
        self.version = version

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=60)
        finally:
            for worker in self.workers:
                ray.kill(worker)
            self.workers = []
