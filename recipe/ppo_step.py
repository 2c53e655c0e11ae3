"""``PPOStep``: the trainer's side of one PPO step, the same in every recipe.

    groups --make_batch--> TrainBatch --old_log_prob--> --advantages--> --update-->
        (the trainer ranks)                  mismatch/*      grpo, ...      actor/*
    push(version, engines) --> version + 1   (every T updates; the checkpoint engine)

It owns the trainer ranks (``start_ranks``; ``ranks`` once built) and the
``ParameterSynchronizer`` (built at the first push, which is when both sides exist), and
nothing about where groups come from or who owns the engines: the recipe hands each call
what it needs (groups, the served version, the engines as a push sees them) and keeps the
version itself. Each piece is one slice of the trace ("old_log_prob", "advantages",
"update", "weight_push") and adds its timings and figures to the step's metrics under the
names docs/operations.md lists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.agent.metrics import check_env_errors
from recipe.algo.advantages import compute_advantages, share_episode_advantages
from recipe.config import RecipeConfig
from recipe.model import HFModelConfig
from recipe.observability.trace import Tracer, traced
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import Trajectory
from recipe.run.checkpointing import EXPORT_DIR, RunCheckpointer
from recipe.run.placement import Placement, init_ray
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.correction import correct_batch

if TYPE_CHECKING:
    from recipe.checkpoint_engine.engines import ServingEngines
    from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer
    from recipe.workers.trainer.ranks import TrainerRanks

logger = logging.getLogger(__name__)


class PPOStep:
    """Batch, old log-probs, advantages, update and push on the trainer ranks (module
    docstring)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        model: HFModelConfig,
        placement: Placement,
        tracer: Tracer,
        run_dir: Path,
    ) -> None:
        """``tracer``: the trainer process's (the pieces are slices on it); ``run_dir``: where
        ``checkpoint_engine.backend=file`` writes the pushed weights."""
        self.cfg, self.model, self.placement = cfg, model, placement
        self.tracer, self.run_dir = tracer, run_dir
        self.param_sync: ParameterSynchronizer | None = None
        """The ParameterSynchronizer, built at the first push (it needs both sides)."""
        self._ranks: TrainerRanks | None = None

    @property
    def ranks(self) -> TrainerRanks:
        """The trainer ranks; an error before ``start_ranks`` (or ``use_ranks``)."""
        if self._ranks is None:
            raise RuntimeError("PPOStep: the trainer ranks are not built")
        return self._ranks

    def use_ranks(self, ranks: TrainerRanks) -> None:
        """Train on ranks built elsewhere (a unit test's scripted ranks)."""
        self._ranks = ranks

    def start_ranks(self, *, total_optimizer_steps: int, wait: bool = True) -> TrainerRanks:
        """Start the trainer ranks (and Ray); ``wait`` False returns while they load the model
        (the engines start meanwhile), and the caller then calls ``ranks.wait_ready()``."""
        from recipe.workers.trainer.ranks import TrainerRanks
        from recipe.workers.trainer.spec import TrainerSpec

        cfg = self.cfg
        init_ray(cfg.ray)
        spec = TrainerSpec(
            model_path=str(self.model.path),
            total_optimizer_steps=total_optimizer_steps,
            policy_loss=cfg.algorithm.policy_loss,
            response_length=cfg.rollout.response_length,
            compute_dtype=cfg.model.dtype,
            seed=cfg.trainer.seed,
        )
        self._ranks = TrainerRanks(
            cfg.actor,
            spec,
            use_gpu=self.placement.device == "cuda",
            gpu_fraction=self.placement.trainer_gpu_fraction,
            placement_group=self.placement.take("trainer"),
            owns_placement_group=not self.placement.one_group,
            wait=wait,
        )
        return self._ranks

    def make_batch(self, groups: list[list[Trajectory]]) -> TrainBatch:
        """One batch of the groups' trajectories (multi-turn: too many environment errors
        stop the run first)."""
        trajs = [t for group in groups for t in group]
        multi_turn = self.cfg.rollout.multi_turn
        if multi_turn.enable:
            check_env_errors(
                trajs,
                multi_turn.max_env_error_ratio,
                multi_turn.environment
                or multi_turn.agent_loop
                or multi_turn.agent
                or multi_turn.agent_command
                or "the agent loop",
            )
        return TrainBatch.from_trajectories(trajs, pad_token_id=self.model.pad_token_id)

    @traced("old_log_prob")
    def old_log_prob(
        self, batch: TrainBatch, metrics: MetricsAccumulator, *, slot: str | None = None
    ) -> TrainBatch:
        """Old log-probs of PPO. Bypass mode: the rollout log-probs are the old policy (the
        trainer still measures the rollout/trainer mismatch, which costs one forward).
        ``slot``: forward with the weights saved by ``save_model_to_cpu(slot)`` instead of the
        current ones (the pushed version, in the async recipes)."""
        with metrics.timer("timing/old_log_prob_s"):
            logprobs_bt, _ = self.ranks.compute_log_prob(batch, slot=slot, with_entropy=False)
        mask = batch.response_mask_bt
        num_tokens = max(int(mask.sum()), 1)
        diff = (logprobs_bt - batch.rollout_logprobs_bt).abs()[mask]
        metrics.add(
            "mismatch/logprob_abs_diff_mean", float(diff.sum()) / num_tokens, weight=num_tokens
        )
        metrics.add(
            "mismatch/logprob_abs_diff_max",
            float(diff.max()) if diff.numel() else 0.0,
            reduce="max",
        )
        batch = correct_batch(batch, logprobs_bt, self.cfg.algorithm.rollout_correction, metrics)
        if not self.cfg.algorithm.rollout_correction.bypass_mode:
            batch.old_logprobs_bt = logprobs_bt
        return batch

    @traced("advantages")
    def advantages(self, batch: TrainBatch) -> TrainBatch:
        """Group advantages over episodes (one counted row each), then shared by every row of
        an episode: the earlier segments of one are trained with its advantage."""
        adv_b = compute_advantages(
            batch.rewards_b, batch.group_index_b, self.cfg.algorithm, batch.counted_b
        )
        adv_b = share_episode_advantages(adv_b, batch.episode_b, batch.counted_b)
        return batch.with_advantages(adv_b)

    @traced("update")
    def update(self, batch: TrainBatch, metrics: MetricsAccumulator) -> None:
        """One update of the actor (``actor.ppo_epochs`` x its mini-batches) on ``batch``."""
        with metrics.timer("timing/update_s"):
            actor_metrics = self.ranks.update_actor(batch)
        for key, value in actor_metrics.items():
            metrics.add(key, value, reduce="last")

    @traced("weight_push")
    def push(
        self, version: int, engines: Callable[[], ServingEngines], metrics: MetricsAccumulator
    ) -> int:
        """Push the trainer's weights to every rollout engine through the checkpoint engine
        (``checkpoint_engine.*``: bucketed, verified, retried by its failure policy; the
        engines' owner pauses and resumes them); returns the version they then serve.
        ``engines``: the rollout side as a push sees it, asked for at the first push."""
        if self.param_sync is None:
            from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer

            self.param_sync = ParameterSynchronizer(
                self.ranks,
                engines(),
                self.cfg.checkpoint_engine,
                file_root=self.run_dir / EXPORT_DIR,  # backend=file: read on every node
                adapter_only=self.cfg.actor.lora.enabled,  # LoRA: push the adapter alone
            )
            self.param_sync.tracer = self.tracer  # its phases nest in this "weight_push"
        pushed = self.param_sync.push(version, timer=metrics.timer)
        for key, value in pushed.metrics.items():
            metrics.add(key, value, reduce="last")
        return pushed.version

    def load_checkpoint(self, checkpointer: RunCheckpointer) -> dict[str, Any]:
        """Resume: the checkpoint's weights, optimizer, schedule and RNG into the trainer
        ranks and this process. Returns its ``trainer_state.json`` (``global_step``,
        ``param_version`` and the recipe's loop state)."""
        return checkpointer.load(self.ranks)

    @property
    def sync_summary(self) -> dict[str, str]:
        """``sync/backend``: the transport the weight pushes took (summary.json; each step
        that pushed also has ``sync/backend/<name>`` = 1 in metrics.jsonl)."""
        backend = self.param_sync.backend if self.param_sync is not None else None
        return {} if backend is None else {"sync/backend": backend}

    @property
    def num_sync_retries(self) -> int:
        """Pushes retried by the checkpoint engine's failure policy (``faults/sync_retries``)."""
        return self.param_sync.num_retries if self.param_sync is not None else 0

    def shutdown(self) -> None:
        """Shut the synchronizer, then the ranks down; safe to call twice."""
        for part in (self.param_sync, self._ranks):
            if part is not None:
                try:
                    part.shutdown()
                except Exception:  # closing must go on for the rest
                    logger.exception("shutting down %s failed", type(part).__name__)
        self.param_sync = self._ranks = None
