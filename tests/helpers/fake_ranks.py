"""The trainer side's workers without a model, for unit tests of the trainer recipes' loops.

    ScriptedRanks   ``TrainerRanks``' contract as the recipes call it: the "weights" are the
                    count of updates applied, so a saved slot, an exported file or a
                    checkpoint says which version of the policy it holds; log-probs are the
                    rollout's; every batch and call is recorded
    ScriptedPush    a weight push's engine side as ``ParameterSynchronizer._sync`` runs it
                    through ``ServingEngines``: pause (the engines' owner quiesces them),
                    commit the pushed version on every worker (which refuses unless paused),
                    resume; the transfer itself is left out

Fakes for the fast tier only: the real ranks and pushes run in tests/integration/
(test_trainer_fsdp.py, test_weight_sync.py, test_fully_async.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recipe.checkpoint_engine.clients import SenderClient
from recipe.checkpoint_engine.engines import ServingEngines
from recipe.checkpoint_engine.synchronizer import PushResult
from recipe.utils.weights_file import WeightsFile, file_sha256
from recipe.workers.trainer.batch import TrainBatch
from tests.helpers.local_actors import LoopThread

_POLICY_FILE = "policy.json"
_OPTIMIZER_FILE = "optimizer.json"


@dataclass
class Export:
    """One weights file the trainer wrote for the engines."""

    path: str
    slot: str | None
    updates: int
    """The policy it holds: updates applied before it was saved."""


@dataclass
class ScriptedRanks:
    """Trainer ranks whose policy is the number of updates applied (module docstring).

    ``on_update(n)`` runs before the n-th update (1-based): a test's fault goes there."""

    on_update: Callable[[int], None] = lambda n: None
    updates: int = 0
    batches: list[TrainBatch] = field(default_factory=list)
    forwards: list[tuple[str | None, int]] = field(default_factory=list)
    """(slot, updates of the policy it read) of every ``compute_log_prob``."""
    slots: dict[str, int] = field(default_factory=dict)
    exports: list[Export] = field(default_factory=list)
    loaded_from: list[str] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)
    closed: bool = False

    def wait_ready(self) -> None:
        return None

    def check_alive(self, timeout_s: float = 5.0) -> None:
        return None

    def senders(self) -> list[SenderClient]:
        return [SenderClient(w) for w in self.workers]

    def compute_log_prob(
        self, batch: TrainBatch, *, slot: str | None = None, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if slot is not None and slot not in self.slots:
            raise KeyError(f"no CPU slot {slot!r} saved")
        self.forwards.append((slot, self.updates if slot is None else self.slots[slot]))
        logprobs_bt = batch.rollout_logprobs_bt.clone()
        return logprobs_bt, torch.zeros_like(logprobs_bt) if with_entropy else None

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        self.on_update(self.updates + 1)
        self.batches.append(batch)
        self.updates += 1
        return {"actor/pg_loss": 0.0, "actor/grad_norm": 0.1, "actor/lr": 1e-6}

    def save_model_to_cpu(self, slot: str) -> None:
        self.slots[slot] = self.updates

    def export_weights(self, path: str, *, slot: str | None = None) -> WeightsFile:
        updates = self.updates if slot is None else self.slots[slot]
        Path(path).write_text(json.dumps({"updates": updates}))
        self.exports.append(Export(path, slot, updates))
        return WeightsFile(path, 4, file_sha256(path))

    def save_hf(self, path: str | Path) -> None:
        (Path(path) / _POLICY_FILE).write_text(json.dumps({"updates": self.updates}))

    def load_hf(self, path: str | Path) -> None:
        self.updates = json.loads((Path(path) / _POLICY_FILE).read_text())["updates"]
        self.loaded_from.append(str(path))

    def save_train_state(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / _OPTIMIZER_FILE).write_text(json.dumps({"steps": self.updates}))

    def load_train_state(self, path: str | Path) -> None:
        steps = json.loads((Path(path) / _OPTIMIZER_FILE).read_text())["steps"]
        assert steps == self.updates, "optimizer state of another checkpoint than the policy"

    def shutdown(self, *, graceful: bool = True) -> None:
        self.closed = True


@dataclass
class ScriptedPush:
    """``ParameterSynchronizer``'s place in a recipe, over scripted engine workers (module
    docstring). ``pushed[v]``: the updates the policy of version ``v`` holds."""

    engines: ServingEngines
    ranks: ScriptedRanks
    loop: LoopThread
    pushed: dict[int, int] = field(default_factory=dict)
    backend: str = "scripted"
    num_retries: int = 0

    def push(self, version: int, *, timer: Any = None) -> PushResult:
        self.engines.pause()
        workers = self.engines.workers()  # after the pause: a replica healed in it too

        async def commit() -> None:
            for replica in workers:
                await replica.commit_weights(version + 1, version + 1)

        self.loop.call(commit)
        self.pushed[version + 1] = self.ranks.updates
        self.engines.resume()
        return PushResult(version + 1, {"sync/scripted": 1.0}, 0)

    def shutdown(self) -> None:
        return None
