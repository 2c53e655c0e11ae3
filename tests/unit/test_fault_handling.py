"""Fault handling without Ray actors: the replica supervisor's state machine against fake
workers, the weight-push failure policy, and how a run reports a failure.

The same paths run for real (SIGKILLed actors and engine processes, a SIGSTOPped sync peer)
in tests/integration/test_faults.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from recipe.checkpoint.store import write_checkpoint
from recipe.checkpoint_engine.base import WeightSyncError
from recipe.faults import (
    DivergedPolicyError,
    RolloutWorkerError,
    RunFailure,
    TrainerWorkerError,
    describe_death,
    fails_cleanly,
    resume_hint,
)
from recipe.observability.config import LoggerConfig
from recipe.observability.tracking import Tracker
from recipe.utils.output_dir import OutputDirError, check_writable_dir
from recipe.utils.weights_file import WeightsFile
from recipe.workers.cluster import PlacementError
from recipe.workers.rollout import deaths
from recipe.workers.rollout.deaths import failed_health_check
from recipe.workers.rollout.replicas import RolloutReplicas, RoundRobin
from tests.helpers.fake_engines import actor_died

# ---- fake replicas ---------------------------------------------------------------------------


class FakeWorker:
    """A rollout replica's client (``ReplicaClient``) whose health is set by the test: ``ok``,
    ``dead`` or ``hung``; each call returns a coroutine, awaited like an ObjectRef."""

    def __init__(self, state: str = "ok") -> None:
        self.state, self.version, self.paused = state, 0, False
        self.engine_error: str | None = None  # state "engine_dead": its engine died of this
        self.num_finished = 0
        self.actor_id = f"actor-{id(self):x}"

    async def check_health(self) -> None:
        if self.state == "dead":
            raise actor_died()
        if self.state == "engine_dead":
            raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        if self.state == "hung":
            await asyncio.sleep(3600)

    async def engine_failure(self) -> dict[str, Any]:
        log = "/run/engines/replica_0.log"
        return {"error": self.engine_error, "log": log, "num_finished": self.num_finished}

    async def get_version(self) -> int:
        if self.state == "start_hung":  # its engine never finishes starting
            await asyncio.sleep(3600)
        return self.version

    async def pause(self) -> None:
        await self._set_paused(True)

    async def resume(self) -> None:
        await self._set_paused(False)

    async def _set_paused(self, paused: bool) -> None:
        if self.state == "dead":
            raise actor_died()
        if self.state == "hung":
            await asyncio.sleep(3600)
        self.paused = paused

    async def update_weights_from_file(
        self, path: str, version: int, sha256: str | None = None
    ) -> None:
        self.loaded, self.version, self.loaded_sha256 = path, version, sha256


class FakeGroup:
    def __init__(self, num: int) -> None:
        self.workers = [FakeWorker() for _ in range(num)]
        self.restarted: list[int] = []
        self.placement = RoundRobin(num)
        self.lost: set[int] = set()  # replicas whose bundle's node left with no room elsewhere
        self.cfg = SimpleNamespace(start_timeout_s=30.0)
        self.restart_state = "ok"  # what a restarted worker does

    def wait_for_bundle(self, index: int) -> str:
        if index in self.lost:
            raise PlacementError(f"rollout replica {index}: bundle {index}: node ab12 is gone")
        return "node"

    def restart(self, index: int) -> FakeWorker:
        self.workers[index] = FakeWorker(self.restart_state)
        self.restarted.append(index)
        return self.workers[index]

    def place_with(self, serving: Any) -> None:
        self.placement.serving = serving

    def next_replica(self) -> int:
        return self.placement.next()


def _supervisor(
    group: FakeGroup, max_restarts: int = 3, *, version: int = 0
) -> tuple[ReplicaSupervisor, list]:
    """A supervisor of ``group`` whose rollouter serves ``version``."""
    fatal: list[BaseException] = []
    sup = ReplicaSupervisor(
        group, served_version=lambda: version, max_restarts=max_restarts, on_fatal=fatal.append
    )
    return sup, fatal


async def _settle() -> None:
    """Let the supervisor's tasks run (a restart first waits for its bundle in a thread)."""
    for _ in range(5):
        await asyncio.sleep(0.02)


def test_a_dead_replica_is_restarted_and_serves_again_at_version_zero():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, fatal = _supervisor(group)
        old = group.workers[1]
        old.state = "dead"
        assert await sup.on_failure(1, old, RuntimeError("generate failed"))
        assert sup.in_service == [True, False]
        # Groups placed by the RolloutReplicas itself (validation) skip it too.
        assert [group.next_replica() for _ in range(3)] == [0, 0, 0]
        assert await sup.on_failure(1, old, actor_died())  # the same death, seen again
        await _settle()
        assert group.restarted == [1] and sup.in_service == [True, True]
        assert sup.num_restarts == 1 and not fatal and not sup.weights_wanted.is_set()

    asyncio.run(scenario())


def test_failures_seen_concurrently_for_one_death_restart_the_replica_once():
    async def scenario() -> None:
        group = FakeGroup(1)
        sup, _ = _supervisor(group)
        old = group.workers[0]
        old.state = "dead"  # its in-flight groups all fail; each health check waits
        results = await asyncio.gather(
            *(sup.on_failure(0, old, RuntimeError("engine dead")) for _ in range(3))
        )
        await _settle()
        assert results == [True, True, True]
        assert group.restarted == [0] and sup.num_restarts == 1

    asyncio.run(scenario())


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    """Wait for ``condition()`` (a restart waits for its bundle in a thread)."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_replica_whose_node_left_is_retired_and_the_others_go_on_without_it():
    async def scenario() -> None:
        group = FakeGroup(3)
        sup, fatal = _supervisor(group)
        old = group.workers[1]
        old.state, group.lost = "dead", {1}
        assert await sup.on_failure(1, old, actor_died())
        await _until(lambda: sup.retired)
        await _settle()
        assert sup.retired == {1} and group.restarted == [] and not fatal
        assert sup.in_service == [True, False, True] and sup.num_restarts == 1
        assert [i for i, _ in sup.up()] == [0, 2]  # no health checks, pauses or pushes
        assert {await sup.pick() for _ in range(4)} == {0, 2}
        await sup.pause_all()  # the dead worker is not asked
        assert not old.paused and group.workers[0].paused
        assert await sup.recover() == []

    asyncio.run(scenario())


def test_the_last_replica_lost_with_its_node_fails_the_run_naming_it():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, fatal = _supervisor(group)
        for index in (0, 1):
            group.workers[index].state = "dead"
        group.lost = {0, 1}
        assert await sup.on_failure(0, group.workers[0], actor_died())
        await _until(lambda: sup.retired)
        assert await sup.on_failure(1, group.workers[1], actor_died())
        await _until(lambda: fatal)
        assert sup.retired == {0}
        assert isinstance(fatal[0], RolloutWorkerError)
        assert "rollout replica 1" in str(fatal[0]) and "node ab12 is gone" in str(fatal[0])
        assert "no rollout replica is left" in str(fatal[0])

    asyncio.run(scenario())


def test_a_node_loss_past_max_restarts_fails_the_run_before_waiting_for_the_bundle():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, fatal = _supervisor(group, max_restarts=0)
        group.workers[0].state, group.lost = "dead", {0}
        assert await sup.on_failure(0, group.workers[0], actor_died())
        await _settle()
        assert fatal and "rollout.max_restarts=0" in str(fatal[0]) and not sup.retired

    asyncio.run(scenario())


def test_a_replica_restarted_after_a_push_waits_for_the_served_weights():
    async def scenario() -> None:
        group = FakeGroup(1)
        sup, _ = _supervisor(group, version=3)
        sup.paused = True  # a sync is in progress
        assert await sup.on_failure(0, group.workers[0], actor_died())
        assert await sup.recover() == [0]
        assert sup.weights_wanted.is_set() and sup.in_service == [False]
        picked = asyncio.create_task(sup.pick())
        await _settle()
        assert not picked.done()  # nothing serves: a new group waits
        await sup.install_weights(0, WeightsFile("/run/.weights/w.safetensors", 8, "ab12"), 3)
        new = group.workers[0]
        assert (new.loaded, new.version, new.paused) == ("/run/.weights/w.safetensors", 3, True)
        assert new.loaded_sha256 == "ab12"  # the replica verifies the file before loading
        assert sup.in_service == [True] and not sup.weights_wanted.is_set()
        assert await picked == 0

    asyncio.run(scenario())


def test_a_replica_restarted_between_syncs_serves_only_after_loading_the_served_version():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, _ = _supervisor(group, version=2)
        assert await sup.on_failure(1, group.workers[1], actor_died())
        assert await sup.recover() == [1] and sup.in_service == [True, False]
        await sup.install_weights(1, WeightsFile("/run/.weights/w.safetensors", 8, "ab12"), 2)
        assert sup.in_service == [True, True] and group.workers[1].version == 2

    asyncio.run(scenario())


def test_a_replica_that_comes_up_during_a_sync_waits_for_the_trainer_even_at_version_zero():
    async def scenario() -> None:
        group = FakeGroup(1)
        sup, _ = _supervisor(group)
        await sup.pause_all()  # the first push may be under way: version 0 or 1 is served
        assert await sup.on_failure(0, group.workers[0], actor_died())
        assert await sup.recover() == [0] and sup.in_service == [False]
        await sup.install_weights(0, None, 0)  # the trainer says: still version 0
        assert sup.in_service == [True] and group.workers[0].paused
        assert not hasattr(group.workers[0], "loaded")

    asyncio.run(scenario())


def test_the_batch_recipes_judge_a_replica_by_the_same_classifier(monkeypatch):
    """``RolloutReplicas.worker_error``: an error naming no actor has every replica checked;
    the one whose engine died is named with its engine's root error, a hung one is not."""
    monkeypatch.setattr(deaths, "HEALTH_TIMEOUT_S", 0.05)
    group = RolloutReplicas.__new__(RolloutReplicas)  # no engines: the classifier only
    hung, dead = FakeWorker("hung"), FakeWorker("engine_dead")
    dead.engine_error = "ValueError: bad engine setting"
    group.workers, group._retired = [hung, dead], {}
    error = asyncio.run(group.worker_error(RuntimeError("generate failed")))
    assert isinstance(error, RolloutWorkerError) and error.replica == 1
    assert "ValueError: bad engine setting" in str(error)
    dead.state = "ok"
    assert asyncio.run(group.worker_error(RuntimeError("generate failed"))) is None


def test_a_hung_replica_is_not_restarted(monkeypatch):
    monkeypatch.setattr(deaths, "HEALTH_TIMEOUT_S", 0.05)

    async def scenario() -> None:
        group = FakeGroup(1)
        sup, _ = _supervisor(group)
        group.workers[0].state = "hung"
        assert not await sup.on_failure(0, group.workers[0], RuntimeError("timeout"))
        assert await sup.recover() == []
        assert group.restarted == [] and sup.in_service == [True]

    asyncio.run(scenario())


def test_pausing_a_hung_replica_fails_within_the_deadline_naming_it():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup = ReplicaSupervisor(
            group, served_version=lambda: 0, max_restarts=3, on_fatal=print, timeout_s=0.05
        )
        group.workers[1].state = "hung"
        with pytest.raises(WeightSyncError, match="phase 'pause' failed at rollout replica 1"):
            await asyncio.wait_for(sup.pause_all(), 5)
        assert group.workers[0].paused and sup.num_restarts == 0

    asyncio.run(scenario())


def test_a_restart_whose_engine_never_starts_fails_the_run_within_the_deadline_naming_it():
    async def scenario() -> None:
        group = FakeGroup(2)
        group.cfg.start_timeout_s = 0.05
        group.restart_state = "start_hung"
        sup, fatal = _supervisor(group)
        group.workers[1].state = "dead"
        assert await sup.on_failure(1, group.workers[1], actor_died())
        for _ in range(50):
            if fatal:
                break
            await asyncio.sleep(0.02)
        (error,) = fatal
        assert isinstance(error, RolloutWorkerError)
        assert "rollout replica 1" in str(error) and "rollout.start_timeout_s=0.05 s" in str(error)
        assert "its engine start" in str(error)

    asyncio.run(scenario())


def test_a_death_past_max_restarts_fails_the_run_naming_the_replica():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, fatal = _supervisor(group, max_restarts=1)
        assert await sup.on_failure(0, group.workers[0], actor_died())
        await _settle()
        assert await sup.on_failure(0, group.workers[0], actor_died(pid=7))
        assert len(fatal) == 1 and isinstance(fatal[0], RolloutWorkerError)
        message = str(fatal[0])
        assert message.startswith("rollout replica 0 died: pid 7, The actor is dead")
        assert "rollout.max_restarts=1 restarts are used up" in message
        with pytest.raises(RolloutWorkerError):
            await sup.recover()

    asyncio.run(scenario())


def _engine_death(worker: FakeWorker, error: str, num_finished: int = 0) -> FakeWorker:
    worker.state, worker.engine_error, worker.num_finished = "engine_dead", error, num_finished
    return worker


def test_a_restart_that_dies_of_the_same_engine_error_before_any_response_stops_the_run():
    async def scenario() -> None:
        group = FakeGroup(1)
        sup, fatal = _supervisor(group, max_restarts=3)
        offset = "RuntimeError: CPU Generator does not use offset"
        first = _engine_death(group.workers[0], offset, num_finished=0)
        assert await sup.on_failure(0, first, RuntimeError("generate failed"))
        await _settle()
        assert group.restarted == [0] and not fatal  # a first death is always restarted
        again = _engine_death(group.workers[0], offset)
        results = await asyncio.gather(
            *(sup.on_failure(0, again, RuntimeError("generate failed")) for _ in range(4))
        )
        await _settle()
        assert results == [True] * 4
        assert group.restarted == [0], "a deterministic failure must not be restarted into"
        assert len(fatal) == 1, "one failure, however many groups saw it"
        assert str(fatal[0]) == (
            f"rollout replica 0 died: its engine failed: {offset} (engine log: "
            "/run/engines/replica_0.log); its restart died of the same error before finishing "
            "a response, so it is not restarted again"
        )

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("second_error", "num_finished"),
    [("RuntimeError: CPU Generator does not use offset", 3), ("MemoryError: out of KV", 0)],
    ids=["same-error-after-finishing-responses", "another-error"],
)
def test_a_restart_that_served_first_or_dies_of_another_error_is_restarted_again(
    second_error, num_finished
):
    async def scenario() -> None:
        group = FakeGroup(1)
        sup, fatal = _supervisor(group, max_restarts=3)
        first = "RuntimeError: CPU Generator does not use offset"
        assert await sup.on_failure(0, _engine_death(group.workers[0], first), RuntimeError())
        await _settle()
        again = _engine_death(group.workers[0], second_error, num_finished)
        assert await sup.on_failure(0, again, RuntimeError())
        await _settle()
        assert group.restarted == [0, 0] and not fatal and sup.num_restarts == 2

    asyncio.run(scenario())


def test_pause_all_restarts_a_replica_found_dead_and_pick_holds_during_a_sync():
    async def scenario() -> None:
        group = FakeGroup(2)
        sup, _ = _supervisor(group)
        group.workers[0].state = "dead"
        await sup.pause_all()
        assert group.workers[1].paused and sup.num_restarts == 1
        sup.hold(True)
        assert await sup.pick() is None
        sup.hold(False)
        assert await sup.recover() == [0]  # came up during the sync: the trainer decides
        await sup.install_weights(0, None, 0)
        await sup.resume_all()
        assert sorted([await sup.pick() for _ in range(2)]) == [0, 1]
        assert not any(w.paused for w in group.workers)

    asyncio.run(scenario())


def test_an_engine_death_without_a_logged_error_is_named_by_the_remote_error():
    health = RuntimeError("remote traceback")
    health.cause = RuntimeError("EngineDeadError: EngineCore encountered an issue\nmore")
    death = failed_health_check(health, None)
    assert death.reason == (
        "its engine failed: RuntimeError: EngineDeadError: EngineCore encountered an issue"
    )
    assert (death.error, death.num_finished) == (None, None)
    assert failed_health_check(actor_died(pid=5), None).reason.startswith("pid 5, ")


def test_groups_go_round_robin_over_the_replicas_that_serve():
    placement = RoundRobin(2)
    assert [placement.next() for _ in range(3)] == [0, 1, 0]
    placement.serving = lambda index: index == 1
    assert [placement.next() for _ in range(2)] == [1, 1]
    placement.serving = lambda index: False
    with pytest.raises(RuntimeError, match="no rollout replica is in service"):
        placement.next()


# ---- reporting a failure ---------------------------------------------------------------------


def test_describe_death_keeps_the_pid_and_the_reason_on_one_line():
    assert describe_death(actor_died(pid=31)) == (
        "pid 31, The actor is dead because its worker process has died"
    )


def test_describe_death_names_the_node_an_actor_died_with():
    error = actor_died(pid=31)
    error.error_msg = (
        "The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: HFRolloutWorker\n\tactor_id: 84de\n\tpid: 31\n\tip: 192.0.2.2\n"
        "The actor died because its node has died. Node Id: 0156ab97a6040d9e408e8b2f\n"
        "\tthe actor's node was terminated expectedly: received SIGTERM"
    )
    assert describe_death(error) == (
        "pid 31, The actor died because its node has died (node 0156ab97)"
    )


def test_resume_hint_names_the_newest_complete_checkpoint(tmp_path):
    assert "no checkpoint under" in resume_hint(tmp_path)
    for step in (2, 4):
        write_checkpoint(tmp_path, step, step, lambda d: (d / "w.bin").write_bytes(b"x"))
    (tmp_path / "checkpoints" / ".step_6.partial").mkdir()  # a write cut by a crash
    hint = resume_hint(tmp_path)
    assert f"latest checkpoint {tmp_path / 'checkpoints' / 'step_4'}" in hint
    assert f"hydra.run.dir={tmp_path}" in hint


def test_fails_cleanly_reports_a_worker_death_with_the_resume_point_in_summary_json(tmp_path):
    class Recipe:
        cfg = SimpleNamespace(mode="fully_async")

        def __init__(self) -> None:
            self.run_dir, self.global_step, self.version = tmp_path, 3, 2
            tracker = Tracker(LoggerConfig(backends=["jsonl"], quiet=True), tmp_path)
            self.run = SimpleNamespace(tracker=tracker)
            self.fault_counts = {"faults/rollout_restarts": 1}

        @fails_cleanly
        def fit(self) -> None:
            raise TrainerWorkerError(0, "pid 12, The actor is dead")

    recipe = Recipe()
    with pytest.raises(RunFailure) as caught:
        recipe.fit()
    recipe.run.tracker.close()
    message = str(caught.value)
    assert message.startswith("trainer rank 0 died: pid 12, The actor is dead; no checkpoint")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == message
    assert summary["steps"] == 3 and summary["faults/rollout_restarts"] == 1


def failing_recipe(tmp_path, mode: str, step: int, error: BaseException):
    """A recipe without a tracker whose ``fit`` (under ``fails_cleanly``) raises ``error`` at
    ``step`` (the version equal to it)."""

    class Recipe:
        cfg = SimpleNamespace(mode=mode)
        run_dir, global_step, version, tracker = tmp_path, step, step, None

        @fails_cleanly
        def fit(self) -> None:
            raise error

    return Recipe()


def test_fails_cleanly_reports_a_diverged_policy_in_one_line_with_the_resume_point(tmp_path):
    error = DivergedPolicyError("the weights of version 5 give non-finite probabilities")
    with pytest.raises(RunFailure) as caught:
        failing_recipe(tmp_path, "sync", 5, error).fit()
    message = str(caught.value)
    assert message.startswith("the weights of version 5 give non-finite probabilities; no check")
    assert "\n" not in message


def test_fails_cleanly_names_any_other_actor_of_the_run_that_died(tmp_path):
    with pytest.raises(RunFailure, match=r"^VLLMRolloutWorker died: pid 77, The actor is dead"):
        failing_recipe(tmp_path, "fully_async", 0, actor_died(pid=77)).fit()


def test_output_dir_check_names_a_directory_that_cannot_be_created(tmp_path):
    check_writable_dir(tmp_path / "a" / "b", "hydra.run.dir")
    assert (tmp_path / "a" / "b").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputDirError, match=f"hydra.run.dir='{blocker / 'run'}'.*not writable"):
        check_writable_dir(Path(blocker / "run"), "hydra.run.dir")
