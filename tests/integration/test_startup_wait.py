"""``wait_started`` on real Ray tasks: roles that start side by side are timed each, and a
role that fails is raised at once through its own wait, not after the other role is up."""

from __future__ import annotations

import time

import pytest

from recipe.workers.cluster import wait_started

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _fail_after(seconds: float) -> None:
    time.sleep(seconds)
    raise RuntimeError("rank 0 could not load the model")


def test_each_role_is_timed_when_its_last_ref_ends(ray_for_module):
    ray = ray_for_module
    sleep = ray.remote(num_cpus=0)(_sleep)
    start = time.perf_counter()
    ended = wait_started(
        {"engines": [sleep.remote(1.5)], "trainer": [sleep.remote(0.1), sleep.remote(0.5)]},
        on_failure={},
    )
    assert 0.5 <= ended["trainer"] - start < ended["engines"] - start
    assert ended["engines"] - start >= 1.5


def test_a_failed_role_is_raised_through_its_wait_without_waiting_for_the_other(ray_for_module):
    ray = ray_for_module
    sleep, fail = ray.remote(num_cpus=0)(_sleep), ray.remote(num_cpus=0)(_fail_after)
    engines = sleep.remote(60.0)
    cleaned: list[str] = []

    def trainer_wait() -> None:
        cleaned.append("trainer")
        raise ValueError("trainer rank 0 failed")

    start = time.perf_counter()
    with pytest.raises(ValueError, match="trainer rank 0 failed"):
        wait_started(
            {"engines": [engines], "trainer": [fail.remote(0.2)]},
            on_failure={"trainer": trainer_wait},
        )
    assert cleaned == ["trainer"] and time.perf_counter() - start < 30.0
    ray.cancel(engines, force=True)
