"""Per-response token budgets (the long-tail workload) and how a group is planned with them."""

from __future__ import annotations

import pytest

from recipe.protocol import Trajectory
from recipe.utils.config_check import ConfigError
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.base import GenerationRequest, SampleJob, longtail_lengths, plan_group


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
