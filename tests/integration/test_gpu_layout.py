"""Where trainer ranks and engines land on N GPUs, checked on a Ray that only believes it has
GPUs (``ray.init(num_gpus=2)`` on a CPU machine: Ray assigns GPU ids and sets
CUDA_VISIBLE_DEVICES, nothing touches a device).

Probe actors take each bundle with the options the worker groups use (``TrainerRanks``: a
rank on bundle r with ``trainer_gpu_fraction``; ``RolloutReplicas``: a replica on bundle r with
``replica_gpus``) and report the GPU ids Ray gave them: colocated, rank i and replica i share
GPU i and no two ranks share one (NCCL refuses two ranks on one device); split, no engine
sits on a trainer's GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType

import pytest

from recipe.config import RayConfig, RecipeConfig, TrainerConfig
from recipe.run import placement as placement_module
from recipe.run.placement import Placement
from recipe.workers.cluster import replica_gpus
from recipe.workers.config import ActorConfig, RolloutConfig

NUM_GPUS = 2


@pytest.fixture(scope="module")
def fake_gpu_ray() -> Iterator[ModuleType]:
    import ray

    if ray.is_initialized():
        raise RuntimeError("a Ray from an earlier test is still up")
    ray.init(address="local", num_cpus=6, num_gpus=NUM_GPUS, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _placement(monkeypatch, mode: str, trainer_gpus: int, engine_gpus: int) -> Placement:
    monkeypatch.setattr(placement_module, "resolve_device", lambda device: "cuda")
    cfg = RecipeConfig(
        mode=mode,
        trainer=TrainerConfig(device="cuda"),
        actor=ActorConfig(n_gpus_per_node=trainer_gpus, ppo_mini_batch_size=4),
        rollout=RolloutConfig(n_gpus_per_node=engine_gpus),
        ray=RayConfig(placement_timeout_s=20),
    )
    return Placement(cfg)


def _gpu_ids(ray, group, num_gpus: float, count: int) -> list[tuple[int, ...]]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote
    def probe() -> tuple[int, ...]:
        return tuple(int(i) for i in ray.get_gpu_ids())

    refs = [
        probe.options(
            num_cpus=1,
            num_gpus=num_gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, index),
        ).remote()
        for index in range(count)
    ]
    return ray.get(refs, timeout=60)


def _layout(ray, where: Placement) -> tuple[list, list]:
    cfg = where.cfg
    trainer = _gpu_ids(ray, where.take("trainer"), where.trainer_gpu_fraction, cfg.actor.world_size)
    share = replica_gpus(cfg.rollout.tensor_parallel_size, where.engine_gpu_fraction)
    engines = _gpu_ids(ray, where.take("rollout"), share, cfg.rollout.replicas)
    return trainer, engines


def test_colocated_sync_puts_rank_i_and_replica_i_on_gpu_i(fake_gpu_ray, monkeypatch):
    ray = fake_gpu_ray
    # gpu_memory_utilization 0.5: two groups of half-GPU bundles would pack both ranks on
    # GPU 0 and both engines on GPU 1.
    where = _placement(monkeypatch, "sync", NUM_GPUS, NUM_GPUS)
    assert where.one_group
    try:
        trainer, engines = _layout(ray, where)
    finally:
        where.release()
    assert sorted(trainer) == [(0,), (1,)]  # one rank per GPU
    assert engines == trainer  # replica i beside rank i
    _assert_released(ray)


def _assert_released(ray) -> None:
    """Every GPU free again (removal is asynchronous in Ray)."""
    deadline = time.monotonic() + 20
    while ray.available_resources().get("GPU", 0) < NUM_GPUS:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_split_modes_keep_engines_off_the_trainers_gpus(fake_gpu_ray, monkeypatch):
    ray = fake_gpu_ray
    where = _placement(monkeypatch, "fully_async", 1, 1)
    assert not where.one_group and where.trainer_gpu_fraction == 1.0
    groups = [where.take("trainer"), where.take("rollout")]
    try:
        trainer = _gpu_ids(ray, groups[0], 1.0, 1)
        engines = _gpu_ids(ray, groups[1], 1.0, 1)
    finally:
        for group in groups:
            ray.util.remove_placement_group(group)
    assert sorted(trainer + engines) == [(0,), (1,)]


def test_too_few_gpus_share_them_rank_by_rank(fake_gpu_ray, monkeypatch):
    ray = fake_gpu_ray
    where = _placement(monkeypatch, "one_step_off", NUM_GPUS, NUM_GPUS)  # 4 wanted, 2 here
    assert where.one_group
    try:
        trainer, engines = _layout(ray, where)
    finally:
        where.release()
    assert sorted(trainer) == [(0,), (1,)] and engines == trainer
    _assert_released(ray)
