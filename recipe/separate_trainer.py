"""``SeparateRayPPOTrainer``: the small base every recipe shares.

    SeparateRayPPOTrainer          inputs checked, Ray, tracking, the PPO step pieces
      |- SyncTrainer               recipe/sync_trainer.py (colocated baseline)
      |- OneStepOffTrainer         one_step_off/
      |- FullyAsyncTrainer         fully_async_policy/  (trainer side only)
      '- FullyAsyncRollouter       fully_async_policy/  (rollout side only)

It owns what the recipes share and nothing recipe-specific: bad input (model path, data,
reward functions, prompt lengths) is rejected in ``__init__`` before Ray starts; worker groups
are built on demand by the subclass that needs them (``_build_trainer_group`` /
``_build_rollout_group``); the PPO step is split into named pieces (``_compute_old_log_prob``,
``_compute_advantages``, ``_update_actor``, ``_fit_update_weights``) that a loop calls in
order; validation and metric tracking are shared. Subclasses call ``super().__init__``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import torch

from recipe.algo.advantages import compute_advantages
from recipe.checkpoint.ledger import LEDGER_FILE, StepLedger
from recipe.checkpoint.rng import capture_rng, restore_rng
from recipe.checkpoint.store import (
    RUN_STATE_DIR,
    STATE_FILE,
    read_state,
    resolve_resume,
    set_aside_newer,
    truncate_jsonl,
    write_checkpoint,
    write_json,
)
from recipe.config import RecipeConfig
from recipe.data.dataset import build_datasets
from recipe.data.prompts import encode_prompts
from recipe.model import HFModelConfig
from recipe.observability.backends import METRICS_FILE
from recipe.observability.trace import ROLLOUTER_PID, RunTrace, Tracer, traced
from recipe.observability.tracking import MetricsAccumulator, Tracker
from recipe.protocol import PromptRecord, Trajectory
from recipe.reward import RewardFunction
from recipe.run.metrics import clip_warning, response_clip_ratio
from recipe.workers.batch import TrainBatch

logger = logging.getLogger(__name__)

ENGINE_LOG_DIR = "engines"
"""Run-directory folder of the engines' own output (recipe/workers/rollout/engine_log.py)."""


class SeparateRayPPOTrainer:
    """Shared base of the recipes. See the module docstring for what lives here."""

    owns_tracker: ClassVar[bool] = True
    """Whether this side writes the run's metrics (one Tracker per run: the rollouter of the
    fully async recipe runs beside the trainer and leaves it to the trainer)."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Input checks come first: each raises a ValueError naming the key, file or row.
        self.train_records, self.val_records = build_datasets(cfg.data)
        self.reward_fn = RewardFunction(cfg.reward)
        self.reward_fn.check_data_sources(
            {r.data_source for r in self.train_records + self.val_records}
        )
        # Last: reading the model's config imports much of transformers (seconds).
        self.model = HFModelConfig.from_config(cfg.model)
        self.prompt_ids = self._encode_all(self.train_records + self.val_records)
        self.version = 0
        """Weights version served by the rollout engines; +1 per push."""
        self.global_step = 0
        """Trainer steps done."""
        self.fault_counts: dict[str, int] = {"faults/sync_retries": 0}
        """Faults the run recovered from (``faults/*``, in metrics.jsonl and summary.json)."""
        self.initial_val: dict[str, float] = {}
        """Validation of the initial weights (kept in checkpoints for the summary)."""
        self.resume_from: Path | None = None
        """The checkpoint this run resumes from (``trainer.resume_mode``), or None."""
        self.resume_state: dict[str, Any] = {}
        """Its ``trainer_state.json`` (empty when not resuming)."""
        self.step_ledger: StepLedger | None = None
        """``ledger.jsonl``: the prompts each trainer step trained (the side owning metrics)."""
        if self.owns_tracker:
            # Before the Tracker opens metrics.jsonl: a resume first drops what came after
            # the checkpoint.
            self._prepare_resume()
            self.step_ledger = StepLedger(self.run_dir)
        self.device = _resolve_device(cfg.trainer.device)
        self.tracker: Tracker | None = (
            Tracker(cfg.logger, self.run_dir, run_config=asdict(cfg)) if self.owns_tracker else None
        )
        self.run_trace = RunTrace(self.run_dir, mode=cfg.mode) if self.owns_tracker else None
        """``trace.json`` of the run, owned by the side that owns the tracker."""
        self.tracer = (
            self.run_trace.tracer
            if self.run_trace is not None
            else Tracer(ROLLOUTER_PID, "rollouter", sort_index=ROLLOUTER_PID)
        )
        """This process's trace events (observability/trace.py); the trainer pulls the
        rollouter's."""
        self.param_sync: Any = None
        """The ParameterSynchronizer, built at the first push (it needs both groups)."""
        self.trainer_group: Any = None
        self.rollout_group: Any = None
        self._init_ray()

    # ---- construction -------------------------------------------------------------------

    def _encode_all(self, records: list[PromptRecord]) -> dict[str, list[int]]:
        ids = encode_prompts(
            self.model.tokenizer, records, max_prompt_length=self.cfg.data.max_prompt_length
        )
        return {r.uid: p for r, p in zip(records, ids, strict=True)}

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        ray_cfg = self.cfg.ray
        ray.init(
            address=ray_cfg.address,
            num_cpus=ray_cfg.num_cpus if ray_cfg.address is None else None,
            include_dashboard=ray_cfg.include_dashboard,
            log_to_driver=True,
            runtime_env={"env_vars": _worker_env()},
        )

    @property
    def colocated(self) -> bool:
        """Trainer ranks and engines share GPUs (the sync baseline); else separate GPUs."""
        return self.cfg.mode == "sync"

    @property
    def shares_gpus(self) -> bool:
        """Trainer ranks and engines are placed on the same GPUs: the colocated baseline, or a
        separate-resource mode on a cluster with fewer GPUs than trainer ranks + engine GPUs
        (e.g. one GPU: both run on it, split by ``rollout.gpu_memory_utilization``)."""
        if self.colocated:
            return True
        if self.device != "cuda":
            return False
        import ray

        cfg = self.cfg
        engine_gpus = cfg.rollout.replicas * cfg.rollout.tensor_parallel_size
        have = int(ray.cluster_resources().get("GPU", 0))
        if have >= cfg.actor.world_size + engine_gpus:
            return False
        if engine_gpus > have or cfg.actor.world_size > have:
            raise ValueError(
                f"mode={cfg.mode} needs actor.world_size={cfg.actor.world_size} trainer GPUs and "
                f"rollout replicas x tensor_parallel_size={engine_gpus} engine GPUs; the Ray "
                f"cluster has {have} GPUs: too few even to share them"
            )
        logger.warning(
            "mode=%s: %d GPUs for %d trainer ranks + %d engine GPUs: trainer and engines share "
            "GPUs (engines take rollout.gpu_memory_utilization=%.2f of each)",
            cfg.mode,
            have,
            cfg.actor.world_size,
            engine_gpus,
            cfg.rollout.gpu_memory_utilization,
        )
        return True

    def _trainer_gpu_fraction(self) -> float:
        # Ray fractions only schedule; the engine's real memory cap is gpu_memory_utilization.
        return 1.0 - self.cfg.rollout.gpu_memory_utilization if self.shares_gpus else 1.0

    def _build_trainer_group(self, *, total_optimizer_steps: int) -> Any:
        from recipe.workers.trainer import TrainerSpec
        from recipe.workers.trainer_group import TrainerGroup

        spec = TrainerSpec(
            model_path=str(self.model.path),
            total_optimizer_steps=total_optimizer_steps,
            rollout_correction=self.cfg.algorithm.rollout_correction,
            compute_dtype=self.cfg.model.dtype,
            seed=self.cfg.trainer.seed,
        )
        self.trainer_group = TrainerGroup(
            self.cfg.actor,
            spec,
            use_gpu=self.device == "cuda",
            gpu_fraction=self._trainer_gpu_fraction(),
        )
        return self.trainer_group

    def _build_rollout_group(self) -> Any:
        from recipe.workers.rollout_group import RolloutGroup

        self.rollout_group = RolloutGroup(
            self.model,
            self.cfg.rollout,
            device=self.device,
            gpu_fraction=self.cfg.rollout.gpu_memory_utilization if self.shares_gpus else 1.0,
            log_dir=self.run_dir / ENGINE_LOG_DIR,
        )
        return self.rollout_group

    # ---- the PPO step pieces ------------------------------------------------------------

    def _score(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """Fill ``reward`` of each trajectory of one prompt group (in place)."""
        self.reward_fn.score_group(record, trajs)

    def _make_batch(self, groups: list[list[Trajectory]]) -> TrainBatch:
        trajs = [t for group in groups for t in group]
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
            logprobs_bt, _entropy_bt = self.trainer_group.compute_log_prob(batch, slot=slot)
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
        if self.cfg.algorithm.rollout_correction.bypass_mode:
            return batch
        batch.old_logprobs_bt = logprobs_bt
        return batch

    @traced("advantages")
    def _compute_advantages(self, batch: TrainBatch) -> TrainBatch:
        adv_b = compute_advantages(batch.rewards_b, batch.group_index_b, self.cfg.algorithm)
        return batch.with_advantages(adv_b)

    @traced("update")
    def _update_actor(self, batch: TrainBatch, metrics: MetricsAccumulator) -> None:
        with metrics.timer("timing/update_s"):
            actor_metrics = self.trainer_group.update_actor(batch)
        for key, value in actor_metrics.items():
            metrics.add(key, value, reduce="last")

    @traced("weight_push")
    def _fit_update_weights(self, metrics: MetricsAccumulator) -> None:
        """Push the trainer's weights to every rollout engine through the checkpoint engine
        (``checkpoint_engine.*``: paused, bucketed, verified); the version goes up by one.

        On failure the engines stay paused on the old version (never half-updated) and
        ``checkpoint_engine.on_failure`` decides: ``stop`` raises the ``WeightSyncError``
        (it names the phase and the peer); ``retry`` rebuilds the transport and pushes again,
        at most ``max_retries`` times. A dead trainer rank is never retried; a push cut by a
        rollout worker that ``_recover_from_sync_failure`` replaced is retried uncounted.
        """
        from recipe.checkpoint_engine import WeightSyncError

        if self.param_sync is None:
            from recipe.checkpoint_engine import ParameterSynchronizer

            self.param_sync = ParameterSynchronizer(
                self.trainer_group, self.rollout_group, self.cfg.checkpoint_engine
            )
            self.param_sync.tracer = self.tracer  # its phases nest in this "weight_push"
        policy = self.cfg.checkpoint_engine
        retries_left = policy.max_retries if policy.on_failure == "retry" else 0
        while True:
            try:
                pushed = self.param_sync.sync_weights(timer=metrics.timer)
                break
            except WeightSyncError as exc:
                self.trainer_group.check_alive()  # a dead rank: TrainerWorkerError, no retry
                if self._recover_from_sync_failure(exc):
                    logger.warning("weight push failed (%s); pushing again to the new worker", exc)
                elif retries_left > 0:
                    retries_left -= 1
                    self.fault_counts["faults/sync_retries"] += 1
                    logger.warning("weight push failed (%s); retrying, %d left", exc, retries_left)
                else:
                    raise
                self.param_sync.reset_transport()
        for key, value in pushed.items():
            metrics.add(key, value, reduce="last")
        self.version = self.param_sync.version

    def _recover_from_sync_failure(self, exc: Exception) -> bool:
        """Repair what made a push fail, if a recipe can (True: push again, uncounted)."""
        return False

    # ---- checkpoint IO ------------------------------------------------------------------

    @traced("checkpoint")
    def _save_checkpoint(
        self, state: dict[str, Any], *, extra: Callable[[Path], None] | None = None
    ) -> Path:
        """``checkpoints/step_N/``, written atomically (recipe/checkpoint/store.py): the
        HF-format policy, optimizer + LR schedule + RNG of every trainer rank, and
        ``trainer_state.json`` (step, version, driver RNG, initial validation and the
        recipe's loop ``state``). ``extra(run_state_dir)`` adds a recipe's own files."""
        start = time.perf_counter()

        def fill(partial: Path) -> None:
            self.trainer_group.save_hf(partial)
            self.trainer_group.save_train_state(partial / RUN_STATE_DIR)
            if extra is not None:
                extra(partial / RUN_STATE_DIR)
            meta = {
                "format": 1,
                "mode": self.cfg.mode,
                "global_step": self.global_step,
                "param_version": self.version,
                "num_train_prompts": len(self.train_records),
                "initial_val": self.initial_val,
                "rng": capture_rng(),
                **state,
            }
            write_json(partial / STATE_FILE, meta)

        final = write_checkpoint(
            self.run_dir,
            self.global_step,
            self.version,
            fill,
            keep=self.cfg.trainer.max_ckpt_to_keep,
        )
        logger.info(
            "checkpoint of step %d took %.2f s", self.global_step, time.perf_counter() - start
        )
        return final

    def _should_save(self, *, last: bool = False) -> bool:
        """Every ``trainer.save_freq`` weight versions (= trainer steps in the batch recipes,
        which push once per step), and after the last step; called right after a push."""
        freq = self.cfg.trainer.save_freq
        return freq > 0 and (self.version % freq == 0 or last)

    def _prepare_resume(self) -> None:
        """Resolve ``trainer.resume_mode``, check the checkpoint fits this run, and rewind
        the run directory to it: ``metrics.jsonl`` and ``ledger.jsonl`` lose the steps after
        it, newer checkpoints are set aside. Raises ValueError (startup) on a mismatch."""
        path = resolve_resume(self.cfg.trainer.resume_mode, self.run_dir)
        if path is None:
            if self.cfg.trainer.resume_mode == "auto":
                logger.info(
                    "trainer.resume_mode=auto: no checkpoint in %s, starting fresh", self.run_dir
                )
            # A fresh start never appends to the logs of an earlier attempt in this directory
            # (e.g. one killed before its first checkpoint): they are kept as <name>.prev.
            for name in (METRICS_FILE, LEDGER_FILE):
                log = self.run_dir / name
                if log.is_file() and log.stat().st_size > 0:
                    log.replace(log.with_name(f"{name}.prev"))
                    logger.warning("starting fresh: the earlier %s is now %s.prev", name, name)
            return
        state = read_state(path)
        expected = {"mode": self.cfg.mode, "num_train_prompts": len(self.train_records)}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"trainer.resume_mode={str(path)!r}: the checkpoint has {key}="
                    f"{state.get(key)!r}, this run {value!r}"
                )
        step = state["global_step"]
        truncate_jsonl(self.run_dir / METRICS_FILE, step)
        truncate_jsonl(self.run_dir / LEDGER_FILE, step)
        set_aside_newer(self.run_dir, step)
        self.resume_from, self.resume_state = path, state
        logger.info("resuming from %s (step %d, version %d)", path, step, state["param_version"])

    def _load_checkpoint(self) -> dict[str, Any]:
        """Load ``resume_from`` into the trainer group (weights, optimizer, schedule, RNG)
        and this process (step, version, RNG); returns the recipe's saved loop state."""
        assert self.resume_from is not None and self.trainer_group is not None
        start = time.perf_counter()
        state = self.resume_state
        self.trainer_group.load_hf(self.resume_from)
        self.trainer_group.load_train_state(self.resume_from / RUN_STATE_DIR)
        self.global_step, self.version = state["global_step"], state["param_version"]
        self.initial_val = state.get("initial_val") or {}
        restore_rng(state["rng"])
        logger.info("trainer state loaded in %.2f s", time.perf_counter() - start)
        return state

    def _restore_engines(self) -> None:
        """Make the engines serve the resumed weights as ``self.version`` (they start from
        ``model.path`` at version 0): the trainer exports its weights once, every replica
        loads them."""
        from recipe.checkpoint_engine.host import shm_dir

        assert self.version > 0, "checkpoints are taken after a push"
        start = time.perf_counter()
        path = Path(shm_dir()) / f"resume-{os.getpid()}-v{self.version}.safetensors"
        try:
            self.trainer_group.export_weights(str(path))
            self.rollout_group.update_weights_from_file(str(path), self.version)
        finally:
            path.unlink(missing_ok=True)
        took_s = time.perf_counter() - start
        logger.info("engines serve the resumed version %d (%.2f s)", self.version, took_s)

    def _record_trained(self, prompt_uids: list[str]) -> None:
        """One ``ledger.jsonl`` line: the prompts trained at ``global_step``."""
        assert self.step_ledger is not None
        self.step_ledger.append(self.global_step, self.version, prompt_uids)

    # ---- step-loop helpers of the batch recipes (sync, one_step_off) ----------------------

    def _plan_steps(self) -> int:
        """Trainer steps of a run: the prompts to train on over ``prompts_per_step``."""
        cfg = self.cfg
        total_prompts = cfg.rollout.total_rollout_steps or cfg.trainer.total_epochs * len(
            self.train_records
        )
        steps = total_prompts // cfg.prompts_per_step
        if cfg.trainer.total_training_steps is not None:
            steps = min(steps, cfg.trainer.total_training_steps)
        if steps < 1:
            raise ValueError(
                f"rollout.total_rollout_steps={total_prompts} prompts is less than one trainer "
                f"step ({cfg.prompts_per_step} prompts)"
            )
        logger.info(
            "mode=%s: %d trainer steps x %d prompts x %d responses",
            cfg.mode,
            steps,
            cfg.prompts_per_step,
            cfg.rollout.n,
        )
        return steps

    def _should_validate(self) -> bool:
        freq = self.cfg.trainer.test_freq
        return freq > 0 and self.version % freq == 0

    def _validated_last(self) -> bool:
        """The last step of this process validated (so the final validation is done)."""
        resumed_at = self.resume_state.get("global_step", 0)
        return self._should_validate() and self.global_step > resumed_at

    def _initial_validation(self) -> dict[str, float]:
        """Validate the initial weights (``trainer.val_before_train``), logged as step 0; a
        resumed run keeps the result its checkpoint holds."""
        if self.resume_from is None and self.cfg.trainer.val_before_train:
            self.initial_val = self._validate()
            self.tracker.log({**self.initial_val, "trainer/param_version": self.version}, step=0)
        return self.initial_val

    def _out_of_time(self, start: float) -> bool:
        budget = self.cfg.trainer.max_wall_s
        return budget is not None and time.perf_counter() - start > budget

    # ---- validation ---------------------------------------------------------------------

    @traced("validate")
    def _validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_temperature``) answers to the val set, scored."""
        if not self.val_records:
            return {}
        start = time.perf_counter()
        groups = self.rollout_group.generate(
            self.val_records,
            [self.prompt_ids[r.uid] for r in self.val_records],
            n=1,
            temperature=self.cfg.rollout.val_temperature,
            top_p=1.0,
            top_k=-1,
            training=False,
        )
        scores, lengths = [], []
        for record, trajs in zip(self.val_records, groups, strict=True):
            self._score(record, trajs)
            scores += [t.reward for t in trajs]
            lengths += [t.num_response_tokens for t in trajs]
        clipped = response_clip_ratio([t for g in groups for t in g])
        if (warning := clip_warning(clipped, self.cfg.rollout.response_length)) is not None:
            logger.warning(warning)
        return {
            "val/accuracy": sum(s >= 1.0 for s in scores) / len(scores),
            "val/reward_mean": sum(scores) / len(scores),
            "val/response_length_mean": sum(lengths) / len(lengths),
            "response/clip_ratio": clipped,
            "timing/val_s": time.perf_counter() - start,
        }

    # ---- lifecycle ----------------------------------------------------------------------

    # ---- trace -------------------------------------------------------------------------

    def _trace_sources(self) -> list[Any]:
        """Callables returning the events buffered by other processes (the engines)."""
        return [self.rollout_group.drain_trace] if self.rollout_group is not None else []

    def _trace_step(self, metrics: dict[str, float]) -> list[dict[str, Any]]:
        """The step's slice into the trace, then everything buffered into ``trace.json``;
        returns the events moved (the engines' generation slices among them)."""
        assert self.run_trace is not None, "only the side that owns the tracker traces steps"
        self.run_trace.step(self.global_step, self.version, metrics)
        return self.run_trace.pull(self._trace_sources())

    def close(self) -> None:
        """Shut workers down and close the tracker; safe to call twice."""
        if self.run_trace is not None:
            try:  # before the engines go: their last events are pulled from them
                self.run_trace.close(self._trace_sources())
            except Exception:
                logger.exception("closing trace.json failed")
        for group in (self.param_sync, self.rollout_group, self.trainer_group):
            if group is not None:
                try:
                    group.shutdown()
                except Exception:  # closing must go on for the rest
                    logger.exception("shutting down %s failed", type(group).__name__)
        self.param_sync = self.rollout_group = self.trainer_group = None
        if self.tracker is not None:
            self.tracker.close()


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device='cuda' but no CUDA device is visible")
    return device


def _worker_env() -> dict[str, str]:
    """Environment every Ray worker inherits (the tiny-model cache, quiet vLLM/W&B)."""
    keys = ("RECIPE_CACHE_DIR", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "VLLM_LOGGING_LEVEL")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM logs every pause/reload at INFO; a sync per step would drown the run's own output.
    env.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
