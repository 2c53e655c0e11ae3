"""``TrainingRun``: what the trainer side of a run writes, composed in one object.

    TrainingRun(cfg, run_dir, train=, val=)
      checkpointer   RunCheckpointer: resume (checks the prompt sets are the checkpoint's,
                     rewinds the run directory first), step_N/, ledger
      tracker        Tracker: metrics.jsonl, console, wandb, tensorboard, summary.json
      trace          RunTrace: trace.json, every process's timeline
      initial_val    validation of the initial weights (kept across resumes)
      totals         RunTotals: responses trained and their staleness (kept across resumes)
      skips          trainer steps whose every optimizer step had a non-finite gradient norm:
                     their prompts go to the ledger as skipped, and actor.max_skipped_steps
                     of them in a row stop the run (the count in a row is kept across resumes)
      snapshots      WeightSnapshots: the policy every trainer.snapshot_samples samples, with
                     the training clock (seconds trained minus those blocked in validations,
                     exports and checkpoints; kept across resumes) for evaluation off the clock
      startup        StartupTimes: this process's start-up phases, to the first step and the
                     first push (``startup/*`` in summary.json; the recipe adds its own)

One per run, opened by the recipe whose driver owns the trainer (sync, one_step_off, the fully
async trainer); the fully async rollouter runs beside it and writes none of these. The recipe
keeps the step and the weights version and passes them in; the run object keeps no copy.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.checkpoint.ledger import num_skipped, num_trained
from recipe.faults import RunFailure
from recipe.observability.trace import RunTrace, Tracer
from recipe.observability.tracking import Tracker
from recipe.protocol import PromptRecord
from recipe.run.checkpointing import RunCheckpointer
from recipe.run.metrics import RunTotals, run_summary
from recipe.run.snapshots import WeightSnapshots
from recipe.run.startup import StartupTimes

if TYPE_CHECKING:
    from recipe.config import RecipeConfig
    from recipe.workers.trainer.ranks import TrainerRanks

logger = logging.getLogger(__name__)

TraceSource = Callable[[], list[dict[str, Any]]]
"""Returns the trace events another process buffered since the last call."""


class TrainingRun:
    """The run's records (see the module docstring)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        run_dir: Path,
        *,
        train: Sequence[PromptRecord],
        val: Sequence[PromptRecord],
    ) -> None:
        """``train`` / ``val``: the run's prompt sets (their fingerprints go into checkpoints)."""
        self.cfg = cfg
        # Before the Tracker opens metrics.jsonl: a resume first drops what came after it.
        self.checkpointer = RunCheckpointer(cfg, run_dir, train=train, val=val)
        self.tracker = Tracker(cfg.logger, Path(run_dir), run_config=asdict(cfg))
        self.trace = RunTrace(Path(run_dir), mode=cfg.mode)
        self.initial_val: dict[str, float] = dict(
            self.checkpointer.resume_state.get("initial_val") or {}
        )
        """Validation of the initial weights (a resumed run keeps its checkpoint's)."""
        saved = self.checkpointer.resume_state.get("totals")
        self.totals = RunTotals.from_state(saved) if saved is not None else RunTotals()
        """Responses trained and their staleness over the run (``add`` them each step)."""
        self.prior_wall_s = float(self.checkpointer.resume_state.get("wall_s", 0.0))
        """Seconds the run trained before this process (its checkpoint's), so throughput and
        ``trainer.max_wall_s`` count the whole run across resumes."""
        self._start: float | None = None
        self.prompts_trained = num_trained(Path(run_dir))
        """Prompts trained over the run: the ledger's count, kept as lines are written."""
        self.prompts_skipped = num_skipped(Path(run_dir))
        """Prompts of steps whose update was skipped, over the run (the ledger's count)."""
        self.consecutive_skips = int(self.checkpointer.resume_state.get("consecutive_skips", 0))
        """Trainer steps skipped in a row up to now (``actor.max_skipped_steps``); kept across
        resumes, so a run cannot skip forever by being restarted (older checkpoints: 0)."""
        self.blocked_s = float(self.checkpointer.resume_state.get("blocked_s", 0.0))
        """Seconds the trainer spent blocked in validations, snapshot exports and checkpoints
        inside the loop, over the run: the training clock leaves them out."""
        self.startup = StartupTimes()
        """This process's start-up phases (recipe/run/startup.py): the recipe records Ray,
        trainer and engines; the run records the initial validation, the first step and the
        first push."""
        self.snapshots = WeightSnapshots(
            cfg.trainer.snapshot_samples,
            Path(run_dir),
            resumed_step=self.checkpointer.resumed_step,
        )

    @property
    def tracer(self) -> Tracer:
        """The driver's own trace events (trainer phases)."""
        return self.trace.tracer

    @property
    def resume_from(self) -> Path | None:
        return self.checkpointer.resume_from

    @property
    def resume_state(self) -> dict[str, Any]:
        return self.checkpointer.resume_state

    # ---- per step -----------------------------------------------------------------------

    def initial_validation(self, validate: Callable[[], dict[str, float]]) -> dict[str, float]:
        """``validate()`` the initial weights (``trainer.val_before_train``), logged as step
        0; a resumed run keeps the result its checkpoint holds. Every recipe calls it right
        before its first step: the start-up ends here."""
        if self.resume_from is None and self.cfg.trainer.val_before_train:
            with self._blocking(), self.startup.phase("initial_val_s"):
                self.initial_val = validate()
            self.tracker.log({**self.initial_val, "trainer/param_version": 0}, step=0)
        self.startup.first_step()
        return self.initial_val

    def should_validate(self, version: int) -> bool:
        """Validate after the push that made ``version`` (every ``trainer.test_freq``)."""
        freq = self.cfg.trainer.test_freq
        return freq > 0 and version % freq == 0

    def validated_last(self, step: int, version: int) -> bool:
        """This process's last step (``step``, which pushed ``version``) validated, so the
        final validation is done."""
        return self.should_validate(version) and step > self.checkpointer.resumed_step

    def final_validation(
        self,
        validate: Callable[[], dict[str, float]],
        last_val: dict[str, float],
        step: int,
        version: int,
    ) -> dict[str, float]:
        """The run's final validation: the last step's (``last_val``) when it validated, else
        ``validate()``, unless ``trainer.val_after_train`` is false (then none: ``{}``)."""
        if self.validated_last(step, version):
            return last_val
        return validate() if self.cfg.trainer.val_after_train else {}

    def begin(self) -> float:
        """Start this process's clock (``time.perf_counter()``, returned) at the fit's start."""
        self._start = time.perf_counter()
        return self._start

    def elapsed_s(self) -> float:
        """Seconds the run has trained, earlier processes included."""
        since = 0.0 if self._start is None else time.perf_counter() - self._start
        return self.prior_wall_s + since

    def clock_s(self) -> float:
        """The training clock: ``elapsed_s`` minus ``blocked_s`` (recipe/run/snapshots.py)."""
        return self.elapsed_s() - self.blocked_s

    def out_of_time(self, start: float) -> bool:
        """``trainer.max_wall_s`` has passed over the whole run (this process since
        ``start``, ``time.perf_counter()``, plus the processes before a resume)."""
        budget = self.cfg.trainer.max_wall_s
        return budget is not None and self.prior_wall_s + time.perf_counter() - start > budget

    def end_step(
        self,
        step: int,
        version: int,
        metrics: dict[str, float],
        trained_uids: list[str],
        *,
        sources: list[TraceSource],
        filtered_uids: Sequence[str] = (),
        from_trace: Callable[[list[dict[str, Any]]], dict[str, float]] | None = None,
        validate: Callable[[], dict[str, float]] | None = None,
        checkpoint: Callable[[], object] | None = None,
        ranks: TrainerRanks | None = None,
    ) -> dict[str, float]:
        """Everything a recipe writes once step ``step`` (which made ``version``) trained, in
        this order, the same in every mode:

            trace.json   the step's slice, then what ``sources`` buffered
                         (``from_trace(events)``: metrics read off them, e.g. idle ratios)
            validation   ``validate()`` when ``version`` is due (``trainer.test_freq``; the
                         fully async rollouter validates on its own: None)
            metrics.jsonl, then ledger.jsonl (``log_step``: skipped steps, their limit)
            snapshot     the weights of ``ranks``, when trainer.snapshot_samples is due
            checkpoint   ``checkpoint()``, when the recipe decided this step saves

        ``metrics`` is updated in place; returns the validation results (empty when none)."""
        events = self.trace_step(step, version, metrics, sources)
        if from_trace is not None:
            metrics.update(from_trace(events))
        val: dict[str, float] = {}
        if validate is not None and self.should_validate(version):
            with self._blocking():
                val = validate()
            metrics.update(val)
        self.log_step(step, version, metrics, trained_uids, filtered_uids)
        if ranks is not None and self.snapshots.due(self.totals.num_samples):
            clock_s = self.clock_s()
            with self._blocking():
                self.snapshots.take(
                    ranks.export_weights,
                    samples=self.totals.num_samples,
                    step=step,
                    version=version,
                    clock_s=clock_s,
                )
        if checkpoint is not None:
            with self._blocking():
                checkpoint()
        return val

    @contextlib.contextmanager
    def _blocking(self) -> Iterator[None]:
        """Time the trainer spends in the block goes to ``blocked_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.blocked_s += time.perf_counter() - start

    def trace_step(
        self, step: int, version: int, metrics: dict[str, float], sources: list[TraceSource]
    ) -> list[dict[str, Any]]:
        """The step's slice into the trace, then everything buffered into ``trace.json``;
        returns the events moved (the engines' generation slices among them)."""
        self.trace.step(step, version, metrics)
        return self.trace.pull(sources)

    def log_step(
        self,
        step: int,
        version: int,
        metrics: dict[str, float],
        trained_uids: list[str],
        filtered_uids: Sequence[str] = (),
    ) -> None:
        """The step's metrics record, then its ``ledger.jsonl`` line. A step whose every
        optimizer step was skipped lists its prompts as skipped; ``RunFailure`` (after both
        are written) when ``actor.max_skipped_steps`` such steps came in a row."""
        if "sync/total_s" in metrics and "first_push_s" not in self.startup.phases_s:
            self.startup.add("first_push_s", metrics["sync/total_s"])
        self.tracker.log({**metrics, "trainer/param_version": version}, step=step)
        if not _update_skipped(metrics):
            self.consecutive_skips = 0
            self.checkpointer.record_trained(step, version, trained_uids, filtered_uids)
            self.prompts_trained += len(trained_uids)
            return
        self.checkpointer.record_trained(step, version, [], filtered_uids, trained_uids)
        self.prompts_skipped += len(trained_uids)
        self.consecutive_skips += 1
        logger.warning(
            "step %d: every optimizer step had a non-finite gradient norm (actor/grad_norm=%s)"
            ": no update applied, its %d prompts recorded as skipped in ledger.jsonl",
            step,
            metrics.get("actor/grad_norm"),
            len(trained_uids),
        )
        limit = self.cfg.actor.max_skipped_steps
        if limit and self.consecutive_skips >= limit:
            raise RunFailure(
                f"actor.max_skipped_steps={limit}: {self.consecutive_skips} trainer steps in a "
                f"row (the last: step {step}) had non-finite gradient norms and were not "
                "applied; lower actor.lr, keep actor.grad_clip > 0, or look at those steps' "
                "prompts (ledger.jsonl, 'skipped')"
            )

    # ---- checkpoints --------------------------------------------------------------------

    def should_save(self, version: int, *, last: bool = False) -> bool:
        return self.checkpointer.should_save(version, last=last)

    def save(
        self,
        ranks: TrainerRanks,
        *,
        step: int,
        version: int,
        state: dict[str, Any],
        extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """A checkpoint of ``step`` (RunCheckpointer.save) holding the initial validation,
        the run totals, the skipped steps in a row and the recipe's loop ``state``."""
        state = {
            "initial_val": self.initial_val,
            "totals": self.totals.state_dict(),
            "wall_s": self.elapsed_s(),
            "blocked_s": self.blocked_s,
            "consecutive_skips": self.consecutive_skips,
            **state,
        }
        with self.tracer.span("checkpoint"):
            return self.checkpointer.save(
                ranks, step=step, version=version, state=state, extra=extra
            )

    def finish(
        self,
        *,
        step: int,
        version: int,
        final_val: dict[str, float],
        wall_s: float,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        """Write ``summary.json``: what every mode reports (run_summary), then the recipe's
        ``extra`` (prompts, queues, idle ratios, faults); returns it."""
        summary = run_summary(
            self.cfg.mode,
            steps=step,
            version=version,
            totals=self.totals,
            initial_val=self.initial_val,
            final_val=final_val,
            wall_s=self.prior_wall_s + wall_s,  # the whole run's, across resumes
        )
        summary |= extra
        summary |= self.startup.metrics()
        # Counted, not computed: what the ledger lists as trained and as skipped.
        summary["prompts/trained"] = self.prompts_trained
        summary["prompts/skipped"] = self.prompts_skipped
        summary["status"] = "completed"  # a failure later on writes "failed" over it
        self.tracker.log_summary(summary)
        return summary

    def close(self, sources: list[TraceSource]) -> None:
        """Pull the last events of ``sources`` into trace.json, then close the tracker; safe
        to call twice. Call it while the processes behind ``sources`` are still up."""
        try:
            self.trace.close(sources)
        except Exception:  # closing must go on: the tracker still holds the summary
            logger.exception("closing trace.json failed")
        self.tracker.close()


def _update_skipped(metrics: dict[str, float]) -> bool:
    """Whether the step's update applied nothing: every optimizer step was skipped."""
    steps = metrics.get("actor/optimizer_steps", 0.0)
    return steps > 0 and metrics.get("actor/skipped_steps", 0.0) >= steps
