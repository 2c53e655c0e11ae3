"""``SeparateRayPPOTrainer``: the small base every trainer-side recipe shares.

    SeparateRayPPOTrainer          inputs checked, worker groups, the PPO step pieces
      |- SyncTrainer               recipe/sync_trainer.py (colocated baseline)
      |- OneStepOffTrainer         one_step_off/
      '- FullyAsyncTrainer         fully_async_policy/  (trainer side only)

The rollout side of fully async (``FullyAsyncRollouter``) is no subclass: it composes the
pieces both sides use, ``RunInputs`` (recipe/run/inputs.py) and ``Placement``
(recipe/run/placement.py), with its own engines' supervisor, cursor and admission.

It owns what the recipes share and nothing recipe-specific: bad input (model path, data,
reward functions, prompt lengths) is rejected in ``__init__`` before Ray starts; worker groups
are built on demand by the subclass that needs them (``_start_ranks`` /
``_start_engines``; Ray starts with the first); the PPO step is split into named pieces
(``_compute_old_log_prob``, ``_compute_advantages``, ``_update_actor``, ``_fit_update_weights``)
that a loop calls in order; validation is shared. Subclasses call ``super().__init__``.

What a run writes (metrics, trace, ledger, checkpoints) is a ``TrainingRun``
(recipe/run/training_run.py) opened in ``__init__``. The weights version has one owner, the
recipe's ``version``: pushes are told it and return the next, checkpoints store it. The trainer
ranks and a batch recipe's engines are ``ranks`` and ``rollout`` once built.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.agent.metrics import check_env_errors
from recipe.algo.advantages import compute_advantages, share_episode_advantages
from recipe.config import RecipeConfig
from recipe.observability.trace import traced
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import PromptRecord, Trajectory
from recipe.run.checkpointing import EXPORT_DIR, exported_weights
from recipe.run.inputs import RunInputs
from recipe.run.metrics import val_metrics, val_sampling
from recipe.run.placement import Placement, init_ray
from recipe.run.training_run import TraceSource, TrainingRun
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.correction import correct_batch

if TYPE_CHECKING:
    from recipe.checkpoint_engine.engines import ServingEngines
    from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer
    from recipe.workers.rollout.replicas import RolloutReplicas
    from recipe.workers.trainer.ranks import TrainerRanks

logger = logging.getLogger(__name__)


class SeparateRayPPOTrainer:
    """Shared base of the recipes. See the module docstring for what lives here."""

    def __init__(
        self, cfg: RecipeConfig, run_dir: Path, *, inputs: RunInputs | None = None
    ) -> None:
        """``inputs``: checked already (a unit test's own); else loaded from ``cfg``."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Input checks come first: each raises a ValueError naming the key, file or row.
        inputs = inputs or RunInputs.load(cfg)
        self.train_records, self.val_records = inputs.train_records, inputs.val_records
        self.reward_fn, self.prompt_ids = inputs.reward_fn, inputs.prompt_ids
        assert inputs.model is not None
        self.model = inputs.model
        self.placement = Placement(cfg, self.run_dir)
        self.device = self.placement.device
        self.version = 0
        """Weights version the engines serve: the one owner of it (+1 per push)."""
        self.global_step = 0
        """Trainer steps done."""
        self.run = TrainingRun(cfg, self.run_dir, train=self.train_records, val=self.val_records)
        """What this run writes: metrics, trace, ledger, checkpoints (a resume rewinds the run
        directory first; the recipe then loads the checkpoint's step and version)."""
        self.tracer = self.run.tracer
        """This process's trace events (observability/trace.py)."""
        self.param_sync: ParameterSynchronizer | None = None
        """The ParameterSynchronizer, built at the first push (it needs both sides)."""
        self._ranks: TrainerRanks | None = None
        """The trainer ranks (``_start_ranks``; ``ranks`` once built)."""
        self._rollout: RolloutReplicas | None = None
        """The engines of a batch recipe (``_start_engines``; ``rollout`` once built)."""

    @property
    def ranks(self) -> TrainerRanks:
        """The trainer ranks; an error before ``_start_ranks``."""
        if self._ranks is None:
            raise RuntimeError(f"{type(self).__name__}: the trainer ranks are not built")
        return self._ranks

    @property
    def rollout(self) -> RolloutReplicas:
        """The batch recipe's engines; an error before ``_start_engines``."""
        if self._rollout is None:
            raise RuntimeError(f"{type(self).__name__}: the rollout engines are not built")
        return self._rollout

    # ---- construction -------------------------------------------------------------------

    def _plan_batch_steps(self) -> int:
        """Trainer steps of a batch recipe (sync, one_step_off), logged at startup."""
        cfg = self.cfg
        steps = cfg.num_trainer_steps(len(self.train_records))
        logger.info(
            "mode=%s: %d trainer steps x %d prompts x %d responses",
            cfg.mode,
            steps,
            cfg.prompts_per_step,
            cfg.rollout.n,
        )
        return steps

    def _start_ranks(self, *, total_optimizer_steps: int, wait: bool = True) -> TrainerRanks:
        """Start the trainer ranks; ``wait`` False returns while they load the model (the
        engines start meanwhile), and the caller then calls ``ranks.wait_ready()``."""
        from recipe.workers.trainer.ranks import TrainerRanks
        from recipe.workers.trainer.spec import TrainerSpec

        init_ray(self.cfg.ray)
        spec = TrainerSpec(
            model_path=str(self.model.path),
            total_optimizer_steps=total_optimizer_steps,
            policy_loss=self.cfg.algorithm.policy_loss,
            response_length=self.cfg.rollout.response_length,
            compute_dtype=self.cfg.model.dtype,
            seed=self.cfg.trainer.seed,
        )
        self._ranks = TrainerRanks(
            self.cfg.actor,
            spec,
            use_gpu=self.device == "cuda",
            gpu_fraction=self.placement.trainer_gpu_fraction,
            placement_group=self.placement.take("trainer"),
            owns_placement_group=not self.placement.one_group,
            wait=wait,
        )
        return self.ranks

    def _start_ranks_and_engines(self, *, total_optimizer_steps: int) -> None:
        """The trainer ranks and the engines of a batch recipe; the ranks load the model
        while the engines start."""
        group = self._start_ranks(total_optimizer_steps=total_optimizer_steps, wait=False)
        try:
            self._start_engines()
        except BaseException:
            group.shutdown(graceful=False)
            raise
        group.wait_ready()

    def _start_engines(self) -> RolloutReplicas:
        self._rollout = self.placement.start_engines(self.model)
        return self._rollout

    # ---- the PPO step pieces ------------------------------------------------------------

    def _score(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """Fill ``reward`` of each trajectory of one prompt group (in place)."""
        self.reward_fn.score_group(record, trajs)

    def _generate_scored(self, records: list[PromptRecord]) -> list[list[Trajectory]]:
        """The groups of ``records`` on the served version, scored (the batch recipes)."""
        rollout = self.cfg.rollout
        groups = self.rollout.generate(
            records,
            [self.prompt_ids[r.uid] for r in records],
            version=self.version,
            n=rollout.n,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
        )
        for record, trajs in zip(records, groups, strict=True):
            self._score(record, trajs)
        return groups

    def _make_batch(self, groups: list[list[Trajectory]]) -> TrainBatch:
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
    def _compute_old_log_prob(
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
    def _compute_advantages(self, batch: TrainBatch) -> TrainBatch:
        """Group advantages over episodes (one counted row each), then shared by every row of
        an episode: the earlier segments of one are trained with its advantage."""
        adv_b = compute_advantages(
            batch.rewards_b, batch.group_index_b, self.cfg.algorithm, batch.counted_b
        )
        adv_b = share_episode_advantages(adv_b, batch.episode_b, batch.counted_b)
        return batch.with_advantages(adv_b)

    @traced("update")
    def _update_actor(self, batch: TrainBatch, metrics: MetricsAccumulator) -> None:
        with metrics.timer("timing/update_s"):
            actor_metrics = self.ranks.update_actor(batch)
        for key, value in actor_metrics.items():
            metrics.add(key, value, reduce="last")

    @traced("weight_push")
    def _fit_update_weights(self, metrics: MetricsAccumulator) -> None:
        """Push the trainer's weights to every rollout engine through the checkpoint engine
        (``checkpoint_engine.*``: bucketed, verified, retried by its failure policy; the
        engines' owner pauses and resumes them, ``_serving_engines``); ``version`` goes up
        by one."""
        if self.param_sync is None:
            from recipe.checkpoint_engine.synchronizer import ParameterSynchronizer

            self.param_sync = ParameterSynchronizer(
                self.ranks,
                self._serving_engines(),
                self.cfg.checkpoint_engine,
                file_root=self.run_dir / EXPORT_DIR,  # backend=file: read on every node
                adapter_only=self.cfg.actor.lora.enabled,  # LoRA: push the adapter alone
            )
            self.param_sync.tracer = self.tracer  # its phases nest in this "weight_push"
        pushed = self.param_sync.push(self.version, timer=metrics.timer)
        for key, value in pushed.metrics.items():
            metrics.add(key, value, reduce="last")
        self.version = pushed.version

    def _serving_engines(self) -> ServingEngines:
        """The rollout side of a push: the batch recipes own the rollout group in this
        process, idle between batches, and pause it for the push directly."""
        from recipe.checkpoint_engine.engines import DirectEngines

        group = self._rollout
        assert group is not None, "build the rollout group before the first push"
        return DirectEngines(lambda: group.workers, self.cfg.checkpoint_engine.timeout_s)

    @property
    def sync_summary(self) -> dict[str, str]:
        """``sync/backend``: the transport the weight pushes took (summary.json; each step
        that pushed also has ``sync/backend/<name>`` = 1 in metrics.jsonl)."""
        backend = self.param_sync.backend if self.param_sync is not None else None
        return {} if backend is None else {"sync/backend": backend}

    @property
    def fault_counts(self) -> dict[str, int]:
        """Faults the run recovered from (``faults/*``, in metrics.jsonl and summary.json)."""
        retries = self.param_sync.num_retries if self.param_sync is not None else 0
        return {"faults/sync_retries": retries}

    def _load_checkpoint(self) -> dict[str, Any]:
        """Resume: the checkpoint's weights, optimizer, schedule and RNG into the trainer
        group and this process; its step and version become this recipe's. Returns its
        ``trainer_state.json`` (the recipe's loop state among it)."""
        state = self.run.checkpointer.load(self.ranks)
        self.global_step, self.version = state["global_step"], state["param_version"]
        return state

    def _restore_engines(self) -> None:
        """Make the engines serve the resumed weights as ``version`` (they start from
        ``model.path`` at version 0): the trainer exports them once, every replica loads
        them."""
        assert self.version > 0, "checkpoints are taken after a push"
        tag = f"resume-v{self.version}"
        with exported_weights(self.ranks, self.run_dir, tag) as weights:
            self.rollout.update_weights_from_file(weights, self.version)
        logger.info("engines serve the resumed version %d", self.version)

    # ---- validation ---------------------------------------------------------------------

    @traced("validate")
    def _validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_temperature``) answers to the val set, scored."""
        if not self.val_records:
            return {}
        start = time.perf_counter()
        groups = self.rollout.generate(
            self.val_records,
            [self.prompt_ids[r.uid] for r in self.val_records],
            **val_sampling(self.version, self.cfg.rollout.val_temperature),
        )
        for record, trajs in zip(self.val_records, groups, strict=True):
            self._score(record, trajs)
        return val_metrics(groups, start, self.cfg.rollout.response_length)

    # ---- the end -----------------------------------------------------------------------

    def _trace_sources(self, *, final: bool = False) -> list[TraceSource]:
        """Callables returning the events buffered by other processes (the engines);
        ``final``: the last pull, at close, which must not leave any behind."""
        return [self.rollout.drain_trace] if self._rollout is not None else []

    def close(self, *, release_placement: bool = True) -> None:
        """Close the run's records, then shut the workers down; safe to call twice.
        ``release_placement`` False keeps the placement's own groups (``Placement.release``)
        for a caller whose workers in them are still up (fully_async's rollouter)."""
        # Before the engines go: their last events are pulled.
        self.run.close(self._trace_sources(final=True))
        for group in (self.param_sync, self._rollout, self._ranks):
            if group is not None:
                try:
                    group.shutdown()
                except Exception:  # closing must go on for the rest
                    logger.exception("shutting down %s failed", type(group).__name__)
        self.param_sync = self._rollout = self._ranks = None
        if release_placement:
            self.placement.release()
