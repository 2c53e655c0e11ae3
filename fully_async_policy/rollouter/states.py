"""The fully async rollout side's two state machines, as enums with their steps checked.

The rollouter (sync.py), driven by the trainer's syncs::

    RUNNING --open_sync--> PAUSED --end_sync--> RUNNING     any --stop--> STOPPED

(a resumed run replays ``end_sync`` while RUNNING: staying in a state is no step). Once
``open_sync`` returned (its hold entered PAUSED, its pause stopped the engines) no engine
request of a training group runs, so the weights may change, and ``snapshot`` reads the
whole state.

One rollout replica under the ``ReplicaSupervisor`` (replicas.py)::

    SERVING --dies--> RESTARTING --engine up, version 0, not paused--> SERVING
                         |--engine up, otherwise--> WAITING_WEIGHTS --weights installed--> SERVING
                         |--its node is gone, no room elsewhere--> RETIRED
    any but RETIRED --no restart left, or its restart failed--> FAILED (the run is failing)
    WAITING_WEIGHTS, FAILED --found dead again--> RESTARTING

Any other step raises an error naming the machine and both states (``check_step``): a state
no transition leads to is a bug, caught where it happens.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeVar

State = TypeVar("State", bound=Enum)


def check_step(what: str, now: State, new: State, steps: Mapping[State, frozenset[State]]) -> None:
    """Raise ``RuntimeError`` unless ``now -> new`` is one of ``steps`` (or no step at all)."""
    if new is not now and new not in steps[now]:
        raise RuntimeError(
            f"{what}: {now.name} -> {new.name} is not a step of its state machine "
            "(fully_async_policy/rollouter/states.py)"
        )


class RolloutState(Enum):
    RUNNING = "running"
    """Admitting prompts and generating them."""
    PAUSED = "paused"
    """A sync (or checkpoint) holds admission; single-turn groups are cut or drained
    (``PausePolicy``, pause_policy.py)."""
    STOPPED = "stopped"
    """The run is ending: nothing is admitted again."""


ROLLOUT_STEPS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.RUNNING: frozenset({RolloutState.PAUSED, RolloutState.STOPPED}),
    RolloutState.PAUSED: frozenset({RolloutState.RUNNING, RolloutState.STOPPED}),
    RolloutState.STOPPED: frozenset(),
}


class ReplicaState(Enum):
    SERVING = "serving"
    """Takes new groups: it holds the weights every other serving replica holds."""
    RESTARTING = "restarting"
    """Dead; a new worker is starting on its bundle."""
    WAITING_WEIGHTS = "waiting_weights"
    """Its new worker is up and waits for the served weights (the trainer sends them)."""
    RETIRED = "retired"
    """Its node left the cluster with no room for it elsewhere: gone for the run."""
    FAILED = "failed"
    """Dead with no restart left, or its restart failed: the run stops with the error."""


_S = ReplicaState
REPLICA_STEPS: dict[ReplicaState, frozenset[ReplicaState]] = {
    _S.SERVING: frozenset({_S.RESTARTING, _S.FAILED}),
    _S.RESTARTING: frozenset({_S.SERVING, _S.WAITING_WEIGHTS, _S.RETIRED, _S.FAILED}),
    _S.WAITING_WEIGHTS: frozenset({_S.SERVING, _S.RESTARTING, _S.FAILED}),
    _S.RETIRED: frozenset(),
    _S.FAILED: frozenset({_S.RESTARTING}),
}
"""The replica steps the module docstring draws, from each state."""


class ReplicaStates:
    """The state of each of ``num`` replicas, all SERVING at first."""

    def __init__(self, num: int) -> None:
        self._states = [ReplicaState.SERVING] * num

    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, index: int) -> ReplicaState:
        return self._states[index]

    def move(self, index: int, state: ReplicaState) -> None:
        """Replica ``index`` enters ``state``; a step ``REPLICA_STEPS`` lacks raises
        ``RuntimeError``."""
        check_step(f"rollout replica {index}", self._states[index], state, REPLICA_STEPS)
        self._states[index] = state

    def where(self, state: ReplicaState) -> list[int]:
        """The replicas in ``state``, in index order."""
        return [i for i, s in enumerate(self._states) if s is state]
