"""The root config schema of ``python -m recipe`` and its Hydra registration.

The tree is shallow and keeps verl's names for the knobs users already know:

    mode             sync | one_step_off | fully_async
    model            recipe/model.py            ModelConfig
    data             recipe/data/config.py      DataConfig
    reward           recipe/reward/config.py    RewardConfig
    actor, rollout   recipe/workers/config.py   ActorConfig, RolloutConfig
    algorithm        recipe/algo/config.py      AlgorithmConfig
    async_training   here                       AsyncTrainingConfig
    checkpoint_engine recipe/checkpoint_engine/config.py
    trainer, ray     here
    logger           recipe/observability/config.py           LoggerConfig

Each component receives only its own sub-config. ``load_config`` turns a composed DictConfig
into these dataclasses, which runs every ``__post_init__`` validation, then the cross-section
checks below: a bad value fails before Ray starts, with one line naming the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from recipe.algo.config import AlgorithmConfig
from recipe.checkpoint.store import check_checkpoint_path
from recipe.checkpoint_engine.config import CheckpointEngineConfig
from recipe.data.config import DataConfig
from recipe.model import ModelConfig
from recipe.observability.config import LoggerConfig
from recipe.reward.config import RewardConfig
from recipe.utils.config_check import (
    ConfigError,
    require,
    require_choice,
    require_non_negative,
    require_positive,
    warn_unused,
)
from recipe.workers.cluster import STRATEGIES
from recipe.workers.config import ActorConfig, RolloutConfig

logger = logging.getLogger(__name__)

MODES = ("sync", "one_step_off", "fully_async")
RESUME_MODES = ("auto", "disable")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class AsyncTrainingConfig:
    staleness_threshold: float = 0.5
    """Extra prompts admitted per version window, as a fraction of one window's demand."""
    trigger_parameter_sync_step: int = 1
    """Local trainer steps between weight pushes (T)."""
    require_batches: int = 1
    """Mini-batches the trainer takes per local step (R = ppo_mini_batch_size * this)."""
    partial_rollout: bool = True
    """Pause in-flight requests at a sync and resume them on the new weights (else they
    finish on the old weights before the sync)."""
    max_staleness: int | None = None
    """Hard bound in versions: an older trajectory's prompt is re-admitted, not dropped."""

    def __post_init__(self) -> None:
        require_non_negative("async_training.staleness_threshold", self.staleness_threshold)
        require_positive(
            "async_training.trigger_parameter_sync_step", self.trigger_parameter_sync_step
        )
        require_positive("async_training.require_batches", self.require_batches)
        if self.max_staleness is not None:
            require_non_negative("async_training.max_staleness", self.max_staleness)


@dataclass
class TrainerConfig:
    total_epochs: int = 1
    """Passes over the train set when rollout.total_rollout_steps is not set."""
    total_training_steps: int | None = None
    """Stop after this many trainer steps (overrides the epoch count when smaller)."""
    test_freq: int = 10
    """Validate every N weight versions (0: only before and after training, as
    ``val_before_train`` and ``val_after_train`` say)."""
    val_before_train: bool = True
    """Validate the initial weights."""
    val_after_train: bool = True
    """Validate the final weights when the last step did not (false: a run whose accuracy is
    measured elsewhere, e.g. a study's snapshots, or a segment of one that a resume goes on)."""
    save_freq: int = 0
    """Checkpoint the whole run state to ``checkpoints/step_N/`` every N weight versions and
    after the last step (0: never). A version is one trainer step in sync and one_step_off,
    T = trigger_parameter_sync_step steps in fully_async (taken right after the push)."""
    max_ckpt_to_keep: int | None = 2
    """Keep only the newest N complete checkpoints (None: keep all)."""
    resume_mode: str = "auto"
    """``auto``: resume from the newest complete checkpoint of the run directory (relaunch
    with ``hydra.run.dir=<that run>``), start fresh when there is none; ``disable``: start
    fresh; or the path of a ``checkpoints/step_N`` directory."""
    seed: int = 0
    """Seed of the trainer (init, dropout, data order fallback)."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""
    max_wall_s: float | None = None
    """Stop cleanly after this many seconds of training (a budget for CI and benchmarks)."""
    snapshot_samples: int = 0
    """Export the policy's weights to ``snapshots/`` each time the trained samples reach a
    multiple of this, with the training clock at that point, to evaluate after the run, off
    the clock (``python -m recipe.tools.study``; recipe/run/snapshots.py). 0: never."""

    def __post_init__(self) -> None:
        require_positive("trainer.total_epochs", self.total_epochs)
        if self.total_training_steps is not None:
            require_positive("trainer.total_training_steps", self.total_training_steps)
        require_non_negative("trainer.test_freq", self.test_freq)
        require_non_negative("trainer.save_freq", self.save_freq)
        if self.max_ckpt_to_keep is not None:
            require_positive("trainer.max_ckpt_to_keep", self.max_ckpt_to_keep)
        if self.resume_mode not in RESUME_MODES:
            check_checkpoint_path("trainer.resume_mode", self.resume_mode)
        require_choice("trainer.device", self.device, DEVICES)
        if self.max_wall_s is not None:
            require_positive("trainer.max_wall_s", self.max_wall_s)
        require_non_negative("trainer.snapshot_samples", self.snapshot_samples)


@dataclass
class RayConfig:
    address: str | None = None
    """None: start a local Ray of the run's own (in a Ray job: the job's cluster); ``auto``
    or ``host:port``: join a running cluster."""
    num_cpus: int | None = None
    """CPUs of a local Ray (None: all)."""
    include_dashboard: bool = False
    """Start Ray's dashboard with a local Ray."""
    placement_timeout_s: float = 300.0
    """How long each role's placement group may wait for the cluster to hold it (and a
    restarted engine for its bundle) before the run stops naming the role and what is
    missing."""
    trainer_strategy: str = "PACK"
    """Ray placement strategy of the trainer ranks' bundles (PACK, SPREAD, STRICT_PACK,
    STRICT_SPREAD)."""
    rollout_strategy: str = "PACK"
    """Ray placement strategy of the engine replicas' bundles."""
    trainer_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each trainer rank's bundle asks for besides CPU/GPU (pins the
    trainer to nodes started with them: ``ray start --resources='{"trainer_host": 1}'``)."""
    rollout_resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each engine replica's bundle asks for."""

    def __post_init__(self) -> None:
        require_positive("ray.placement_timeout_s", self.placement_timeout_s)
        require_choice("ray.trainer_strategy", self.trainer_strategy, STRATEGIES)
        require_choice("ray.rollout_strategy", self.rollout_strategy, STRATEGIES)
        for key, resources in (
            ("ray.trainer_resources", self.trainer_resources),
            ("ray.rollout_resources", self.rollout_resources),
        ):
            for name, amount in resources.items():
                require(
                    name not in ("CPU", "GPU") and amount > 0,
                    f"{key}.{name}",
                    amount,
                    "a custom resource (not CPU/GPU) with an amount > 0",
                )


@dataclass
class RecipeConfig:
    mode: str = "fully_async"
    """Which recipe runs: ``sync`` (colocated baseline), ``one_step_off`` or ``fully_async``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, MODES)
        self._check_batches()
        self._warn_unused_knobs()

    def _check_batches(self) -> None:
        require(
            not self.algorithm.filter_groups.enable or self.rollout.n >= 2,
            "rollout.n",
            self.rollout.n,
            ">= 2 with algorithm.filter_groups.enable=true (a group of one response has no "
            "variance: every group would be filtered)",
        )
        require(
            self.reward.judge.mode != "pairwise" or self.rollout.n >= 2,
            "rollout.n",
            self.rollout.n,
            ">= 2 with reward.judge.mode=pairwise (responses are compared within a group)",
        )
        mini = self.actor.ppo_mini_batch_size
        if self.mode == "fully_async":
            return  # a local step is require_batches whole mini-batches by construction
        require(
            self.data.train_batch_size % mini == 0,
            "data.train_batch_size",
            self.data.train_batch_size,
            f"a multiple of actor.ppo_mini_batch_size={mini}",
        )

    def _warn_unused_knobs(self) -> None:
        defaults = AsyncTrainingConfig()
        if self.mode != "fully_async":
            for name in ("staleness_threshold", "require_batches", "max_staleness"):
                if getattr(self.async_training, name) != getattr(defaults, name):
                    warn_unused(f"async_training.{name}", self.mode)
        elif self.data.train_batch_size != DataConfig().train_batch_size:
            warn_unused(
                "data.train_batch_size",
                self.mode,
                "prompts per trainer step are actor.ppo_mini_batch_size x "
                "async_training.require_batches here",
            )

    @property
    def prompts_per_step(self) -> int:
        """Prompts per trainer step: R in fully_async, data.train_batch_size otherwise."""
        if self.mode == "fully_async":
            return self.actor.ppo_mini_batch_size * self.async_training.require_batches
        return self.data.train_batch_size

    def num_trainer_steps(self, num_train_prompts: int) -> int:
        """Trainer steps of a run on ``num_train_prompts`` train prompts: the prompts to train
        on (``rollout.total_rollout_steps``, else ``trainer.total_epochs`` passes over the
        train set) over ``prompts_per_step``, at most ``trainer.total_training_steps``."""
        total_prompts = (
            self.rollout.total_rollout_steps or self.trainer.total_epochs * num_train_prompts
        )
        steps = total_prompts // self.prompts_per_step
        if self.trainer.total_training_steps is not None:
            steps = min(steps, self.trainer.total_training_steps)
        per_step = (
            "actor.ppo_mini_batch_size * async_training.require_batches"
            if self.mode == "fully_async"
            else "data.train_batch_size"
        )
        require(
            steps >= 1,
            "rollout.total_rollout_steps",
            total_prompts,
            f">= one trainer step of {self.prompts_per_step} prompts ({per_step})",
        )
        return steps


def register_configs() -> None:
    """Register the schema so YAML presets are type-checked against it."""
    ConfigStore.instance().store(name="recipe_schema", node=RecipeConfig)


def load_config(cfg: DictConfig | dict[str, Any]) -> RecipeConfig:
    """Composed config -> validated dataclasses. Raises ``ConfigError`` naming the key."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RecipeConfig), cfg)
        obj = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf wraps __post_init__ errors; unwrap ours
        cause = exc.__cause__ or exc.__context__
        while cause is not None:
            if isinstance(cause, ConfigError):
                raise cause from None
            cause = cause.__cause__ or cause.__context__
        raise ConfigError(str(exc).splitlines()[0]) from exc
    assert isinstance(obj, RecipeConfig)
    return obj
