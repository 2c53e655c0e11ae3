"""``FullyAsyncRecipe``: builds the fully async recipe's three parts and runs them.

    driver process                          Ray actors
    +---------------------------+           +----------------------------------+
    | FullyAsyncTrainer         |  poll,    | FullyAsyncRollouter (async)      |
    |  TrainerRanks (FSDP2)  ----+ syncs --> |  RolloutReplicas (vLLM engines)     |
    |  Tracker (metrics.jsonl)  |           |  PromptCursor, AdmissionControl  |
    +------------^--------------+           +----------------+-----------------+
                 | get_batch(R)                               | put(group), blocks when full
                 +-------------- MessageQueue (async) <-------+
                          capacity = admission budget B

The trainer loop runs in the driver (its compute is in the TrainerWorker actors, and the
driver keeps the run's one Tracker); the rollouter is an actor so that its event loop streams
groups while the trainer trains. Weights move trainer -> engines directly; the rollouter only
pauses and resumes generation around a push.

Start-up, in order (each phase's seconds go to ``startup/*`` in summary.json):

    inputs_s        data and reward functions checked, then the model, agents and prompts
                    (bad input: exit 2, Ray shut down first); loaded once: the rollouter
                    actor is handed them, not loading them again
    ray_s           Ray started, inside inputs_s: while the model and prompts are checked
    trainer_init_s  trainer built, placement reserved, ranks launched -- ranks load the model
    engines_s       engines launched (here, in the rollout group), rollouter actor started
                    -> start(engines): it waits for them to load, compile, capture graphs --'
                    (their own split read off their logs: recipe/run/startup.py)
                    (both side by side; the driver waits on both together, so a failing side
                    is raised without waiting for the other)
    then the trainer's fit: initial validation, the first step (TrainingRun records both)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.trainer import FullyAsyncTrainer
from fully_async_policy.message_queue import make_message_queue
from fully_async_policy.rollouter.actor import FullyAsyncRollouter
from recipe.config import RecipeConfig
from recipe.run.inputs import RunInputs
from recipe.run.placement import ENGINE_LOG_DIR, init_ray, resolve_device
from recipe.run.startup import StartupTimes
from recipe.workers.cluster import on_driver_node, wait_started
from recipe.workers.judge_server import judge_ready, stop_judge

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from recipe.workers.rollout.replicas import RolloutReplicas

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 120.0


class FullyAsyncRecipe:
    """config -> trainer (driver), message queue and rollouter (actors) -> fit -> close."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        import ray

        startup = StartupTimes()

        # Input checks (the device, data, reward functions) run first, before Ray starts;
        # Ray starts while the model and prompts are checked, the agents after them; their
        # errors fail the run as before (Ray shut down first). A resumed run's checkpoint is
        # checked by the trainer, after it.
        def start_ray() -> None:
            start = time.perf_counter()
            init_ray(cfg.ray)
            startup.add_within("ray_s", time.perf_counter() - start)

        ray_was_up = ray.is_initialized()
        with startup.phase("inputs_s"):
            resolve_device(cfg.trainer.device)
            try:
                inputs = RunInputs.load(cfg, beside=start_ray)
            except BaseException:
                if not ray_was_up:
                    ray.shutdown()
                raise
        trainer_start = time.perf_counter()
        self.trainer = FullyAsyncTrainer(cfg, run_dir, inputs=inputs)  # ranks load meanwhile
        self.trainer.run.startup = startup
        self.queue: ActorHandle | None = None
        self._engines: RolloutReplicas | None = None
        """The engines, until the rollouter's ``start`` took them (then it shuts them down)."""
        self.rollouter: ActorHandle | None = None
        self.judge: ActorHandle | None = None
        try:
            plan = self.trainer.plan
            self.queue = make_message_queue(plan.budget)
            engines_start = time.perf_counter()
            # Launched here, in the group reserved with the trainer's, so that the engines
            # start while the rollouter actor starts; handed to it, which owns them from then.
            assert inputs.model is not None  # RunInputs.load loads it
            self._engines = self.trainer.placement.launch_engines(inputs.model)
            actor: Any = ray.remote(num_cpus=0)(FullyAsyncRollouter)
            # The inputs checked above, not loaded again: records and prompt ids pickle as
            # they are, the reward function as its config (it imports reward.custom_fn
            # again in the actor: a function loaded from a file has no importable name).
            self.rollouter = actor.options(scheduling_strategy=on_driver_node()).remote(
                cfg, run_dir, self.queue, plan, None, inputs=inputs
            )
            client = RolloutClient(self.rollouter)
            started = client.start(self._engines)
            placement = self.trainer.placement  # the judge's engines: after the policy's on a GPU
            self.judge = placement.start_judge([started] if placement.judge_starts_last else None)
            ranks = self.trainer.ranks
            ranks_ready = ranks.ready_refs()
            judge_up = [judge_ready(self.judge)] if self.judge is not None else []
            ended_at = wait_started(
                {"engines": [started, *judge_up], "trainer": ranks_ready},
                on_failure={"trainer": ranks.wait_ready},  # shuts the ranks down, raises
            )
            self._engines = None  # the rollouter's now
            startup.add_engines(ended_at["engines"] - engines_start, Path(run_dir) / ENGINE_LOG_DIR)
            startup.add("trainer_init_s", ended_at["trainer"] - trainer_start)
            self.trainer.attach(client, QueueClient(self.queue))
        except BaseException:
            self.close()
            raise

    def fit(self) -> dict[str, Any]:
        """Run to the end; returns the summary written to ``summary.json``."""
        return self.trainer.fit()

    @property
    def ledger(self) -> dict[str, list[str]]:
        """Prompt uids ``admitted``, ``trained`` and ``in_flight`` at the end of ``fit``."""
        return self.trainer.ledger

    def close(self) -> None:
        """End the actors this recipe started; safe to call twice."""
        import ray

        try:
            self.trainer.close(release_placement=False)  # the engines may share its group
        finally:
            if self.rollouter is not None:
                try:
                    ray.get(RolloutClient(self.rollouter).shutdown(), timeout=_CLOSE_TIMEOUT_S)
                except Exception:  # the engines may be gone already; end the actor anyway
                    logger.exception("closing the rollouter failed")
                ray.kill(self.rollouter)
            if self._engines is not None:  # a start that failed: the rollouter may not have them
                try:
                    self._engines.shutdown()
                except Exception:  # already shut down by the rollouter, or Ray is going
                    logger.debug("shutting down the launched engines failed", exc_info=True)
            if self.queue is not None:
                ray.kill(self.queue)
            stop_judge(self.judge)
            self.rollouter = self.queue = self.judge = self._engines = None
            self.trainer.placement.release()
