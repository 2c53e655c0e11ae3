"""Where a run's workers go: the device, the Ray cluster, and whether trainer and engines
share GPUs.

    Placement(cfg)
      device            trainer.device resolved ("auto": cuda when visible)
      colocated         the sync baseline: trainer ranks and engines on the same GPUs
      shares_gpus       colocated, or too few GPUs for trainer ranks + engine GPUs
      trainer_gpu_fraction / engine_gpu_fraction   Ray's share of a GPU for each side
      role_spec(role)   the bundles a role asks of the cluster (recipe/workers/cluster.py)
      take(role)        its placement group: both roles' groups are reserved at the first
                        take, before any worker starts (on a cluster of several nodes, once
                        every node has shown it sees the run directory); the caller's group
                        owns it then, unless ``one_group``
      one_group         GPUs shared on a GPU cluster: one group of whole-GPU bundles for both
                        roles, trainer rank i and engine replica i on bundle i; it stays this
                        object's, removed by ``release``

Ray starts on first use (``init_ray``), when a recipe builds its first worker group, so a bad
config or data file fails before any process is spawned. Every Ray worker inherits
``worker_env()``: the tiny-model cache, vLLM logging at WARNING unless ``VLLM_LOGGING_LEVEL``
says otherwise, and offline hubs.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from recipe.config import RayConfig, RecipeConfig
from recipe.workers.cluster import (
    RoleSpec,
    check_shared_dir,
    replica_gpus,
    reserve,
    role_bundle,
)

if TYPE_CHECKING:
    from recipe.model import HFModelConfig
    from recipe.workers.rollout.replicas import RolloutReplicas

ENGINE_LOG_DIR = "engines"
"""Run-directory folder of the engines' own output (recipe/workers/rollout/engine_log.py)."""

logger = logging.getLogger(__name__)

_INHERITED_ENV = (
    "RECIPE_CACHE_DIR",
    "VLLM_CPU_KVCACHE_SPACE",
    "HF_HUB_OFFLINE",
    "VLLM_LOGGING_LEVEL",
)


def resolve_device(device: str) -> str:
    """``trainer.device`` as the device to use; "cuda" without one visible is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device='cuda' but no CUDA device is visible")
    return device


def worker_env() -> dict[str, str]:
    """Environment every Ray worker inherits: the tiny-model cache, vLLM's warnings but not
    its INFO lines (a ``VLLM_LOGGING_LEVEL`` of the caller's is kept), offline hubs."""
    env = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM logs every pause/reload at INFO, which a sync per step would make most of the
    # run's output; its warnings stay (in RUN_DIR/engines/replica_R.log for the engines'
    # own processes, in the run's log for the rollout workers).
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def init_ray(ray_cfg: RayConfig) -> None:
    """Start or join the Ray cluster of ``ray.*`` (no-op when this process is connected):
    ``ray.address`` None starts a Ray of its own, even beside a cluster started on this
    machine (inside a Ray job, RAY_ADDRESS: the job's cluster)."""
    import ray

    if ray.is_initialized():
        return
    address = ray_cfg.address
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # Ray's own default would join a cluster that `ray start` left on this machine.
        address = "local"
    ray.init(
        address=address,
        num_cpus=ray_cfg.num_cpus if address == "local" else None,
        include_dashboard=ray_cfg.include_dashboard,
        log_to_driver=True,
        runtime_env={"env_vars": worker_env()},
    )


class Placement:
    """The run's device and GPU sharing (see the module docstring)."""

    ROLES = ("trainer", "rollout")

    def __init__(self, cfg: RecipeConfig, run_dir: Path | None = None) -> None:
        """``run_dir``: checked to be seen by every node of the cluster before the roles are
        reserved (``check_shared_dir``); None: not checked."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.device = resolve_device(cfg.trainer.device)
        self._reserved: dict[str, Any] = {}  # role -> placement group not taken yet
        self._taken: set[str] = set()
        self._shared: Any = None  # the one_group group, reserved here

    def role_spec(self, role: str) -> RoleSpec:
        """The bundles of ``role``: one per trainer rank, or one per engine replica (a CPU
        for its actor, its GPU share, the role's custom resources)."""
        cfg, gpu = self.cfg, self.device == "cuda"
        if role == "trainer":
            share = self.trainer_gpu_fraction if gpu else 0.0
            bundle = role_bundle(1, share, cfg.ray.trainer_resources)
            return RoleSpec(role, (bundle,) * cfg.actor.world_size, cfg.ray.trainer_strategy)
        tp = cfg.rollout.tensor_parallel_size
        share = replica_gpus(tp, self.engine_gpu_fraction) if gpu else 0.0
        bundle = role_bundle(1, share, cfg.ray.rollout_resources)
        return RoleSpec(role, (bundle,) * cfg.rollout.replicas, cfg.ray.rollout_strategy)

    def shared_spec(self) -> RoleSpec:
        """The ``one_group`` bundles: one per GPU the run uses, max(trainer ranks, engine
        replicas), each a whole GPU with a CPU for each actor it holds (trainer rank i and
        replica i on bundle i) and those roles' custom resources."""
        cfg = self.cfg
        num_ranks, num_replicas = cfg.actor.world_size, cfg.rollout.replicas
        replica_gpus(cfg.rollout.tensor_parallel_size, self.engine_gpu_fraction)  # refuses TP
        bundles = []
        for index in range(max(num_ranks, num_replicas)):
            extra = dict(cfg.ray.trainer_resources) if index < num_ranks else {}
            if index < num_replicas:
                for name, amount in cfg.ray.rollout_resources.items():
                    extra[name] = extra.get(name, 0.0) + amount
            cpus = (index < num_ranks) + (index < num_replicas)
            # The judge's engines take their share outside the group, beside the roles.
            bundles.append(role_bundle(cpus, 1.0 - self.judge_gpu_fraction, extra))
        return RoleSpec("trainer+rollout", tuple(bundles), cfg.ray.trainer_strategy)

    def take(self, role: str) -> Any:
        """``role``'s ready placement group, reserving every role's first (so that no worker
        starts before the cluster is known to hold the whole run). The caller owns it unless
        ``one_group``."""
        if role in self._taken:
            raise RuntimeError(f"the {role} placement group was taken already")
        if not self._reserved:
            init_ray(self.cfg.ray)
            if self.run_dir is not None:
                check_shared_dir(self.run_dir)
            try:
                self._reserve_roles()
            except BaseException:
                self.release()  # a role that fits must not hold its bundles for nothing
                raise
        self._taken.add(role)
        return self._reserved.pop(role)

    def _reserve_roles(self) -> None:
        timeout_s = self.cfg.ray.placement_timeout_s
        if self.one_group:
            self._shared = reserve(self.shared_spec(), timeout_s)
            self._reserved = {name: self._shared for name in self.ROLES}
            return
        for name in self.ROLES:
            if name not in self._taken:
                self._reserved[name] = reserve(self.role_spec(name), timeout_s)

    def adopt(self, role: str, group: Any) -> None:
        """Use ``group``, reserved by another process, as ``role``'s (``take`` returns it)."""
        self._reserved[role] = group

    def start_engines(self, model: HFModelConfig) -> RolloutReplicas:
        """Start ``rollout.replicas`` engines loading ``model`` in the rollout role's group
        (``take("rollout")``; starts Ray); each writes its output under the run directory's
        ``ENGINE_LOG_DIR``. Blocking: it returns once every engine started (or raises naming
        the replica)."""
        replicas = self.launch_engines(model)
        replicas.wait_started()
        return replicas

    def launch_engines(self, model: HFModelConfig) -> RolloutReplicas:
        """``start_engines`` without the wait: the engines are still starting when it returns
        (``RolloutReplicas.wait_started`` waits), so their start overlaps what the caller does
        next (the fully async driver starts its rollouter actor meanwhile)."""
        from recipe.workers.rollout.replicas import RolloutReplicas

        init_ray(self.cfg.ray)
        return RolloutReplicas(
            model,
            self.cfg.rollout,
            device=self.device,
            gpu_fraction=self.engine_gpu_fraction,
            log_dir=self.run_dir / ENGINE_LOG_DIR if self.run_dir is not None else None,
            placement_group=self.take("rollout"),
            placement_timeout_s=self.cfg.ray.placement_timeout_s,
            owns_placement_group=not self.one_group,
            max_prompt_length=self.cfg.data.max_prompt_length,
            lora_rank=self.cfg.actor.lora.rank,
            wait=False,
        )

    def start_judge(self, after: list[Any] | None = None) -> Any:
        """Start the run's judge engines (``reward.judge.model``) as the named ``JudgeServer``
        actor, its output under ``ENGINE_LOG_DIR``/judge; its handle, or None without a judge
        model (no judge, or an external endpoint). Does not wait for the engines: a call on
        the handle (``ready``) does, and a scorer's first call waits for them too. ``after``:
        refs its engines wait for before they start (``judge_starts_last``)."""
        judge = self.cfg.reward.judge
        if not judge.model:
            return None
        from recipe.model import ModelConfig
        from recipe.models.store import resolve_model_path
        from recipe.workers.judge_server import start_judge_server

        init_ray(self.cfg.ray)
        model = self.cfg.model
        return start_judge_server(
            judge,
            ModelConfig(str(resolve_model_path(judge.model)), dtype=model.dtype),
            self.cfg.rollout,
            device=self.device,
            gpu_fraction=1.0 if self.judge_own_gpus else self.judge_gpu_fraction,
            log_dir=self.run_dir / ENGINE_LOG_DIR / "judge" if self.run_dir is not None else None,
            after=after,
            own_gpu=self.judge_own_gpus,
        )

    @property
    def judge_starts_last(self) -> bool:
        """Whether the judge's engines must start after the policy's: on a GPU they share
        (recipe/workers/judge_server.py says why); on GPUs of their own and on CPU both start
        side by side."""
        return self.device == "cuda" and not self.judge_own_gpus

    @property
    def judge_gpu_fraction(self) -> float:
        """The share of the GPUs the run's other workers use that one judge engine takes:
        ``reward.judge.gpu_memory_utilization`` (0 without a judge model, or on GPUs of its
        own: ``judge_own_gpus``)."""
        judge = self.cfg.reward.judge
        return judge.gpu_memory_utilization if judge.model and not self.judge_own_gpus else 0.0

    def release(self) -> None:
        """Remove the groups reserved and never taken (a run that failed while starting) and
        the ``one_group`` group (call it once the workers in it are gone: Ray ends them)."""
        import ray

        groups = {id(g): g for g in [*self._reserved.values(), self._shared] if g is not None}
        for group in groups.values():
            try:
                ray.util.remove_placement_group(group)
            except Exception:  # Ray is shutting down: the groups go with it
                logger.debug("removing a placement group failed", exc_info=True)
        self._reserved.clear()
        self._shared = None

    @property
    def one_group(self) -> bool:
        """Both roles in one group of whole-GPU bundles: GPUs shared on a GPU cluster. Two
        groups of fractional bundles would not do: Ray packs fractional bundles of a group
        onto one GPU first (two trainer ranks at 0.5 each both land on GPU 0, which NCCL
        refuses, and the engines on GPU 1), so only a shared bundle keeps rank i and replica i
        together on GPU i."""
        return self.device == "cuda" and self.shares_gpus

    @property
    def colocated(self) -> bool:
        """Trainer ranks and engines share GPUs (the sync baseline); else separate GPUs."""
        return self.cfg.mode == "sync"

    @functools.cached_property
    def shares_gpus(self) -> bool:
        """Trainer ranks and engines are placed on the same GPUs: the colocated baseline, or a
        separate-resource mode on a cluster with fewer GPUs than trainer ranks + engine GPUs
        (e.g. one GPU: both run on it, split by ``rollout.gpu_memory_utilization``)."""
        if self.colocated:
            return True
        if self.device != "cuda":
            return False
        cfg = self.cfg
        engine_gpus = self.engine_gpus
        have = self.cluster_gpus
        if have >= cfg.actor.world_size + engine_gpus:
            return False
        if engine_gpus > have or cfg.actor.world_size > have:
            raise ValueError(
                f"mode={cfg.mode} needs actor.world_size={cfg.actor.world_size} trainer GPUs and "
                f"rollout replicas x tensor_parallel_size={engine_gpus} engine GPUs; the Ray "
                f"cluster has {have} GPUs: too few even to share them"
            )
        logger.warning(
            "mode=%s: %d GPUs for %d trainer ranks + %d engine GPUs: trainer and engines share "
            "GPUs (engines take rollout.gpu_memory_utilization=%.2f of each)",
            cfg.mode,
            have,
            cfg.actor.world_size,
            engine_gpus,
            cfg.rollout.gpu_memory_utilization,
        )
        return True

    @functools.cached_property
    def cluster_gpus(self) -> int:
        """The GPUs of the Ray cluster (starts Ray)."""
        import ray

        init_ray(self.cfg.ray)
        return int(ray.cluster_resources().get("GPU", 0))

    @property
    def engine_gpus(self) -> int:
        """The GPUs the policy's engines span: replicas x tensor-parallel size."""
        return self.cfg.rollout.replicas * self.cfg.rollout.tensor_parallel_size

    @functools.cached_property
    def judge_own_gpus(self) -> bool:
        """The judge's engines (``reward.judge.model``) each on a GPU of its own: the cluster
        has a whole GPU per judge replica beyond those the trainer ranks and the policy's
        engines use (sharing them, in the colocated baseline or on too few GPUs, they use
        the larger count). Else they take ``reward.judge.gpu_memory_utilization`` of a GPU
        beside the others."""
        judge = self.cfg.reward.judge
        if self.device != "cuda" or not judge.model:
            return False
        ranks = self.cfg.actor.world_size
        used = max(ranks, self.engine_gpus) if self.shares_gpus else ranks + self.engine_gpus
        return self.cluster_gpus >= used + judge.replicas

    @property
    def trainer_gpu_fraction(self) -> float:
        """Ray's GPU share of one trainer rank. Fractions only schedule; the engine's real
        memory cap is ``rollout.gpu_memory_utilization``."""
        if not self.shares_gpus:
            return 1.0 - self.judge_gpu_fraction
        return 1.0 - self.cfg.rollout.gpu_memory_utilization - self.judge_gpu_fraction

    @property
    def engine_gpu_fraction(self) -> float:
        """Ray's GPU share of one engine worker."""
        return self.cfg.rollout.gpu_memory_utilization if self.shares_gpus else 1.0
