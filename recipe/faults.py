"""Faults that end a run, and how a run says so.

    worker death / failed weight push --> RolloutWorkerError | TrainerWorkerError |
    / reward function that failed /       WeightSyncError (recipe.checkpoint_engine) |
    weights that cannot be sampled /      RewardError (recipe.reward) | DivergedPolicyError |
    trainer rank out of GPU memory        TrainerOutOfMemoryError (recipe.workers.trainer.
                                          out_of_memory: the figures and the knobs to lower)
        @fails_cleanly fit()          --> RunFailure: what failed + where to resume from;
                                          summary.json gets "status": "failed" and "error"
        python -m recipe              --> one line "error: ..." on stderr, exit code 1
                                          (RECIPE_DEBUG=1: the traceback)

What is recovered before it gets here: a rollout worker that dies in ``mode=fully_async`` is
restarted (``rollout.max_restarts``, fully_async_policy/rollouter/replicas.py); a failed
weight push is retried when ``checkpoint_engine.on_failure=retry``. Everything else ends the
run within a bounded time: a dead trainer rank is seen at the next call that waits on it (the
first failed rank is raised at once, its peers blocked in a collective are not waited for).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from recipe.utils.ray_errors import remote_cause

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_RAY_FIELDS = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")


class RunFailure(RuntimeError):
    """A fault ended the run; the message says what failed and whether/how it resumes."""


class WorkerDiedError(RuntimeError):
    """A worker process (Ray actor) or its engine died; the message names the worker."""


class RolloutWorkerError(WorkerDiedError):
    """A rollout replica (its actor or its engine processes) died."""

    def __init__(self, replica: int, detail: str) -> None:
        super().__init__(f"rollout replica {replica} died: {detail}")
        self.replica, self.detail = replica, detail

    def __reduce__(self) -> tuple[Any, ...]:  # keep the fields across Ray's pickling
        return type(self), (self.replica, self.detail)


class TrainerWorkerError(WorkerDiedError):
    """A trainer rank's actor died."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"trainer rank {rank} died: {detail}")
        self.rank, self.detail = rank, detail

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.detail)


class TrainerOutOfMemoryError(RuntimeError):
    """A trainer rank ran out of GPU memory in a forward or backward; one line names the
    rank, the phase, the GPU's figures and what to change."""

    def __init__(self, rank: int, phase: str, detail: str, remedy: str) -> None:
        """``phase``: the ``TrainerWorker`` call (``update_actor``, ``compute_log_prob``,
        ``compute_ref_log_prob``); ``detail``: the GPU's figures at the error; ``remedy``:
        the knobs that lower the peak, as a clause."""
        super().__init__(
            f"trainer rank {rank} ran out of GPU memory in {phase} ({detail}): {remedy}"
        )
        self.rank, self.phase, self.detail, self.remedy = rank, phase, detail, remedy

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.phase, self.detail, self.remedy)


class DivergedPolicyError(RuntimeError):
    """The served weights give non-finite next-token probabilities, so no token can be sampled
    from them: training diverged (an engine that samples anyway, as vLLM's does, trains on the
    result until ``actor.max_skipped_steps`` stops the run)."""


def is_actor_death(exc: BaseException) -> bool:
    """True for Ray's "the actor is gone" errors (the process died or was killed)."""
    from ray.exceptions import RayActorError

    return isinstance(exc, RayActorError)


def describe_death(exc: BaseException) -> str:
    """One line out of Ray's multi-line actor-death message: the pid, the reason, and the
    node when the actor died with its node."""
    text = str(exc)
    pid = re.search(r"\bpid[:=]\s*(\d+)", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Ray's layout: a headline, "key: value" fields, then the reason.
    details = [ln for ln in lines[1:] if not ln.startswith(_RAY_FIELDS)]
    reason = details[0] if details else lines[0] if lines else type(exc).__name__
    reason = reason.split(". ")[0].rstrip(".")
    node = re.search(r"\bNode Id:\s*([0-9a-f]+)", text)
    if node:  # its node left the cluster: name the node
        reason = f"{reason} (node {node.group(1)[:8]})"
    return f"pid {pid.group(1)}, {reason}" if pid else reason


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``run_dir/checkpoints`` (None if there is none)."""
    from recipe.checkpoint.store import latest_checkpoint as newest

    try:
        return newest(Path(run_dir))
    except OSError:  # an unreadable checkpoints/ directory: no resume point to offer
        return None


def resume_hint(run_dir: Path) -> str:
    """How to continue after a failure: the checkpoint that a relaunch resumes from."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return (
            f"no checkpoint under {Path(run_dir) / 'checkpoints'} yet (trainer.save_freq): "
            "a relaunch starts from the beginning"
        )
    return (
        f"the run is resumable from the latest checkpoint {checkpoint}: relaunch with "
        f"hydra.run.dir={run_dir} (trainer.resume_mode=auto)"
    )


def fails_cleanly(fit: F) -> F:
    """Decorate a recipe's ``fit``: a worker death, failed weight push, or other fault of the
    module docstring that ends the run becomes a ``RunFailure`` naming it and the resume
    point, recorded in summary.json.

    ``self`` needs ``run_dir``, ``run`` (its TrainingRun), ``global_step``, ``version`` and
    ``cfg.mode``.
    """
    from recipe.checkpoint_engine.base import WeightSyncError
    from recipe.reward import RewardError

    @functools.wraps(fit)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fit(self, *args, **kwargs)
        except RunFailure as exc:
            _record_failure(self, exc)
            raise
        # A fault raised in an actor arrives as Ray's RayTaskError, made an instance of the
        # fault's class too (as_instanceof_cause): caught here, unwrapped by remote_cause.
        except (
            WorkerDiedError,
            WeightSyncError,
            RewardError,
            DivergedPolicyError,
            TrainerOutOfMemoryError,
        ) as exc:
            failure = RunFailure(f"{remote_cause(exc)}; {resume_hint(self.run_dir)}")
            _record_failure(self, failure)
            raise failure from exc
        except Exception as exc:
            if not is_actor_death(exc):
                raise
            # Another actor of the run (rollouter, message queue) died.
            failure = RunFailure(
                f"{_actor_class(exc)} died: {describe_death(exc)}; {resume_hint(self.run_dir)}"
            )
            _record_failure(self, failure)
            raise failure from exc

    return wrapper  # type: ignore[return-value]


def _actor_class(exc: BaseException) -> str:
    found = re.search(r"class_name:\s*(\S+)", str(exc))
    return found.group(1) if found else "a Ray actor"


def _record_failure(trainer: Any, failure: RunFailure) -> None:
    logger.error("run stopped: %s", failure)
    run = getattr(trainer, "run", None)
    if run is None:
        return
    summary = {
        "mode": trainer.cfg.mode,
        "status": "failed",
        "error": str(failure),
        "steps": trainer.global_step,
        "param_version": trainer.version,
        **getattr(trainer, "fault_counts", {}),
    }
    try:
        run.tracker.log_summary(summary)
    except Exception:  # the failure is what the caller must see
        logger.exception("writing summary.json after the failure failed")
