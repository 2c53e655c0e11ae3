"""The synchronous colocated baseline (``mode=sync``): the yardstick of every async speedup.

    for step in range(total_steps):
        prompts  = cursor.take(data.train_batch_size)          exactly-once order
        groups   = rollout.generate(prompts, n=rollout.n)      engines on version v
        rewards  = score(groups)
        (algorithm.filter_groups: zero-variance groups out, more prompts in, same version)
        old_lp   = trainer.compute_log_prob(batch)             also the mismatch metric
        adv      = grpo(rewards)
        trainer.update_actor(batch)
        push weights -> engines serve version v + 1

Generation and training never overlap: every sample is trained by the version that produced
it (staleness 0), so any async recipe can be compared against it on the same prompts.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from recipe.algo.dynamic_sampling import sample_step
from recipe.batch_trainer import BatchTrainer
from recipe.checkpoint import num_filtered
from recipe.config import RecipeConfig
from recipe.faults import fails_cleanly
from recipe.observability.progress import step_bar, update_bar
from recipe.observability.tracking import MetricsAccumulator
from recipe.run.metrics import judge_metrics, sample_metrics, staleness_metrics

logger = logging.getLogger(__name__)


class SyncTrainer(BatchTrainer):
    """Generate, score, train and push in lock step on shared resources."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        super().__init__(cfg, run_dir)
        self._trained_now: list[str] = []
        """Prompt uids of the step being trained (for ledger.jsonl)."""
        self._filtered_now: list[str] = []
        """Prompt uids filtered by dynamic sampling in this step (for ledger.jsonl)."""
        if self.run.resume_from is not None:
            self._resume()

    @fails_cleanly
    def fit(self) -> dict[str, Any]:
        run = self.run
        start = run.begin()
        last_val = run.initial_validation(self._validate)
        bar = step_bar(self.total_steps, self.cfg.mode, quiet=self.cfg.logger.quiet)
        for _ in range(self.global_step, self.total_steps):
            metrics = self._train_step()
            self.global_step += 1
            out_of_time = run.out_of_time(start)
            last = out_of_time or self.global_step == self.total_steps
            save = run.should_save(self.version, last=last)
            last_val = (
                run.end_step(
                    self.global_step,
                    self.version,
                    metrics,
                    self._trained_now,
                    sources=self._trace_sources(),
                    filtered_uids=self._filtered_now,
                    validate=self._validate,
                    checkpoint=self._checkpoint if save else None,
                    ranks=self.ranks,
                )
                or last_val
            )
            update_bar(bar, metrics, self.version, last_val.get("val/accuracy"))
            if out_of_time:
                logger.info("trainer.max_wall_s reached after %d steps", self.global_step)
                break
        bar.close()
        final = run.final_validation(self._validate, last_val, self.global_step, self.version)
        return run.finish(
            step=self.global_step,
            version=self.version,
            final_val=final,
            wall_s=time.perf_counter() - start,
            extra={
                "prompts/admitted": self.cursor.num_handed_out,
                "prompts/filtered": num_filtered(self.run_dir),
                **self.fault_counts,
                **self.ppo.sync_summary,
            },
        )

    def _checkpoint(self) -> None:
        state = {"cursor": self.cursor.state_dict()}
        self.run.save(self.ranks, step=self.global_step, version=self.version, state=state)

    def _train_step(self) -> dict[str, float]:
        cfg = self.cfg
        metrics = self.step_metrics = MetricsAccumulator()
        step_start = time.perf_counter()
        with metrics.timer("timing/gen_s"), self.tracer.span("generate"):
            records = self.cursor.take(cfg.prompts_per_step)
            filled = sample_step(
                cfg.algorithm.filter_groups,
                cfg.prompts_per_step,
                records,
                self._generate_scored(records),
                self._more,
            )
        records, groups = filled.records, filled.groups
        self._trained_now, self._filtered_now = [r.uid for r in records], filled.filtered
        metrics.add("prompts/filtered", float(len(filled.filtered)), reduce="sum")
        trajs = [t for g in groups for t in g]
        samples = sample_metrics(trajs) | staleness_metrics(trajs, self.version)
        self.run.totals.add(trajs, self.version)  # before the push: the version that generated them
        batch = self.ppo.make_batch(groups)
        batch = self.ppo.old_log_prob(batch, metrics)
        batch = self.ppo.advantages(batch)
        self.ppo.update(batch, metrics)
        self._fit_update_weights(metrics)
        step_s = time.perf_counter() - step_start
        out = metrics.reduce() | samples
        out["throughput/tokens_per_s"] = out["throughput/tokens"] / step_s
        out["throughput/samples_per_s"] = len(trajs) / step_s
        out["timing/step_s"] = step_s
        # Colocated: the trainer waits while the engines generate, and the reverse.
        out["trainer/idle_ratio"] = out["timing/gen_s"] / step_s
        out["rollouter/idle_ratio"] = 1.0 - out["timing/gen_s"] / step_s
        return out | judge_metrics(self.inputs.reward_fn, out)
