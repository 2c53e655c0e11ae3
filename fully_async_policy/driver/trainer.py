"""``FullyAsyncTrainer``: the trainer side of the fully async recipe (driver process).

    for step in 1..total_steps:                     local = (step - 1) % T + 1
        groups = feed.take(R)                       queue.get_batch: blocks only when the
                                                    rollouter is behind (feed.py)
        old_lp = pushed-version forward             bypass_mode=false (see below)
        adv    = grpo(rewards); trainer.update_actor(batch)
        if local == T:  push weights -> version + 1 (the one place weights move), one
                        conversation of three rollouter calls (rollout_engines.py):
                          stage + verify            while the engines generate
                          rollouter.open_sync()     admission held, validation done,
                                                    engines paused (PausePolicy), dead
                                                    replicas started again -> the receivers
                          load, agree-after
                          rollouter.resume_engines()  each replica resumed once
                        (rollouter.snapshot()       a checkpoint is due)
                        rollouter.end_sync(version, trained) -> SyncPause: the window
                                                    opens; what the pause did (sync/*)

Old log-probs (``algorithm.rollout_correction.bypass_mode``): ``true`` (the default) uses
the rollout log-probs; ``false`` takes them from the version just pushed: local step 1
saves the weights to a CPU slot (they still are the pushed ones), later local steps swap that
copy in for the forward and back out; the trainer worker then applies truncated importance
sampling between old and rollout log-probs.

``async_training.max_staleness`` is enforced on this side, where staleness is final
(``RolloutFeed.take``): a group whose oldest token is more versions behind than that goes
back to the rollouter, which admits its prompt again (counted in ``prompts/readmitted``),
and the trainer takes another group.

The loop runs in the driver: its compute lives in the TrainerWorker actors, so a trainer
actor would only add a hop, while the driver keeps the one Tracker of the run and sees a
rollouter failure at once (it waits on the batch and on the rollouter's ``run`` together).
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.driver.clients import QueueClient, RolloutClient, Waits
from fully_async_policy.driver.feed import RolloutAnswers, RolloutFeed
from fully_async_policy.driver.metrics import group_metrics
from fully_async_policy.driver.rollout_engines import RolloutEngines
from fully_async_policy.driver.served_weights import PUSHED_SLOT, ServedWeights
from fully_async_policy.messages import ROLLOUTER_STATE_FILE, RolloutProgress
from fully_async_policy.run_plan import plan_run
from recipe.checkpoint.store import write_json
from recipe.config import RecipeConfig
from recipe.faults import fails_cleanly
from recipe.observability.progress import step_bar, update_bar
from recipe.observability.trace import traced
from recipe.observability.tracking import MetricsAccumulator
from recipe.run.inputs import RunInputs
from recipe.run.training_run import TraceSource
from recipe.separate_trainer import SeparateRayPPOTrainer

if TYPE_CHECKING:
    from recipe.workers.trainer.ranks import TrainerRanks

logger = logging.getLogger(__name__)


class FullyAsyncTrainer(SeparateRayPPOTrainer):
    """Pulls R groups per local step, trains, and pushes weights every T local steps."""

    def __init__(
        self,
        cfg: RecipeConfig,
        run_dir: Path,
        *,
        inputs: RunInputs,
        ranks: TrainerRanks | None = None,
    ) -> None:
        """``inputs``: the run's, checked by the driver before Ray started (of them the
        trainer keeps the model; the prompt sets go into the run's records). ``ranks``: what
        a unit test brings instead of starting trainer ranks
        (tests/unit/test_fully_async_trainer.py)."""
        super().__init__(cfg, run_dir, inputs)
        run = self.run
        self.plan = plan_run(cfg, len(inputs.train_records))
        if run.resume_from is not None:
            self._check_resume_plan()
        optimizer_steps_per_step = cfg.async_training.require_batches * cfg.actor.ppo_epochs
        if ranks is not None:
            self.ppo.use_ranks(ranks)
        else:  # they load the model while the rollouter starts the engines (attach waits)
            self.ppo.start_ranks(
                total_optimizer_steps=self.plan.total_steps * optimizer_steps_per_step, wait=False
            )
        self.rollouter: RolloutClient
        """The FullyAsyncRollouter actor, which owns the engines (set by ``attach``)."""
        self.queue: QueueClient
        """The MessageQueue actor of PromptGroups (set by ``attach``)."""
        self.waits: Waits
        """How this trainer waits on both actors' calls (the rollouter client's)."""
        self.trained_uids: list[str] = []
        """Prompt uid of every trained group, in training order."""
        self.ledger: dict[str, list[str]] = {}
        """After ``fit``: prompt uids ``admitted``, ``trained`` and ``in_flight`` at the end."""
        self._progress = RolloutProgress(0.0, 0.0, 0, 0, 0)
        self._last_val: dict[str, float] = {}
        self._rollouter_state: dict[str, Any] | None = None
        """The rollouter's snapshot taken in the last sync, waiting to be checkpointed."""
        self.served: ServedWeights
        """The served version's weights kept in the trainer ranks (built in ``attach``)."""
        self.engines: RolloutEngines
        """The rollouter's engines as a push sees them (built in ``attach``)."""
        self.feed: RolloutFeed | None = None
        """Groups and answers from the rollouter within deadlines (built in ``attach``)."""
        self._num_rollout_restarts = self._num_rollout_retired = 0

    def attach(self, rollouter: RolloutClient, queue: QueueClient) -> None:
        """Wire the rollouter actor and the message queue. A resumed run then makes the
        engines serve the checkpoint's weights and restores the rollouter."""
        self.ranks.wait_ready()
        self.rollouter, self.queue, self.waits = rollouter, queue, rollouter.waits
        answers = RolloutAnswers(self.cfg, rollouter, self.run_dir)
        self.served = ServedWeights(self.ranks, rollouter, self.run_dir, answers.within)
        self.feed = feed = RolloutFeed(
            self.cfg, rollouter, queue, self.served, tracer=self.tracer, run_dir=self.run_dir
        )
        self.engines = RolloutEngines(rollouter, self.served, lambda: self.version, feed.within)
        self.served.workers()  # the push's receivers, known before the first push
        if self.run.resume_from is not None:  # here, not in the constructor: the engines
            with self.run.startup.phase("resume_s"):  # started beside the ranks meanwhile
                self._resume_trainer()
                self.served.serve_resumed(self.version)
                feed.within(self.rollouter.restore(str(self.run.resume_from)), "restore")

    def _serving_engines(self) -> RolloutEngines:
        """The rollouter's engines, paused and resumed by its supervisor (it owns them and
        replaces dead ones): rollout_engines.py."""
        return self.engines

    @property
    def fault_counts(self) -> dict[str, int]:
        return super().fault_counts | {
            "faults/rollout_restarts": self._num_rollout_restarts,
            "faults/rollout_retired": self._num_rollout_retired,
        }

    # ---- one local step -------------------------------------------------------------------

    @traced("train_step")
    def _train_step(self, local_step: int) -> dict[str, float]:
        metrics = MetricsAccumulator()
        groups = self._feed.take(self.plan.prompts_per_step, self.version)
        batch = self.ppo.make_batch([g.trajectories for g in groups])
        decoupled = not self.cfg.algorithm.rollout_correction.bypass_mode
        if decoupled and local_step == 1 and self.plan.steps_per_sync > 1:
            self.served.keep(self.version, metrics)
        slot = PUSHED_SLOT if decoupled and local_step > 1 else None
        batch = self.ppo.old_log_prob(batch, metrics, slot=slot)
        batch = self.ppo.advantages(batch)
        self.ppo.update(batch, metrics)
        self.trained_uids += [g.prompt_uid for g in groups]
        self.run.totals.add([t for g in groups for t in g.trajectories], self.version)
        return {**metrics.reduce(), **group_metrics(groups, self.version)}

    # ---- weight sync --------------------------------------------------------------------------

    @traced("sync")
    def _sync(self, *, last: bool = False) -> dict[str, float]:
        """Push weights (version + 1): staged while the engines generate, then the push
        opens the sync (the rollouter holds admission and pauses the engines), loads and
        resumes them (rollout_engines.py); ``end_sync`` opens the window and answers what the
        pause did. The push reports its own ``sync/*`` phases; this adds the pause's. When
        the new version is to be checkpointed, the rollouter's state is taken before
        ``end_sync``."""
        metrics = MetricsAccumulator()
        self._fit_update_weights(metrics)  # open_sync, resume_engines through self.engines
        if self.run.should_save(self.version, last=last):
            self._rollouter_state = self._feed.within(self.rollouter.snapshot(), "snapshot")
        end = self.rollouter.end_sync(self.version, len(self.trained_uids))
        pause = self._feed.within(end, "end_sync")
        if pause is None:
            raise RuntimeError("end_sync answered no pause after a push")
        if self.cfg.rollout.max_restarts > 0:
            # After the engines resumed: the trainer's weights stay the served ones until the
            # next update, so the copy need not hold generation up.
            self.served.keep(self.version, metrics)
        return metrics.reduce() | {
            "sync/pause_window_s": pause.window_s,
            "sync/quiesce_s": pause.pause_s,
            "sync/partial_groups": float(pause.num_partial_groups),
            "sync/drained_groups": float(pause.num_drained_groups),
        }

    def _progress_metrics(self, interval_s: float, wait_s: float) -> dict[str, float]:
        """Idle ratios over the step, queue state, and validation results that came in."""
        progress = self._feed.within(self.rollouter.poll(), "poll")
        stats = self._feed.from_queue(self.queue.stats(), "stats")
        elapsed = progress.elapsed_s - self._progress.elapsed_s
        out = {
            "trainer/idle_ratio": wait_s / max(interval_s, 1e-9),
            "rollouter/idle_ratio": (progress.idle_s - self._progress.idle_s) / max(elapsed, 1e-9),
            "rollouter/in_flight": float(progress.num_in_flight),
            "queue/size": float(stats.size),
            "queue/max_size": float(stats.max_size),
            "queue/blocked_puts": float(stats.num_blocked_puts),
            "prompts/admitted": float(progress.num_admitted),
            "prompts/readmitted": float(progress.num_readmitted),
            "prompts/filtered": float(progress.num_filtered),
        }
        if (progress.num_restarts, progress.num_retired) != (
            self._num_rollout_restarts,
            self._num_rollout_retired,
        ):
            self.served.forget_workers()  # a replica runs on a new worker, or on none
        self._num_rollout_restarts = progress.num_restarts
        self._num_rollout_retired = progress.num_retired
        out |= {key: float(count) for key, count in self.fault_counts.items()}
        out |= progress.judge
        self._progress = progress
        for version in sorted(progress.val_results):
            out |= progress.val_results[version] | {"val/param_version": float(version)}
            self._last_val = progress.val_results[version]
        return out

    # ---- the run ------------------------------------------------------------------------------

    @fails_cleanly
    def fit(self) -> dict[str, Any]:
        """Train ``plan.total_steps`` steps; returns the summary (also in summary.json)."""
        run = self.run
        start = run.begin()
        feed = self._feed
        run.initial_validation(lambda: feed.within(self.rollouter.validate(), "validate"))
        if run.resume_from is not None:  # the sync the checkpoint was taken in ends here
            feed.within(self.rollouter.end_sync(self.version, len(self.trained_uids)), "end_sync")
        feed.start()
        bar = step_bar(self.plan.total_steps, self.cfg.mode, quiet=self.cfg.logger.quiet)
        last_end = time.perf_counter()
        first = self.global_step + 1  # checkpoints follow a sync: a window starts here
        for step in range(first, self.plan.total_steps + 1):
            local_step = (step - first) % self.plan.steps_per_sync + 1
            num_trained_before = len(self.trained_uids)
            wait_before = feed.wait_s
            metrics = self._train_step(local_step)
            self.global_step = step
            out_of_time = run.out_of_time(start)
            last = step == self.plan.total_steps or out_of_time
            if local_step == self.plan.steps_per_sync or last:
                metrics |= self._sync(last=last)
            now = time.perf_counter()
            metrics |= self._progress_metrics(now - last_end, feed.wait_s - wait_before)
            metrics["timing/step_s"] = now - last_end
            metrics["throughput/samples_per_s"] = metrics["throughput/samples"] / (now - last_end)
            last_end = now
            # Validation runs on the rollouter (its results came in with the progress).
            run.end_step(
                step,
                self.version,
                metrics,
                self.trained_uids[num_trained_before:],
                sources=self._trace_sources(),
                checkpoint=self._checkpoint if self._rollouter_state is not None else None,
                ranks=self.ranks,
            )
            update_bar(bar, metrics, self.version, self._last_val.get("val/accuracy"))
            if out_of_time:
                logger.info("trainer.max_wall_s reached after %d steps", step)
                break
        bar.close()
        return self._finish(start)

    # ---- checkpoints ----------------------------------------------------------------------

    def _plan_key(self) -> dict[str, int]:
        """The plan numbers a resumed run must share with its checkpoint (admission, windows)."""
        plan = self.plan
        return {
            "prompts_per_step": plan.prompts_per_step,
            "steps_per_sync": plan.steps_per_sync,
            "budget": plan.budget,
        }

    def _checkpoint(self) -> None:
        """Checkpoint the version just pushed with the rollouter's state from that sync
        (fully_async_policy/rollouter/snapshot.py)."""
        rollouter_state, self._rollouter_state = self._rollouter_state, None

        def write_rollouter_state(run_state_dir: Path) -> None:
            write_json(run_state_dir / ROLLOUTER_STATE_FILE, rollouter_state)

        state = {
            "plan": self._plan_key(),
            "trained_uids": self.trained_uids,
        }
        self.run.save(
            self.ranks,
            step=self.global_step,
            version=self.version,
            state=state,
            extra=write_rollouter_state,
        )

    def _check_resume_plan(self) -> None:
        saved = self.run.resume_state.get("plan")
        if saved != self._plan_key():
            raise ValueError(
                f"trainer.resume_mode={str(self.run.resume_from)!r}: the checkpoint's plan {saved} "
                f"differs from this run's {self._plan_key()}; keep actor.ppo_mini_batch_size "
                "and async_training.* as they were to resume"
            )

    def _resume_trainer(self) -> None:
        """Trainer side of a resume (the rollouter's follows in ``attach``)."""
        state = self._load_checkpoint()
        self.trained_uids = list(state["trained_uids"])

    def _finish(self, start: float) -> dict[str, Any]:
        """Stop the rollouter, validate the final version (``trainer.val_after_train``),
        account for every prompt."""
        feed = self._feed
        ledger = feed.within(self.rollouter.stop(), "stop")
        feed.within(feed.run_ref, "run")
        final = {}
        if self.cfg.trainer.val_after_train:
            final = feed.within(self.rollouter.validate(), "validate")
        leftover = feed.from_queue(self.queue.drain(), "drain")
        feed.from_queue(self.queue.close(), "close")
        queue_stats = feed.from_queue(self.queue.stats(), "stats")
        wall_s = time.perf_counter() - start
        self.ledger = {
            "admitted": ledger.admitted_uids,
            "trained": list(self.trained_uids),
            "in_flight": ledger.unreleased_uids + [g.prompt_uid for g in leftover],
            "filtered": ledger.filtered_uids,
        }
        self._num_rollout_restarts = ledger.num_restarts
        self._num_rollout_retired = ledger.num_retired
        extra = {
            "prompts/admitted": len(ledger.admitted_uids),
            "prompts/readmitted": ledger.num_readmitted,
            "prompts/in_flight": len(self.ledger["in_flight"]),
            "prompts/filtered": len(ledger.filtered_uids),
            "staleness/bound": self.plan.staleness_bound,
            "trainer/idle_ratio": self._feed.wait_s / wall_s,
            "rollouter/idle_ratio": self._progress.idle_s / max(self._progress.elapsed_s, 1e-9),
            "queue/capacity": queue_stats.capacity,
            "queue/max_size": queue_stats.max_size,
            "queue/blocked_puts": queue_stats.num_blocked_puts,
            **self.fault_counts,
            **self.ppo.sync_summary,
        }
        return self.run.finish(
            step=self.global_step, version=self.version, final_val=final, wall_s=wall_s, extra=extra
        )

    @property
    def _feed(self) -> RolloutFeed:
        if self.feed is None:
            raise RuntimeError("FullyAsyncTrainer.attach() has not run")
        return self.feed

    def _trace_sources(self, *, final: bool = False) -> list[TraceSource]:
        """The rollouter's buffered trace events, its engines' among them (feed.py)."""
        if self.feed is None:  # attach() never ran
            return []
        return [functools.partial(self.feed.pull_trace, wait=final)]
