"""``OneStepOffTrainer`` (``mode=one_step_off``): batch k+1 generates while batch k trains.

    submit batch 0                                   engines on version 0
    for k in range(total_steps):
        wait batch k                                 timing/wait_prev_gen_s
        submit batch k+1                             engines on version k, overlaps training
        score, old log-probs, advantages, update on batch k
        wait batch k+1                               timing/wait_prev_gen_s
          (algorithm.filter_groups: score it, filter zero-variance groups, refill on
           version k, still before the push)
        push weights -> engines serve version k + 1

Generation of batch k+1 runs on the rollout resources during batch k's training, so it comes
from the weights *before* batch k's update: batch 0 is trained at staleness 0 and every later
batch at exactly 1. The push waits for batch k+1 to finish first: a push pauses the engines,
and waiting means it never cuts a group, so every token of a batch has one version (no partial
rollout is needed, which is the one-step-off contract). Prompts come from the same seeded
``PromptCursor`` as ``mode=sync``, so both modes train the same prompts at every step; only
the generating version (and therefore the sampling seed) differs.

A checkpoint (after a push) holds batch k+1 as generated, so a resumed run trains exactly the
samples the uninterrupted one would have, at the same staleness.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipe.algo.dynamic_sampling import sample_step
from recipe.batch_trainer import BatchTrainer, score_timed
from recipe.checkpoint import num_filtered
from recipe.checkpoint.codec import decode_groups, encode_groups
from recipe.config import RecipeConfig
from recipe.faults import fails_cleanly
from recipe.observability.progress import step_bar, update_bar
from recipe.observability.trace import now_us, traced
from recipe.observability.trace_file import busy_s, rollout_slices
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import PromptRecord, Trajectory
from recipe.run.metrics import judge_metrics, sample_metrics, staleness_metrics
from recipe.workers.rollout.requests import GroupRequest

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PendingBatch:
    """One batch of prompt groups submitted to the engines and maybe still generating."""

    records: list[PromptRecord]
    """The batch's prompts, in cursor order."""
    refs: list[Any]
    """One Ray ObjectRef per prompt group (``records`` order); empty when restored."""
    version: int
    """Weights version the engines served when the batch was submitted."""
    groups: list[list[Trajectory]] | None = field(default=None)
    """The finished groups, scored, once waited for (a checkpoint stores them while
    untrained). With dynamic sampling, ``records`` and ``groups`` are then the kept ones."""
    filtered: list[str] = field(default_factory=list)
    """Uids of the prompts dynamic sampling filtered out of this batch."""


class OneStepOffTrainer(BatchTrainer):
    """Train batch k while the rollout workers generate batch k+1; one push per step."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        super().__init__(cfg, run_dir)
        self._resumed_pending = self._resume_pending() if self.run.resume_from is not None else None

    # ---- the loop -----------------------------------------------------------------------

    @fails_cleanly
    def fit(self) -> dict[str, Any]:
        run = self.run
        start = run.begin()
        last_val = run.initial_validation(self._validate)
        bar = step_bar(self.total_steps, self.cfg.mode, quiet=self.cfg.logger.quiet)
        pending = self._first_batch()
        while pending is not None:
            metrics = self.step_metrics = MetricsAccumulator()
            step_start = time.perf_counter()
            current = pending
            groups = self._wait(current, metrics)
            last_step = self.global_step + 1 == self.total_steps
            pending = None if last_step else self._submit_batch()
            out = self._train_batch(current.records, groups, metrics)
            if pending is not None:
                out["queue/size"] = float(self._num_ready(pending))
                self._wait(pending, metrics)  # before the push: a pause would cut its groups
            self._fit_update_weights(metrics)
            self.global_step += 1
            out.update(metrics.reduce())
            out["timing/step_s"] = time.perf_counter() - step_start
            out["throughput/samples_per_s"] = out["throughput/samples"] / out["timing/step_s"]
            out["throughput/tokens_per_s"] = out.pop("throughput/tokens") / out["timing/step_s"]
            out |= judge_metrics(self.inputs.reward_fn, out)
            out_of_time = pending is not None and run.out_of_time(start)
            save = run.should_save(self.version, last=pending is None or out_of_time)
            last_val = (
                run.end_step(
                    self.global_step,
                    self.version,
                    out,
                    [r.uid for r in current.records],
                    sources=self._trace_sources(),
                    filtered_uids=current.filtered,
                    from_trace=functools.partial(self._idle_ratios, out),
                    validate=self._validate,
                    checkpoint=functools.partial(self._checkpoint, pending) if save else None,
                    ranks=self.ranks,
                )
                or last_val
            )
            update_bar(bar, out, self.version, last_val.get("val/accuracy"))
            if out_of_time:
                logger.info("trainer.max_wall_s reached after %d steps", self.global_step)
                break
        bar.close()
        final = run.final_validation(self._validate, last_val, self.global_step, self.version)
        return self._summarize(final, time.perf_counter() - start, pending)

    # ---- steps of the loop --------------------------------------------------------------

    def _submit_batch(self) -> PendingBatch:
        """Take the next ``prompts_per_step`` prompts and start every group on the engines."""
        cfg = self.cfg.rollout
        records = self.cursor.take(self.cfg.prompts_per_step)
        refs = [
            self.rollout.submit(
                GroupRequest(
                    r.uid,
                    self.inputs.prompt_ids[r.uid],
                    self.version,
                    cfg.n,
                    cfg.temperature,
                    cfg.top_p,
                    cfg.top_k,
                    record=r,
                )
            )
            for r in records
        ]
        return PendingBatch(records, refs, self.version)

    # ---- checkpoint state ---------------------------------------------------------------

    def _first_batch(self) -> PendingBatch | None:
        """A fresh run submits batch 0; a resumed one continues with the batch its
        checkpoint holds (generated before the crash, not trained yet)."""
        if self._resumed_pending is not None:
            return self._resumed_pending
        return self._submit_batch() if self.global_step < self.total_steps else None

    def _checkpoint(self, pending: PendingBatch | None) -> None:
        state = self._loop_state(pending)
        self.run.save(self.ranks, step=self.global_step, version=self.version, state=state)

    def _loop_state(self, pending: PendingBatch | None) -> dict[str, Any]:
        """What a checkpoint after a push needs: the cursor (past the pending batch), the
        pending batch itself (finished: it was waited for before the push)."""
        saved = None
        if pending is not None:
            assert pending.groups is not None, "the push waits for the pending batch"
            saved = {
                "uids": [r.uid for r in pending.records],
                "version": pending.version,
                "groups": encode_groups(pending.groups),
                "filtered": pending.filtered,
            }
        return {
            "cursor": self.cursor.state_dict(),
            "pending": saved,
        }

    def _resume_pending(self) -> PendingBatch | None:
        """Resume (``BatchTrainer._resume``); the pending batch the checkpoint holds."""
        saved = self._resume()["pending"]
        if saved is None:
            return None
        by_uid = {r.uid: r for r in self.inputs.train_records}
        records = [by_uid[uid] for uid in saved["uids"]]
        groups = decode_groups(saved["groups"])
        return PendingBatch(records, [], saved["version"], groups, saved.get("filtered", []))

    @traced("wait_batch")
    def _wait(self, pending: PendingBatch, metrics: MetricsAccumulator) -> list[list[Trajectory]]:
        """The batch's groups; the time spent blocked counts as ``timing/wait_prev_gen_s``.
        A replica that died raises ``RolloutWorkerError`` naming it."""
        with metrics.timer("timing/wait_prev_gen_s"):  # ~0 for a batch already waited for
            if pending.groups is None:
                groups = self.rollout.get(pending.refs)
                score_timed(self.inputs, pending.records, groups, metrics)
                # Refills run on pending.version: the push that ends it waits for this.
                filled = sample_step(
                    self.cfg.algorithm.filter_groups,
                    self.cfg.prompts_per_step,
                    pending.records,
                    groups,
                    self._more,
                )
                pending.records, pending.groups = filled.records, filled.groups
                pending.filtered = filled.filtered
                metrics.add("prompts/filtered", float(len(filled.filtered)), reduce="sum")
        return pending.groups

    def _num_ready(self, pending: PendingBatch) -> int:
        """Groups of ``pending`` already generated (the trainer's queue depth)."""
        import ray

        ready, _ = ray.wait(pending.refs, num_returns=len(pending.refs), timeout=0)
        return len(ready)

    def _idle_ratios(self, out: dict[str, float], events: list[dict[str, Any]]) -> dict[str, float]:
        """Over the step just ended: the trainer's share waiting for generation, and the
        engines' share with no group generating (from their trace slices)."""
        step_s = out["timing/step_s"]
        end_us = now_us()
        busy = busy_s(rollout_slices(events), end_us - step_s * 1e6, end_us)
        return {
            "trainer/idle_ratio": out["timing/wait_prev_gen_s"] / step_s,
            "rollouter/idle_ratio": max(0.0, 1.0 - busy / step_s),
        }

    @traced("train")
    def _train_batch(
        self,
        records: list[PromptRecord],
        groups: list[list[Trajectory]],
        metrics: MetricsAccumulator,
    ) -> dict[str, float]:
        """Old log-probs, advantages and update on one scored batch at ``self.version``."""
        trajs = [t for g in groups for t in g]
        out = self._sample_metrics(trajs)
        batch = self.ppo.make_batch(groups)
        batch = self.ppo.old_log_prob(batch, metrics)
        batch = self.ppo.advantages(batch)
        self.ppo.update(batch, metrics)
        return out

    def _sample_metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Reward, length and staleness of one batch, trained on ``self.version``."""
        self.run.totals.add(trajs, self.version)
        return {**sample_metrics(trajs), **staleness_metrics(trajs, self.version)}

    def _summarize(
        self, final: dict[str, float], wall_s: float, pending: PendingBatch | None
    ) -> dict[str, Any]:
        """``pending``: a batch generated but not trained (a ``trainer.max_wall_s`` stop); its
        prompts are counted as in flight (the checkpoint keeps it for a resume)."""
        return self.run.finish(
            step=self.global_step,
            version=self.version,
            final_val=final,
            wall_s=wall_s,
            extra={
                "prompts/admitted": self.cursor.num_handed_out,
                "prompts/in_flight": 0 if pending is None else len(pending.records),
                "prompts/filtered": num_filtered(self.run_dir),
                **self.fault_counts,
                **self.ppo.sync_summary,
            },
        )
