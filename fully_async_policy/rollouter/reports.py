"""What the rollouter reports to the trainer: its progress (``poll``, every step) and the
end-of-run ledger (``stop``), read off the admission controller, the stream, the book and the
replicas' supervisor (counts are prompts, times seconds: messages.py)."""

from __future__ import annotations

import time

from fully_async_policy.admission import AdmissionController
from fully_async_policy.messages import PromptGroup, RolloutLedger, RolloutProgress
from fully_async_policy.rollouter.replicas import ReplicaSupervisor
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.stream import GroupStream
from fully_async_policy.rollouter.validation import VersionValidation


def rollout_progress(
    admission: AdmissionController[PromptGroup],
    stream: GroupStream,
    validation: VersionValidation,
    replicas: ReplicaSupervisor,
) -> RolloutProgress:
    """Cumulative counters, and validation results not reported before."""
    clock = stream.clock
    return RolloutProgress(
        elapsed_s=time.perf_counter() - clock.start,
        idle_s=clock.idle_s(),
        num_admitted=admission.num_admitted,
        num_readmitted=admission.num_readmitted,
        num_in_flight=len(stream.in_flight),
        val_results=validation.take_unreported(),
        num_restarts=replicas.num_restarts,
        num_retired=len(replicas.retired),
        num_filtered=admission.num_filtered,
        judge=judge_metrics(stream),
    )


def judge_metrics(stream: GroupStream) -> dict[str, float]:
    """The judge's metrics since the last poll (its calls run beside generation)."""
    return stream.reward_fn.drain_metrics()


def rollout_ledger(book: StreamBook, replicas: ReplicaSupervisor) -> RolloutLedger:
    """Every admitted prompt's fate at the end of the run: released (less what the release
    deque still holds), unreleased (admitted, never put into the queue), filtered."""
    admission = book.admission
    unreleased = [t.uid for t in admission.unreleased()]
    return RolloutLedger(
        admitted_uids=list(admission.admitted_uids),
        num_readmitted=admission.num_readmitted,
        unreleased_uids=unreleased + [g.prompt_uid for g in book.releases],
        num_released=admission.num_released - len(book.releases),
        num_restarts=replicas.num_restarts,
        num_retired=len(replicas.retired),
        filtered_uids=list(admission.filtered_uids),
    )
