"""Typed messages between the fully async trainer, rollouter and message queue.

    rollouter --PromptGroup--> MessageQueue --list[PromptGroup] | EndOfStream--> trainer
    trainer   --open_sync()--> rollouter --SyncOpening--> trainer (paused; the push's receivers)
    trainer   --end_sync(version)--> rollouter --SyncPause | None--> trainer (the sync's pause)
    trainer   --poll()--> rollouter --RolloutProgress--> trainer (idle time, val results)
    trainer   --stop()--> rollouter --RolloutLedger--> trainer (end-of-run accounting)
    trainer   --snapshot()--> rollouter --dict--> trainer, which writes it to
              ``ROLLOUTER_STATE_FILE``; a resumed rollouter reads it there (``restore``)

Every message is a slotted dataclass; times are seconds, counts are prompts unless a name
says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from recipe.protocol import Trajectory

if TYPE_CHECKING:
    from recipe.workers.rollout.client import ReplicaClient

ROLLOUTER_STATE_FILE = "rollouter_state.json"
"""The rollouter's checkpoint state (``snapshot()``), under the checkpoint's ``run_state/``:
written by the trainer, read by the rollouter of a resumed run."""


@dataclass(slots=True)
class PromptGroup:
    """One admitted prompt's GRPO group, scored, on its way to the trainer."""

    ticket: int
    """Admission ticket (unique per admission, re-admissions get a new one)."""
    window: int
    """Version window the prompt was admitted in (= the engines' version at admission)."""
    trajectories: list[Trajectory]
    """``rollout.n`` scored responses, ordered by ``sample_index``."""
    num_resumes: int = 0
    """Times the group was paused by a sync and resumed (partial rollout)."""

    @property
    def prompt_uid(self) -> str:
        return self.trajectories[0].prompt_uid

    @property
    def min_version(self) -> int:
        """Oldest policy version that produced a token of the group (the window when empty)."""
        versions = [t.min_version for t in self.trajectories if t.model_versions]
        return min(versions) if versions else self.window


@dataclass(slots=True, frozen=True)
class EndOfStream:
    """What ``MessageQueue.get_batch`` returns once the queue is closed and cannot fill a
    batch: no more groups will come."""

    num_left: int
    """Groups still in the queue (fewer than asked for); ``drain()`` hands them out."""


@dataclass(slots=True, frozen=True)
class QueueStats:
    """Counters of the message queue since it was created."""

    size: int
    """Groups in the queue now."""
    capacity: int
    """Bound on ``size`` (the admission budget of one window)."""
    max_size: int
    """Highest ``size`` seen."""
    num_produced: int
    """Groups accepted by ``put``."""
    num_consumed: int
    """Groups handed out by ``get_batch`` and ``drain``."""
    num_blocked_puts: int
    """``put`` calls that had to wait for room (backpressure)."""
    max_put_wait_s: float
    """Longest wait of one ``put``."""
    total_get_wait_s: float
    """Time ``get_batch`` callers spent waiting for groups."""
    closed: bool
    """Whether ``close()`` was called."""


@dataclass(slots=True, frozen=True)
class SyncPause:
    """What a sync's pause did, in the rollouter's answer to ``end_sync`` (the sync's last
    call: the rollouter keeps the record from ``open_sync`` until then)."""

    num_partial_groups: int
    """Groups cut mid-generation, to be resumed on the new weights (partial rollout; with
    multi-turn episodes, the groups waiting in the workers)."""
    num_drained_groups: int
    """Groups the sync waited for to finish on the old weights (``partial_rollout=false``)."""
    pause_s: float
    """Time from the request to a quiet engine (aborting or draining, and validation)."""
    window_s: float = 0.0
    """Time admission was held: from ``open_sync``'s hold to ``end_sync``'s opening of the
    window (the rollouter's clock)."""


@dataclass(slots=True, frozen=True)
class SyncOpening:
    """The rollouter's answer to ``open_sync``: the engines are paused, the weights may change."""

    workers: list[ReplicaClient]
    """The replicas' current workers' clients, retired ones left out: the push's receivers."""
    recovering: bool
    """A replica is restarting or waits for the served weights: the trainer has the
    rollouter recover it (``recover_replicas``, ``install_weights``) before the load."""


@dataclass(slots=True, frozen=True)
class RolloutProgress:
    """Cumulative rollouter counters; the trainer differences two of them per step."""

    elapsed_s: float
    """Seconds since ``run()`` started."""
    idle_s: float
    """Seconds with no group generating (admission budget spent, or paused for a sync)."""
    num_admitted: int
    """Fresh prompts admitted."""
    num_readmitted: int
    """Prompts admitted again after their trajectory got too old."""
    num_in_flight: int
    """Groups generating now."""
    val_results: dict[int, dict[str, float]] = field(default_factory=dict)
    """Validation metrics finished since the previous poll, by weights version."""
    num_restarts: int = 0
    """Rollout replicas restarted after dying (``faults/rollout_restarts``)."""
    num_retired: int = 0
    """Rollout replicas lost with their node (``faults/rollout_retired``)."""
    num_filtered: int = 0
    """Groups filtered by dynamic sampling (``algorithm.filter_groups``)."""
    judge: dict[str, float] = field(default_factory=dict)
    """The judge's ``judge/*`` metrics since the previous poll (``reward.judge``; empty
    without one)."""


@dataclass(slots=True, frozen=True)
class RolloutLedger:
    """End-of-run prompt accounting of the rollouter (``stop()``)."""

    admitted_uids: list[str]
    """Fresh prompts in admission order (a re-admission does not add one)."""
    num_readmitted: int
    """Re-admissions (``async_training.max_staleness``)."""
    unreleased_uids: list[str]
    """Prompts admitted but never put in the queue (generating or waiting at the stop)."""
    num_released: int
    """Groups put in the queue."""
    num_restarts: int = 0
    """Rollout replicas restarted after dying (``faults/rollout_restarts``)."""
    num_retired: int = 0
    """Rollout replicas lost with their node (``faults/rollout_retired``)."""
    filtered_uids: list[str] = field(default_factory=list)
    """Prompts whose groups dynamic sampling filtered (admitted, never trained)."""
