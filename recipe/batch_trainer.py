"""``BatchTrainer``: the layer the two batch recipes (sync, one_step_off) share.

    __init__    RunInputs.load (bad input: one error line) -> ranks and engines started side
                by side; a seeded PromptCursor; total steps planned and logged
    loop        cursor.take(k) -> engines.generate (served version) -> reward scores -> PPO
                step (recipe/ppo_step.py) -> push to the engines, paused directly
                (``DirectEngines``: idle between batches, no replica is ever replaced)
    resume      checkpoint -> ranks, cursor; the engines load the resumed weights

The engines (``rollout``), the data, the prompts' token ids and the reward function live in
this process, so generation, scoring and validation are plain calls here; the subclasses
hold only their loops. The fully async trainer has none of this: its rollouter actor owns
the engines, the data and the reward.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.config import RecipeConfig
from recipe.data.cursor import PromptCursor
from recipe.observability.trace import traced
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import PromptRecord, Trajectory
from recipe.run.checkpointing import exported_weights
from recipe.run.inputs import RunInputs
from recipe.run.metrics import val_metrics, val_sampling
from recipe.run.placement import ENGINE_LOG_DIR, init_ray
from recipe.run.training_run import TraceSource
from recipe.separate_trainer import SeparateRayPPOTrainer
from recipe.workers.cluster import ReadyClock
from recipe.workers.config import RolloutConfig
from recipe.workers.judge_server import stop_judge, wait_judge

if TYPE_CHECKING:
    from recipe.checkpoint_engine.engines import ServingEngines
    from recipe.workers.rollout.replicas import RolloutReplicas

logger = logging.getLogger(__name__)


def scored_groups(
    engines: RolloutReplicas, inputs: RunInputs, records: list[PromptRecord], **sampling: Any
) -> list[list[Trajectory]]:
    """One group per record generated on ``engines`` with ``sampling`` (version, n,
    temperature, ...), each scored by the run's reward function (in place)."""
    prompt_ids = [inputs.prompt_ids[r.uid] for r in records]
    groups = engines.generate(records, prompt_ids, **sampling)
    inputs.reward_fn.score_groups(records, groups)
    return groups


def score_timed(
    inputs: RunInputs,
    records: list[PromptRecord],
    groups: list[list[Trajectory]],
    metrics: MetricsAccumulator,
) -> None:
    """Score ``groups`` (of ``records``), the time spent in ``timing/reward_s``: what the
    trainer waited on the reward (a judge's calls, an async reward function's service)."""
    with metrics.timer("timing/reward_s"):
        inputs.reward_fn.score_groups(records, groups)


def validation(
    engines: RolloutReplicas, inputs: RunInputs, rollout: RolloutConfig, version: int
) -> dict[str, float]:
    """``val/*`` of greedy (``rollout.val_temperature``) answers to the val set on
    ``version``, scored; nothing without a val set."""
    if not inputs.val_records:
        return {}
    start = time.perf_counter()
    sampling = val_sampling(version, rollout.val_temperature)
    groups = scored_groups(engines, inputs, inputs.val_records, **sampling)
    return val_metrics(groups, start, rollout.response_length)


class BatchTrainer(SeparateRayPPOTrainer):
    """Engines in this process, a cursor, generate + score (module docstring)."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        inputs_start = time.perf_counter()
        inputs = RunInputs.load(cfg)  # before any worker: each check names the key or row
        inputs_s = time.perf_counter() - inputs_start
        super().__init__(cfg, run_dir, inputs)
        startup = self.run.startup
        startup.add("inputs_s", inputs_s)
        self.inputs = inputs
        """The run's records, prompt token ids and reward function."""
        self.cursor = PromptCursor(
            inputs.train_records, seed=cfg.data.seed, shuffle=cfg.data.shuffle
        )
        self.total_steps = cfg.num_trainer_steps(len(inputs.train_records))
        logger.info(
            "mode=%s: %d trainer steps x %d prompts x %d responses",
            cfg.mode,
            self.total_steps,
            cfg.prompts_per_step,
            cfg.rollout.n,
        )
        self._rollout: RolloutReplicas | None = None
        self._judge: Any = None
        self.step_metrics = MetricsAccumulator()
        """The running step's metrics: each step sets its own (scoring adds its time)."""
        mini_batches = cfg.prompts_per_step // cfg.actor.ppo_mini_batch_size
        with startup.phase("ray_s"):
            init_ray(cfg.ray)
        # The ranks load the model while the engines start.
        trainer_start = time.perf_counter()
        ranks = self.ppo.start_ranks(
            total_optimizer_steps=self.total_steps * mini_batches * cfg.actor.ppo_epochs,
            wait=False,
        )
        ranks_up = ReadyClock(ranks.ready_refs())
        engines_start = time.perf_counter()
        try:
            last = self.placement.judge_starts_last  # on a GPU, after the policy's engines
            if not last:
                self._judge = self.placement.start_judge()  # its engines start beside them
            self._rollout = self.placement.start_engines(self.model)
            if last:
                self._judge = self.placement.start_judge()
            if self._judge is not None:
                wait_judge(self._judge, cfg.reward.judge.start_timeout_s)
        except BaseException:
            ranks.shutdown(graceful=False)
            stop_judge(self._judge)
            if self._rollout is not None:  # the judge failed after the engines started
                self._rollout.shutdown()
            raise
        startup.add_engines(time.perf_counter() - engines_start, self.run_dir / ENGINE_LOG_DIR)
        ranks.wait_ready()
        startup.add("trainer_init_s", ranks_up.ended_at() - trainer_start)

    @property
    def rollout(self) -> RolloutReplicas:
        """The engines; an error once closed."""
        if self._rollout is None:
            raise RuntimeError(f"{type(self).__name__}: the rollout engines are closed")
        return self._rollout

    def _generate_scored(self, records: list[PromptRecord]) -> list[list[Trajectory]]:
        """The groups of ``records`` on the served version, scored."""
        rollout = self.cfg.rollout
        prompt_ids = [self.inputs.prompt_ids[r.uid] for r in records]
        groups = self.rollout.generate(
            records,
            prompt_ids,
            version=self.version,
            n=rollout.n,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
        )
        score_timed(self.inputs, records, groups, self.step_metrics)
        return groups

    def _more(self, num_prompts: int) -> tuple[list[PromptRecord], list[list[Trajectory]]]:
        """A refill round of dynamic sampling: the next prompts, generated and scored."""
        records = self.cursor.take(num_prompts)
        return records, self._generate_scored(records)

    @traced("validate")
    def _validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_temperature``) answers to the val set, scored."""
        return validation(self.rollout, self.inputs, self.cfg.rollout, self.version)

    def _serving_engines(self) -> ServingEngines:
        """The rollout side of a push: the engines, idle between batches, paused directly."""
        from recipe.checkpoint_engine.engines import DirectEngines

        group = self.rollout
        return DirectEngines(lambda: group.workers, self.cfg.checkpoint_engine.timeout_s)

    def _resume(self) -> dict[str, Any]:
        """Load the checkpoint (ranks, step, version, cursor) and make the engines serve its
        version (they start from ``model.path`` at version 0): the trainer exports the
        weights once, every replica loads them. Returns the checkpoint's loop state."""
        with self.run.startup.phase("resume_s"):
            state = self._load_checkpoint()
            self.cursor.load_state_dict(state["cursor"])
            assert self.version > 0, "checkpoints are taken after a push"
            with exported_weights(self.ranks, self.run_dir, f"resume-v{self.version}") as w:
                self.rollout.update_weights_from_file(w, self.version)
        logger.info("engines serve the resumed version %d", self.version)
        return state

    def _trace_sources(self, *, final: bool = False) -> list[TraceSource]:
        """The engines' buffered trace events."""
        return [self.rollout.drain_trace] if self._rollout is not None else []

    def close(self, *, release_placement: bool = True) -> None:
        """The run's records and the ranks (the base's), then the engines."""
        super().close(release_placement=False)
        judge, self._judge = self._judge, None
        stop_judge(judge)
        engines, self._rollout = self._rollout, None
        if engines is not None:
            try:
                engines.shutdown()
            except Exception:  # the placement is released all the same
                logger.exception("shutting down the rollout engines failed")
        if release_placement:
            self.placement.release()
