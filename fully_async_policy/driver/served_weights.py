"""``ServedWeights``: the trainer's copy of the weights the engines serve, and what needs it.

    push v  --> keep(v): every trainer rank saves its weights to the CPU slot "pushed"
                (once per version; right after a push they are the served ones)
    local steps 2..T of a window, bypass_mode=false: old log-probs forward with that slot
    a replica died --> heal(v): the rollouter restarts it; the slot is exported to a file
                       under the run directory and the new replica loads it, serving v again
    resume  --> serve_resumed(v): the trainer's (loaded) weights become every engine's
    workers() the engines' workers as last seen (a sync's opening names them, a heal asks
              again, a restart or retirement in the rollouter's progress drops them), so a
              push asks the rollouter for them only when they may have changed

The slot is needed only while the trainer's own weights differ from the served ones (between
the first update of a window and the next push), which is when a restarted replica must
still be given version v.

Every wait on the rollouter has its call's deadline (``within``, deadlines.py): loading a
weights file into the engines is bounded by ``rollout.start_timeout_s`` (the engines read a
whole model from disk and check its sha256, as at their start; a sync phase's 120 s is sized
for one bucket of a push, not a model), a restart by its bundle's, start's and pause's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from fully_async_policy.deadlines import Within
from recipe.observability.tracking import MetricsAccumulator
from recipe.run.checkpointing import exported_weights

if TYPE_CHECKING:
    from fully_async_policy.driver.clients import RolloutClient
    from recipe.workers.rollout.client import ReplicaClient
    from recipe.workers.trainer.ranks import TrainerRanks

PUSHED_SLOT = "pushed"
"""CPU slot holding the weights version last pushed to the engines: decoupled old log-probs
read it, and a restarted rollout worker is loaded from it (``rollout.max_restarts > 0``)."""


class ServedWeights:
    """The served version's weights, kept in every trainer rank (module docstring)."""

    def __init__(
        self, ranks: TrainerRanks, rollouter: RolloutClient, run_dir: Path, within: Within
    ) -> None:
        """``run_dir``: where files of weights for the engines go (every node reads it);
        ``within(ref, call)``: the answer to a rollouter call within its deadline."""
        self.ranks, self.rollouter, self.run_dir = ranks, rollouter, run_dir
        self._within = within
        self.kept_version: int | None = None
        """The version held in ``PUSHED_SLOT`` (None: nothing kept yet)."""
        self._workers: list[ReplicaClient] | None = None
        """The engines' workers as last seen (``workers``)."""

    def keep(self, version: int, metrics: MetricsAccumulator | None = None) -> None:
        """Save the trainer's weights (those of ``version``, just pushed) to ``PUSHED_SLOT``
        of every trainer rank, once per version (``timing/save_to_cpu_s``)."""
        if self.kept_version == version:
            return
        with metrics.timer("timing/save_to_cpu_s") if metrics else contextlib.nullcontext():
            self.ranks.save_model_to_cpu(PUSHED_SLOT)
        self.kept_version = version

    def serve_resumed(self, version: int) -> None:
        """A resumed run: every engine loads the trainer's weights as ``version`` (they
        start from ``model.path`` at version 0); they are then also the kept copy."""
        tag = f"resume-v{version}"
        with exported_weights(self.ranks, self.run_dir, tag) as weights:
            self._within(self.rollouter.load_weights(weights, version), "load_weights")
        self.keep(version)

    def workers(self) -> list[ReplicaClient]:
        """The engines' workers as last seen (asked of the rollouter only when unknown:
        ``seen`` and ``heal`` keep it, ``forget_workers`` drops it)."""
        if self._workers is None:
            self._workers = self._within(self.rollouter.engine_workers(), "engine_workers")
        return self._workers

    def seen(self, workers: list[ReplicaClient]) -> None:
        """The rollouter named its workers (a sync's opening)."""
        self._workers = list(workers)

    def forget_workers(self) -> None:
        """A replica was restarted or retired since the workers were seen (the rollouter's
        progress counts it): ask again at the next use."""
        self._workers = None

    def heal(self, version: int) -> bool:
        """Have the rollouter restart dead replicas and load the served weights (``version``)
        into every restarted one. True when a replica runs on a new worker since the call
        (a push then reaches it over a rebuilt transport)."""
        rollouter, within = self.rollouter, self._within
        before = within(rollouter.engine_workers(), "engine_workers")
        waiting = within(rollouter.recover_replicas(), "recover_replicas")
        for replica in waiting:
            if version == 0:  # nothing pushed yet: the model on disk is what is served
                within(rollouter.install_weights(replica, None, 0), "install_weights")
                continue
            if self.kept_version != version:
                raise RuntimeError(
                    f"replica {replica} needs the served weights of version {version}, but the "
                    f"trainer keeps a copy of version {self.kept_version}"
                )
            tag = f"restart-v{version}"
            kept = exported_weights(self.ranks, self.run_dir, tag, slot=PUSHED_SLOT)
            with kept as weights:
                within(rollouter.install_weights(replica, weights, version), "install_weights")
        self._workers = within(rollouter.engine_workers(), "engine_workers")
        return self._workers != before
