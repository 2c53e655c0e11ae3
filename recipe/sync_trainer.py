"""The synchronous colocated baseline (``mode=sync``): the yardstick of every async speedup.

    for step in range(total_steps):
        prompts  = cursor.take(data.train_batch_size)          exactly-once order
        groups   = rollout.generate(prompts, n=rollout.n)      engines on version v
        rewards  = score(groups)
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

from recipe.config import RecipeConfig
from recipe.data.cursor import PromptCursor
from recipe.faults import fails_cleanly
from recipe.observability.progress import step_bar, update_bar
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import Trajectory
from recipe.run.metrics import sample_metrics
from recipe.separate_trainer import SeparateRayPPOTrainer

logger = logging.getLogger(__name__)


class SyncTrainer(SeparateRayPPOTrainer):
    """Generate, score, train and push in lock step on shared resources."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        super().__init__(cfg, run_dir)
        self.cursor = PromptCursor(self.train_records, seed=cfg.data.seed, shuffle=cfg.data.shuffle)
        self.total_steps = self._plan_steps()
        mini_batches = cfg.prompts_per_step // cfg.actor.ppo_mini_batch_size
        self._build_trainer_group(
            total_optimizer_steps=self.total_steps * mini_batches * cfg.actor.ppo_epochs
        )
        self._build_rollout_group()
        self._trained_now: list[str] = []
        """Prompt uids of the step being trained (for ledger.jsonl)."""
        if self.resume_from is not None:
            self.cursor.load_state_dict(self._load_checkpoint()["cursor"])
            self._restore_engines()

    @fails_cleanly
    def fit(self) -> dict[str, Any]:
        start = time.perf_counter()
        initial = self._initial_validation()
        last_val = initial
        num_samples = int(self.resume_state.get("num_samples", 0))
        bar = step_bar(self.total_steps, self.cfg.mode, quiet=self.cfg.logger.quiet)
        for _ in range(self.global_step, self.total_steps):
            metrics = self._train_step()
            self.global_step += 1
            num_samples += int(metrics["throughput/samples"])
            self._trace_step(metrics)  # before validation: the slice is the training step
            if self._should_validate():
                last_val = self._validate()
                metrics.update(last_val)
            metrics["trainer/param_version"] = self.version
            self.tracker.log(metrics, step=self.global_step)
            self._record_trained(self._trained_now)
            out_of_time = self._out_of_time(start)
            if self._should_save(last=out_of_time or self.global_step == self.total_steps):
                state = {"cursor": self.cursor.state_dict(), "num_samples": num_samples}
                self._save_checkpoint(state)
            update_bar(bar, metrics, self.version, last_val.get("val/accuracy"))
            if out_of_time:
                logger.info("trainer.max_wall_s reached after %d steps", self.global_step)
                break
        bar.close()
        final = last_val if self._validated_last() else self._validate()
        wall_s = time.perf_counter() - start
        summary = {
            "mode": self.cfg.mode,
            "steps": self.global_step,
            "param_version": self.version,
            "prompts/admitted": self.cursor.num_handed_out,
            "prompts/trained": self.global_step * self.cfg.prompts_per_step,
            "samples/trained": num_samples,
            "initial/val_accuracy": initial.get("val/accuracy"),
            "final/val_accuracy": final.get("val/accuracy"),
            "staleness/max": 0,
            "staleness/histogram": {"0": num_samples},
            "throughput/samples_per_s": num_samples / wall_s,
            "wall_s": wall_s,
        }
        self.tracker.log_summary(summary)
        return summary

    def _train_step(self) -> dict[str, float]:
        cfg = self.cfg
        metrics = MetricsAccumulator()
        step_start = time.perf_counter()
        records = self.cursor.take(cfg.prompts_per_step)
        self._trained_now = [r.uid for r in records]
        with metrics.timer("timing/gen_s"), self.tracer.span("generate"):
            groups = self.rollout_group.generate(
                records,
                [self.prompt_ids[r.uid] for r in records],
                n=cfg.rollout.n,
                temperature=cfg.rollout.temperature,
                top_p=cfg.rollout.top_p,
                top_k=cfg.rollout.top_k,
            )
        for record, trajs in zip(records, groups, strict=True):
            self._score(record, trajs)
        batch = self._make_batch(groups)
        batch = self._compute_old_log_prob(batch, metrics)
        batch = self._compute_advantages(batch)
        self._update_actor(batch, metrics)
        self._fit_update_weights(metrics)
        step_s = time.perf_counter() - step_start
        out = metrics.reduce()
        out.update(_sample_metrics([t for g in groups for t in g], step_s))
        out["timing/step_s"] = step_s
        # Colocated: the trainer waits while the engines generate, and the reverse.
        out["trainer/idle_ratio"] = out["timing/gen_s"] / step_s
        out["rollouter/idle_ratio"] = 1.0 - out["timing/gen_s"] / step_s
        return out


def _sample_metrics(trajs: list[Trajectory], step_s: float) -> dict[str, float]:
    """Reward, length and throughput of one step's samples (staleness is 0 in sync mode)."""
    out = sample_metrics(trajs)
    out.update(
        {
            "staleness/mean": 0.0,
            "staleness/max": 0.0,
            "throughput/tokens_per_s": out["throughput/tokens"] / step_s,
            "throughput/samples_per_s": len(trajs) / step_s,
        }
    )
    return out
