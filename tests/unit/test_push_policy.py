"""The weight-push failure policy of ``ParameterSynchronizer.push`` (checkpoint_engine.*):
stop or retry, a repaired replica retried uncounted, a dead trainer rank never retried, the
engines paused once per push by their owner, and the version handed back only by a push that
landed. The transport itself is faked: each attempt fails or succeeds as the test says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from recipe.checkpoint_engine.base import WeightSyncError
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer
from recipe.faults import TrainerWorkerError


class Engines:
    """``ServingEngines`` that count their owner's calls; ``repair`` answers ``repairs``."""

    stage_while_serving = True

    def __init__(self, repairs: bool = False) -> None:
        self.repairs, self.repaired = repairs, []
        self.paused_on: list[int] = []  # the attempt each pause came in
        self.num_resumes = 0
        self.attempt = 0

    def workers(self) -> list[Any]:
        return []

    def pause(self) -> None:
        self.paused_on.append(self.attempt)

    def resume(self) -> None:
        self.num_resumes += 1

    def repair(self, error: WeightSyncError) -> bool:
        self.repaired.append(error.phase)
        return self.repairs


class ScriptedSynchronizer(ParameterSynchronizer):
    """Fails the first ``failures`` attempts in ``fail_phase`` (``transfer``: before the
    engines pause; ``load``: after it), then lands."""

    def __init__(
        self,
        failures: int,
        *,
        dead_rank: bool = False,
        fail_phase: str = "transfer",
        engines: Engines | None = None,
        **policy: Any,
    ) -> None:
        def check_alive() -> None:
            if dead_rank:
                raise TrainerWorkerError(1, "pid 9, The actor is dead")

        trainer = SimpleNamespace(check_alive=check_alive)
        self.engines = engines or Engines()
        super().__init__(trainer, self.engines, CheckpointEngineConfig(**policy))
        self.failures, self.attempts, self.resets = failures, 0, 0
        self.fail_phase = fail_phase
        self.pushed_from: list[int] = []

    def _sync(self, version: int, paused: list[bool]) -> dict[str, float]:
        self.attempts += 1
        self.engines.attempt = self.attempts
        self.pushed_from.append(version)
        failing = self.attempts <= self.failures
        if failing and self.fail_phase == "transfer":
            raise WeightSyncError("transfer", "rollout replica 0", "no answer within 5.0 s")
        self._pause_engines(paused)
        if failing:
            raise WeightSyncError(self.fail_phase, "rollout replica 0", "no answer within 5.0 s")
        self.engines.resume()
        return {"sync/total_s": 0.5}

    def reset_transport(self) -> None:
        self.resets += 1
        super().reset_transport()


def test_a_landed_push_returns_the_next_version_and_its_metrics():
    sync = ScriptedSynchronizer(0)
    result = sync.push(7)
    assert (result.version, result.metrics, result.num_retries) == (8, {"sync/total_s": 0.5}, 0)
    assert not sync.is_stale


def test_on_failure_stop_raises_the_first_failure_naming_the_phase():
    sync = ScriptedSynchronizer(1, on_failure="stop")
    with pytest.raises(WeightSyncError, match="phase 'transfer' failed at rollout replica 0"):
        sync.push(4)
    assert sync.attempts == 1 and sync.is_stale


def test_on_failure_retry_rebuilds_the_transport_and_counts_each_retry():
    sync = ScriptedSynchronizer(2, on_failure="retry", max_retries=2)
    result = sync.push(4)
    assert sync.attempts == 3 and sync.resets == 2 and sync.pushed_from == [4, 4, 4]
    assert result.version == 5 and result.num_retries == 2 and sync.num_retries == 2
    assert not sync.is_stale


def test_on_failure_retry_stops_once_the_retries_are_used_up():
    sync = ScriptedSynchronizer(5, on_failure="retry", max_retries=2)
    with pytest.raises(WeightSyncError):
        sync.push(4)
    assert sync.attempts == 3 and sync.num_retries == 2 and sync.is_stale


def test_a_push_cut_by_a_repaired_replica_is_retried_uncounted_even_with_stop():
    sync = ScriptedSynchronizer(1, on_failure="stop", engines=Engines(repairs=True))
    result = sync.push(4)
    assert sync.engines.repaired == ["transfer"] and sync.attempts == 2
    assert result.version == 5 and result.num_retries == 0 and sync.num_retries == 0


def test_a_repair_that_fixes_nothing_falls_back_to_the_policy():
    sync = ScriptedSynchronizer(1, on_failure="stop")
    with pytest.raises(WeightSyncError):
        sync.push(4)
    assert sync.attempts == 1 and sync.engines.repaired == ["transfer"]


def test_a_dead_trainer_rank_is_never_retried():
    engines = Engines(repairs=True)
    sync = ScriptedSynchronizer(
        1, dead_rank=True, on_failure="retry", max_retries=3, engines=engines
    )
    with pytest.raises(TrainerWorkerError, match="trainer rank 1 died"):
        sync.push(4)
    assert sync.attempts == 1 and engines.repaired == []


@pytest.mark.parametrize("fail_phase", ["transfer", "load"])
def test_the_engines_owner_pauses_them_once_per_push_whatever_the_retries(fail_phase):
    sync = ScriptedSynchronizer(2, on_failure="retry", max_retries=2, fail_phase=fail_phase)
    result = sync.push(4)
    assert result.version == 5 and sync.attempts == 3
    # Staged on the third attempt (transfer failures) or already on the first (load failures).
    assert sync.engines.paused_on == ([3] if fail_phase == "transfer" else [1])
    assert sync.engines.num_resumes == 1
    sync.push(5)  # the next push pauses them again
    assert len(sync.engines.paused_on) == 2
