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
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.clients import QueueClient, RolloutClient
from fully_async_policy.message_queue import make_message_queue
from fully_async_policy.rollouter import FullyAsyncRollouter
from fully_async_policy.trainer import FullyAsyncTrainer
from recipe.config import RecipeConfig
from recipe.workers.cluster import on_driver_node

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 120.0


class FullyAsyncRecipe:
    """config -> trainer (driver), message queue and rollouter (actors) -> fit -> close."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        import ray

        # Input checks (model, data, reward functions, config arithmetic) run first, here.
        self.trainer = FullyAsyncTrainer(cfg, run_dir)
        self.queue: ActorHandle | None = None
        self.rollouter: ActorHandle | None = None
        try:
            plan = self.trainer.plan
            self.queue = make_message_queue(plan.budget)
            # Reserved with the trainer's, before any worker started; the rollouter owns it.
            engines = self.trainer.placement.take("rollout")
            actor: Any = ray.remote(num_cpus=0)(FullyAsyncRollouter)
            self.rollouter = actor.options(scheduling_strategy=on_driver_node()).remote(
                cfg, run_dir, self.queue, plan, engines
            )
            client = RolloutClient(self.rollouter)
            ray.get(client.start())  # the engines started (or failed)
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
                    ray.get(self.rollouter.shutdown.remote(), timeout=_CLOSE_TIMEOUT_S)
                except Exception:  # the engines may be gone already; end the actor anyway
                    logger.exception("closing the rollouter failed")
                ray.kill(self.rollouter)
            if self.queue is not None:
                ray.kill(self.queue)
            self.rollouter = self.queue = None
            self.trainer.placement.release()
