"""``SeparateRayPPOTrainer``: what every trainer holds, and nothing only some of them use.

    SeparateRayPPOTrainer          cfg, run directory, model, placement, run records,
      |                            version, step, the PPO step (recipe/ppo_step.py)
      |- BatchTrainer              recipe/batch_trainer.py: engines in this process, cursor,
      |    |                       generate + score, validation (the batch recipes)
      |    |- SyncTrainer          recipe/sync_trainer.py (colocated baseline)
      |    '- OneStepOffTrainer    one_step_off/
      '- FullyAsyncTrainer         fully_async_policy/  (trainer side only: the rollouter
                                   actor owns the engines, the data and the reward)

The trainer is handed the run's inputs checked already (``RunInputs``: bad model path, data,
reward functions or prompt lengths fail before Ray starts) and keeps of them only the model;
the prompt sets go into the run's records (their fingerprints and counts). A subclass keeps
what else it uses. The PPO step's pieces (batch, old log-probs, advantages, update, push) are
``self.ppo``'s, called by each loop in order.

What a run writes (metrics, trace, ledger, checkpoints) is a ``TrainingRun``
(recipe/run/training_run.py) opened in ``__init__``. The weights version has one owner, the
trainer's ``version``: pushes are told it and return the next (``_fit_update_weights``),
checkpoints store it. Subclasses call ``super().__init__``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.config import RecipeConfig
from recipe.observability.tracking import MetricsAccumulator
from recipe.ppo_step import PPOStep
from recipe.run.inputs import RunInputs
from recipe.run.placement import Placement
from recipe.run.training_run import TraceSource, TrainingRun

if TYPE_CHECKING:
    from recipe.checkpoint_engine.engines import ServingEngines
    from recipe.workers.trainer.ranks import TrainerRanks


class SeparateRayPPOTrainer:
    """Shared base of the trainers. See the module docstring for what lives here."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path, inputs: RunInputs) -> None:
        """``inputs``: checked already (``RunInputs.load``, or a unit test's own)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        assert inputs.model is not None, "a trainer loads the model into its ranks"
        self.model = inputs.model
        self.placement = Placement(cfg, self.run_dir)
        self.version = 0
        """Weights version the engines serve: the one owner of it (+1 per push)."""
        self.global_step = 0
        """Trainer steps done."""
        self.run = TrainingRun(
            cfg, self.run_dir, train=inputs.train_records, val=inputs.val_records
        )
        """What this run writes: metrics, trace, ledger, checkpoints (a resume rewinds the run
        directory first; the trainer then loads the checkpoint's step and version)."""
        self.tracer = self.run.tracer
        """This process's trace events (observability/trace.py)."""
        self.ppo = PPOStep(cfg, self.model, self.placement, self.tracer, self.run_dir)
        """The PPO step's pieces and the trainer ranks (recipe/ppo_step.py)."""

    @property
    def ranks(self) -> TrainerRanks:
        """The trainer ranks (``self.ppo``'s); an error before they are started."""
        return self.ppo.ranks

    def _serving_engines(self) -> ServingEngines:
        """The rollout side as a push sees it (who pauses and resumes the engines)."""
        raise NotImplementedError(f"{type(self).__name__} names no engines to push to")

    def _fit_update_weights(self, metrics: MetricsAccumulator) -> None:
        """Push the trainer's weights to the engines; ``version`` goes up by one."""
        self.version = self.ppo.push(self.version, self._serving_engines, metrics)

    def _load_checkpoint(self) -> dict[str, Any]:
        """Resume: the checkpoint's weights, optimizer, schedule and RNG into the trainer
        ranks and this process; its step and version become this trainer's. Returns its
        ``trainer_state.json`` (the recipe's loop state among it)."""
        state = self.ppo.load_checkpoint(self.run.checkpointer)
        self.global_step, self.version = state["global_step"], state["param_version"]
        return state

    @property
    def fault_counts(self) -> dict[str, int]:
        """Faults the run recovered from (``faults/*``, in metrics.jsonl and summary.json)."""
        return {"faults/sync_retries": self.ppo.num_sync_retries}

    def _trace_sources(self, *, final: bool = False) -> list[TraceSource]:
        """Callables returning the events buffered by other processes (the engines);
        ``final``: the last pull, at close, which must not leave any behind."""
        return []

    def close(self, *, release_placement: bool = True) -> None:
        """Close the run's records, then shut the workers down; safe to call twice.
        ``release_placement`` False keeps the placement's own groups (``Placement.release``)
        for a caller whose workers in them are still up (fully_async's rollouter)."""
        self.run.close(self._trace_sources(final=True))  # before the engines go
        self.ppo.shutdown()
        if release_placement:
            self.placement.release()
