"""On a GPU the judge's engines start after the policy's (vLLM sizes its KV cache from the
device's free memory, which another engine starting beside it changes); on CPU side by side.
The wait has the policy engines' own deadline and fails in one line naming what it waited
for. The order in each recipe runs for real in tests/integration/test_judge_runs.py (CPU)."""

from __future__ import annotations

import pytest
import ray

from recipe.config import RecipeConfig, TrainerConfig
from recipe.run.placement import Placement
from recipe.workers.judge_server import wait_for_policy_engines


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
