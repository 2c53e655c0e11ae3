"""The fully async rollout side's state machines (fully_async_policy/rollouter/states.py):
every step the docstrings draw is allowed, every other one is refused naming the machine and both
states, and the supervisor and the rollouter take only allowed steps in their own paths."""

from __future__ import annotations

import itertools

import pytest

from fully_async_policy.rollouter.states import (
    REPLICA_STEPS,
    ROLLOUT_STEPS,
    ReplicaState,
    ReplicaStates,
    RolloutState,
    check_step,
)

DRAWN_REPLICA_STEPS = {
    ("SERVING", "RESTARTING"),
    ("RESTARTING", "SERVING"),
    ("RESTARTING", "WAITING_WEIGHTS"),
    ("RESTARTING", "RETIRED"),
    ("WAITING_WEIGHTS", "SERVING"),
    ("SERVING", "FAILED"),
    ("RESTARTING", "FAILED"),
    ("WAITING_WEIGHTS", "FAILED"),
    ("WAITING_WEIGHTS", "RESTARTING"),
    ("FAILED", "RESTARTING"),
}


def _reach(states: ReplicaStates, index: int, state: ReplicaState) -> None:
    """Move replica ``index`` from SERVING to ``state`` along allowed steps."""
    path = {
        ReplicaState.SERVING: [],
        ReplicaState.RESTARTING: [ReplicaState.RESTARTING],
        ReplicaState.WAITING_WEIGHTS: [ReplicaState.RESTARTING, ReplicaState.WAITING_WEIGHTS],
        ReplicaState.RETIRED: [ReplicaState.RESTARTING, ReplicaState.RETIRED],
        ReplicaState.FAILED: [ReplicaState.FAILED],
    }[state]
    for step in path:
        states.move(index, step)


def test_a_replica_takes_exactly_the_steps_its_docstring_draws():
    for now, new in itertools.product(ReplicaState, ReplicaState):
        states = ReplicaStates(2)
        _reach(states, 1, now)
        if now is new or (now.name, new.name) in DRAWN_REPLICA_STEPS:
            states.move(1, new)
            assert states[1] is new and states[0] is ReplicaState.SERVING
        else:
            with pytest.raises(RuntimeError, match=f"rollout replica 1: {now.name} -> {new.name}"):
                states.move(1, new)
    assert {(a.name, b.name) for a, steps in REPLICA_STEPS.items() for b in steps} == (
        DRAWN_REPLICA_STEPS
    )


def test_a_retired_replica_never_comes_back():
    states = ReplicaStates(3)
    states.move(2, ReplicaState.RESTARTING)
    states.move(2, ReplicaState.RETIRED)
    for state in ReplicaState:
        if state is not ReplicaState.RETIRED:
            with pytest.raises(RuntimeError):
                states.move(2, state)
    assert states.where(ReplicaState.RETIRED) == [2]
    assert states.where(ReplicaState.SERVING) == [0, 1]


def test_the_rollouter_pauses_for_syncs_and_never_leaves_stopped():
    running, paused, stopped = RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.STOPPED
    for now, new in [(running, paused), (paused, running), (running, stopped), (paused, stopped)]:
        check_step("the rollouter", now, new, ROLLOUT_STEPS)
    check_step("the rollouter", running, running, ROLLOUT_STEPS)  # a resume's end_sync
    for new in (running, paused):
        with pytest.raises(RuntimeError, match=f"the rollouter: STOPPED -> {new.name}"):
            check_step("the rollouter", stopped, new, ROLLOUT_STEPS)
