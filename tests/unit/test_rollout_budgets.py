"""Per-response token budgets (the long-tail workload) and how a group is planned with them."""

from __future__ import annotations

import pytest

from recipe.protocol import Trajectory
from recipe.utils.config_check import ConfigError
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.requests import (
    GenerationRequest,
    SampleJob,
    longtail_lengths,
    plan_group,
)


def test_longtail_lengths_are_seeded_bounded_and_long_tailed():
    lengths = longtail_lengths(7, 4000, 512)
    assert lengths == longtail_lengths(7, 4000, 512)
    assert lengths != longtail_lengths(8, 4000, 512)
    assert all(1 <= x <= 512 for x in lengths)
    long = sum(x >= 0.75 * 512 for x in lengths) / len(lengths)
    short = sum(x <= 512 / 8 for x in lengths) / len(lengths)
    assert 0.08 < long < 0.12 and short > 0.85
    mean = sum(lengths) / len(lengths)
    assert max(lengths) > 5 * mean  # the tail: the slowest response is far above the mean


def test_fresh_group_uses_each_samples_budget():
    request = GenerationRequest("p", [1, 2], n=3, max_tokens=10, sample_max_tokens=[2, 10, 5])
    plan = plan_group(request)
    assert [job.max_new_tokens for job in plan if isinstance(job, SampleJob)] == [2, 10, 5]


def test_resumed_partial_keeps_its_own_budget():
    def traj(i: int, tokens: int, finish: str) -> Trajectory:
        return Trajectory(
            prompt_uid="p",
            sample_index=i,
            prompt_ids=[1, 2],
            response_ids=[9] * tokens,
            rollout_logprobs=[-1.0] * tokens,
            token_versions=[0] * tokens,
            finish_reason=finish,
        )

    resume = [traj(0, 2, "length"), traj(1, 4, "aborted"), traj(2, 5, "aborted")]
    request = GenerationRequest(
        "p", [1, 2], n=3, max_tokens=10, sample_max_tokens=[2, 10, 5], resume=resume
    )
    plan = plan_group(request)
    assert plan[0] is resume[0]
    assert isinstance(plan[1], SampleJob) and plan[1].max_new_tokens == 6
    assert isinstance(plan[2], Trajectory) and plan[2].finish_reason == "length"  # spent


@pytest.mark.parametrize("budgets", [[1, 2], [0, 1, 1], [1, 11, 1]])
def test_bad_budgets_are_rejected(budgets):
    with pytest.raises(ValueError, match="sample_max_tokens"):
        GenerationRequest("p", [1], n=3, max_tokens=10, sample_max_tokens=budgets)


def test_longtail_profile_needs_the_vllm_backend():
    with pytest.raises(ConfigError, match=r"rollout\.length_profile"):
        RolloutConfig(backend="hf", length_profile="longtail")
    with pytest.raises(ConfigError, match=r"rollout\.length_profile"):
        RolloutConfig(length_profile="uniform")


def test_rollout_replicas_follow_the_gpu_pool_unless_set():
    assert RolloutConfig().replicas == 1
    assert RolloutConfig(n_gpus_per_node=4, nnodes=2).replicas == 8
    assert RolloutConfig(num_replicas=3, n_gpus_per_node=4).replicas == 3


@pytest.mark.parametrize(
    ("gpus", "mode", "trainer_gpus", "engines", "shared"),
    [
        (1, "fully_async", 1, 1, True),  # one GPU: both on it
        (2, "fully_async", 1, 1, False),  # enough for separate GPUs
        (8, "one_step_off", 4, 4, False),
        (4, "one_step_off", 4, 4, True),
        (0, "fully_async", 1, 1, False),  # CPU run: nothing to share
        (2, "sync", 2, 2, True),  # the colocated baseline always shares
    ],
)
def test_separate_modes_share_gpus_only_when_too_few(
    monkeypatch, gpus, mode, trainer_gpus, engines, shared
):
    import ray

    from recipe.config import RecipeConfig
    from recipe.run import placement
    from recipe.workers.config import ActorConfig

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": float(gpus)})
    monkeypatch.setattr(placement, "init_ray", lambda ray_cfg: None)
    monkeypatch.setattr(placement, "resolve_device", lambda device: "cuda" if gpus else "cpu")
    cfg = RecipeConfig(
        mode=mode,
        actor=ActorConfig(n_gpus_per_node=trainer_gpus),
        rollout=RolloutConfig(n_gpus_per_node=engines),
    )
    where = placement.Placement(cfg)
    assert where.shares_gpus is shared
    assert where.trainer_gpu_fraction == (0.5 if shared else 1.0)
    assert where.engine_gpu_fraction == (0.5 if shared else 1.0)


def test_too_few_gpus_even_to_share_names_the_keys(monkeypatch):
    import ray

    from recipe.config import RecipeConfig
    from recipe.run import placement

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 2.0})
    monkeypatch.setattr(placement, "init_ray", lambda ray_cfg: None)
    monkeypatch.setattr(placement, "resolve_device", lambda device: "cuda")
    where = placement.Placement(RecipeConfig(rollout=RolloutConfig(num_replicas=4)))
    with pytest.raises(ValueError, match="tensor_parallel_size=4 engine GPUs"):
        _ = where.shares_gpus
