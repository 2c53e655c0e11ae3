"""Every wait of the fully async recipe under the deadline of what it waits for
(fully_async_policy/deadlines.py): the trainer's deadline of each rollouter call, a
validation waited for, a skipped validation said and marked, the trainer's waits for a failed
rollouter's end and for the message queue, a resumed run's weights load. Fakes stand in for
the rollouter and its engines; the same waits run against Ray in
tests/integration/test_batch_deadline.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fully_async_policy.deadlines import Deadline, RolloutDeadlines
from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.feed import RolloutAnswers, RolloutFeed
from fully_async_policy.driver.served_weights import ServedWeights
from fully_async_policy.messages import EndOfStream
from fully_async_policy.rollouter.states import ReplicaState, ReplicaStates
from fully_async_policy.rollouter.validation import VersionValidation
from recipe.faults import RunFailure
from recipe.observability.trace import Tracer
from tests.helpers import agent_envs
from tests.helpers.fake_ranks import ScriptedRanks
from tests.helpers.in_process import fully_async_config
from tests.helpers.local_actors import FutureWaits, LoopThread, ThreadHandle

pytestmark = pytest.mark.timeout(60)

# ---- the deadline of each wait ----------------------------------------------------------------


def test_the_trainer_waits_for_each_rollouter_call_as_long_as_the_calls_own_waits():
    cfg = fully_async_config(
        **{
            "rollout.generation_timeout_s": 1800,
            "checkpoint_engine.timeout_s": 120,
            "trainer.test_freq": 5,
            "async_training.partial_rollout": False,
        }
    )
    deadlines = RolloutDeadlines(cfg)
    # A sync's long waits (the validation, the groups drained) are hold_for_sync's ...
    hold = deadlines.call("hold_for_sync")
    assert hold.seconds == 1800 + 1800 + 120
    assert str(hold) == (
        "2 x rollout.generation_timeout_s=1800 s + checkpoint_engine.timeout_s=120 s = 3720 s"
    )
    # ... so pausing the engines stays a sync phase: a hung engine is caught in 120 s there.
    assert deadlines.call("begin_sync").parts == (("checkpoint_engine.timeout_s", 120.0),) * 2
    assert str(deadlines.call("load_weights")) == (
        "rollout.start_timeout_s=1800 s + checkpoint_engine.timeout_s=120 s = 1920 s"
    )
    with pytest.raises(KeyError):
        deadlines.call("no_such_call")


def test_without_validation_or_draining_a_sync_holds_for_no_more_than_its_answer():
    deadlines = RolloutDeadlines(fully_async_config(**{"checkpoint_engine.timeout_s": 120}))
    assert str(deadlines.call("hold_for_sync")) == "checkpoint_engine.timeout_s=120 s"
    # partial rollout: the groups the pause cut come back within the same deadline
    assert deadlines.call("begin_sync").seconds == 3 * 120


@pytest.mark.parametrize(
    ("driver", "key"),
    [
        ({"environment": f"{agent_envs.PATH}:SavedTurns"}, "rollout.multi_turn.step_timeout_s"),
        ({"agent_command": "python agent.py"}, "rollout.multi_turn.agent_timeout_s"),
    ],
)
def test_a_snapshot_that_cuts_episodes_waits_for_the_environment_step_they_may_be_in(driver, key):
    overrides = {f"rollout.multi_turn.{name}": value for name, value in driver.items()}
    cfg = fully_async_config(**{"rollout.multi_turn.enable": True, **overrides})
    snapshot = RolloutDeadlines(cfg).call("snapshot")
    assert key in str(snapshot)
    single_turn = RolloutDeadlines(fully_async_config()).call("snapshot")
    assert key not in str(single_turn) and snapshot.seconds > single_turn.seconds


# ---- validation ---------------------------------------------------------------------------------


class _Replicas:
    """The supervisor as validation sees it: each replica's state."""

    def __init__(self, states: list[ReplicaState]) -> None:
        self.states = ReplicaStates(len(states))
        for index, state in enumerate(states):
            if state is ReplicaState.WAITING_WEIGHTS:
                self.states.move(index, ReplicaState.RESTARTING)
            self.states.move(index, state)

    @property
    def in_service(self) -> list[bool]:
        return [self.states[i] is ReplicaState.SERVING for i in range(len(self.states))]

    async def check_all(self) -> None:
        return None


def _validation(states: list[ReplicaState], validate: Any, deadline_s: float = 5.0):
    deadline = Deadline.of("rollout.generation_timeout_s", deadline_s)
    return VersionValidation(validate, _Replicas(states), 1, deadline)  # type: ignore[arg-type]


def test_a_validation_with_no_replica_in_service_is_skipped_said_and_marked(caplog):
    async def validate() -> dict[str, float]:
        raise AssertionError("no replica serves: nothing may be validated")

    states = [ReplicaState.RESTARTING, ReplicaState.WAITING_WEIGHTS]
    validation = _validation(states, validate)
    with caplog.at_level(logging.WARNING, logger="fully_async_policy.rollouter.validation"):
        result = asyncio.run(validation.result(3))
    assert result == {"val/skipped": 1.0}
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        "validation of version 3 skipped: no rollout replica is in service (replica 0 "
        "restarting, replica 1 waiting_weights)"
    )


def test_a_validation_that_ran_is_marked_as_not_skipped():
    async def validate() -> dict[str, float]:
        return {"val/accuracy": 0.5}

    validation = _validation([ReplicaState.SERVING], validate)
    assert asyncio.run(validation.result(2)) == {"val/accuracy": 0.5, "val/skipped": 0.0}


def test_waiting_for_a_validation_past_its_deadline_names_the_call_and_the_version():
    async def validate() -> dict[str, float]:
        await asyncio.sleep(3600)  # a hung engine
        return {}

    async def scenario() -> None:
        validation = _validation([ReplicaState.SERVING], validate, deadline_s=0.1)
        validation.start(3)
        await validation.finish("hold_for_sync")

    with pytest.raises(RunFailure) as caught:
        asyncio.run(scenario())
    assert str(caught.value) == (
        "hold_for_sync: the validation of version 3 did not finish within "
        "rollout.generation_timeout_s=0.1 s"
    )


# ---- the trainer's waits on the rollouter -------------------------------------------------------


class _FailedRollouter:
    """A rollouter whose run failed and closed the queue, but whose ``run()`` never ends (a
    group that never came back), and the closed queue itself."""

    async def run(self) -> None:
        await asyncio.sleep(3600)

    async def wait_replica_request(self) -> None:
        await asyncio.sleep(3600)

    async def busy_replicas(self) -> list[int]:
        return [1]

    async def get_batch(self, num_groups: int) -> EndOfStream:
        return EndOfStream(num_left=0)

    async def load_weights(self, weights: Any, version: int) -> None:
        await asyncio.sleep(3600)  # an engine that never finishes loading

    async def stats(self) -> None:
        await asyncio.sleep(3600)  # a hung queue actor


@pytest.fixture
def failed_rollouter():
    loop = LoopThread()
    handle = ThreadHandle(_FailedRollouter(), loop)
    yield RolloutClient(handle, FutureWaits()), QueueClient(handle, FutureWaits())
    loop.close()


def test_the_trainer_waits_for_a_failed_rollouters_end_within_its_deadline(
    tmp_path, failed_rollouter
):
    cfg = fully_async_config(**{"checkpoint_engine.timeout_s": 0.1})
    rollouter, queue = failed_rollouter
    feed = RolloutFeed(cfg, rollouter, queue, None, tracer=Tracer(0, None), run_dir=tmp_path)  # type: ignore[arg-type]
    feed.start()
    start = time.monotonic()
    with pytest.raises(RunFailure) as caught:
        feed.take(4, version=0)
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith(
        "the rollouter gave no answer to run within 4 x checkpoint_engine.timeout_s=0.1 s"
    )
    assert "rollout replica(s) 1 generating" in message


def test_a_message_queue_that_does_not_answer_stops_the_run_naming_it(tmp_path, failed_rollouter):
    cfg = fully_async_config(**{"checkpoint_engine.timeout_s": 0.1})
    rollouter, queue = failed_rollouter
    feed = RolloutFeed(cfg, rollouter, queue, None, tracer=Tracer(0, None), run_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(RunFailure) as caught:
        feed.from_queue(queue.stats(), "stats")
    assert str(caught.value).startswith(
        "the message queue gave no answer to stats within checkpoint_engine.timeout_s=0.1 s"
    )


def test_a_resumed_runs_weights_load_that_hangs_stops_the_run_naming_it(
    tmp_path: Path, failed_rollouter
):
    cfg = fully_async_config(**{"checkpoint_engine.timeout_s": 0.1, "rollout.start_timeout_s": 0.2})
    rollouter, _ = failed_rollouter
    answers = RolloutAnswers(cfg, rollouter, tmp_path)
    served = ServedWeights(ScriptedRanks(), rollouter, tmp_path, answers.within)
    start = time.monotonic()
    with pytest.raises(RunFailure) as caught:
        served.serve_resumed(3)
    assert time.monotonic() - start < 5
    assert str(caught.value).startswith(
        "the rollouter gave no answer to load_weights within rollout.start_timeout_s=0.2 s + "
        "checkpoint_engine.timeout_s=0.1 s = 0.3 s"
    )
    assert served.kept_version is None  # nothing is served: no copy claims it


def test_an_answer_the_rollouter_failed_comes_back_as_its_one_line(tmp_path):
    class _RemoteError(RunFailure):  # what Ray raises for an actor's error: the cause inside
        def __init__(self, cause: BaseException) -> None:
            super().__init__("Traceback (most recent call last):\n  ...")
            self.cause = cause

    class _Waits:
        def get(self, ref: Any, *, timeout: float | None = None) -> Any:
            raise _RemoteError(RunFailure("hold_for_sync: the validation of version 3 ..."))

    cfg = fully_async_config()
    answers = RolloutAnswers(cfg, RolloutClient(SimpleNamespace(), _Waits()), tmp_path)
    with pytest.raises(RunFailure) as caught:
        answers.within(object(), "hold_for_sync")
    message = str(caught.value)
    assert message.startswith("hold_for_sync: the validation of version 3 ...; ")
    assert "\n" not in message
