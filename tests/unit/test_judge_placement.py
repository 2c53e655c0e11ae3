"""Where the judge's engines go and when they start. On a cluster with a whole GPU to spare per
judge replica, one GPU each; else a share of a GPU beside the policy's engine, the trainer's
share shrinking by as much. Sharing a GPU they start after the policy's engines (vLLM sizes its
KV cache from the device's free memory, which another engine starting beside it changes); on
their own GPUs and on CPU side by side. The wait has the policy engines' own deadline and fails
in one line naming what it waited for. The order in each recipe runs for real in
tests/integration/test_judge_runs.py (CPU)."""

from __future__ import annotations

import pytest
import ray

from recipe.config import RecipeConfig, TrainerConfig
from recipe.reward.config import RewardConfig
from recipe.reward.judge import JudgeConfig
from recipe.run import placement as placement_module
from recipe.run.placement import Placement
from recipe.workers.config import ActorConfig, RolloutConfig
from recipe.workers.judge_server import (
    OWN_GPU_MEMORY_UTILIZATION,
    judge_rollout_config,
    wait_for_policy_engines,
)


def _on_gpus(monkeypatch, gpus: int, mode: str = "fully_async", replicas: int = 1) -> Placement:
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": float(gpus)})
    monkeypatch.setattr(placement_module, "init_ray", lambda ray_cfg: None)
    monkeypatch.setattr(placement_module, "resolve_device", lambda device: "cuda")
    judge = JudgeConfig(model="judge-folder", gpu_memory_utilization=0.2, replicas=replicas)
    cfg = RecipeConfig(
        mode=mode,
        actor=ActorConfig(n_gpus_per_node=1),
        rollout=RolloutConfig(n_gpus_per_node=1, gpu_memory_utilization=0.5),
        reward=RewardConfig(judge=judge),
    )
    return Placement(cfg)


@pytest.mark.parametrize(
    ("gpus", "mode", "replicas", "own", "trainer_share"),
    [
        (1, "fully_async", 1, False, 0.3),  # one GPU: policy 0.5, judge 0.2, trainer the rest
        (2, "fully_async", 1, False, 0.8),  # trainer and engine apart, no GPU to spare
        (3, "fully_async", 1, True, 1.0),  # a third GPU: the judge's own
        (3, "fully_async", 2, False, 0.8),  # two judge replicas need two spare GPUs
        (2, "sync", 1, True, 0.5),  # colocated on GPU 0, the judge on GPU 1
    ],
)
def test_the_judge_gets_gpus_of_its_own_only_when_the_cluster_spares_one_per_replica(
    monkeypatch, gpus, mode, replicas, own, trainer_share
):
    where = _on_gpus(monkeypatch, gpus, mode, replicas)
    assert where.judge_own_gpus is own
    assert where.judge_gpu_fraction == (0.0 if own else 0.2)
    assert where.trainer_gpu_fraction == pytest.approx(trainer_share)
    assert where.judge_starts_last is not own  # on a GPU of its own, beside the others
    vllm_share = judge_rollout_config(where.cfg.reward.judge, where.cfg.rollout, own_gpu=own)
    assert vllm_share.gpu_memory_utilization == (OWN_GPU_MEMORY_UTILIZATION if own else 0.2)


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_the_judge_engine_takes_the_policy_backend_and_its_context_where_vllm_serves_it(backend):
    judge = JudgeConfig(model="judge-folder", max_model_len=1024)
    config = judge_rollout_config(judge, RolloutConfig(backend=backend))
    assert config.backend == backend
    expected = {"max_model_len": 1024} if backend == "vllm" else {}
    assert config.engine_kwargs == expected  # the hf backend refuses vLLM's engine args


def test_the_judge_starts_last_on_a_gpu_and_beside_the_engines_on_cpu():
    placement = Placement(RecipeConfig(trainer=TrainerConfig(device="cpu")))
    assert not placement.judge_starts_last
    placement.device = "cuda"
    assert placement.judge_starts_last


def test_the_wait_returns_once_the_policy_engines_started(monkeypatch):
    seen = []
    monkeypatch.setattr(ray, "get", lambda refs, timeout: seen.append((refs, timeout)))
    wait_for_policy_engines(["started"], 300.0)
    assert seen == [(["started"], 300.0)]


def test_a_policy_start_past_its_deadline_fails_the_judge_in_one_line(monkeypatch):
    def too_late(refs, timeout):
        raise ray.exceptions.GetTimeoutError("late")

    monkeypatch.setattr(ray, "get", too_late)
    with pytest.raises(RuntimeError, match=r"waited 300 s \(rollout\.start_timeout_s\)") as err:
        wait_for_policy_engines(["started"], 300.0)
    assert "\n" not in str(err.value)


def test_a_failed_policy_start_fails_the_judge_naming_it(monkeypatch):
    def failed(refs, timeout):
        raise ValueError("Free memory on device is less than desired")

    monkeypatch.setattr(ray, "get", failed)
    with pytest.raises(RuntimeError, match=r"policy's engines, which start first, failed"):
        wait_for_policy_engines(["started"], 300.0)
