"""``TrainerRanks``: the driver-side handle of N ``TrainerWorker`` Ray actors (one per rank).

    driver: TrainBatch (B rows) --shard by whole prompt groups--> rank 0 .. rank N-1 (Ray actors)
            logprobs (B, T)     <--reassemble by row index------  per-rank (B_r, T)
            metrics             <--rank 0 (workers all-reduce)--  update_actor

Sharding follows ``TrainBatch.shard_rows`` with ``actor.ppo_mini_batch_size`` groups per
mini-batch, so every optimizer step sees the same prompts for any world size. Each rank must
run the same number of micro-batches (FSDP collectives pair up across ranks); a batch that
cannot be split that way is refused with a ValueError before anything runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from recipe.checkpoint_engine.clients import SenderClient
from recipe.faults import TrainerWorkerError, describe_death, is_actor_death
from recipe.utils.adapter_file import AdapterFile
from recipe.utils.rendezvous import StoreServer
from recipe.utils.weights_file import WeightsFile
from recipe.workers.config import ActorConfig
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.fsdp_utils import JOIN_TIMEOUT
from recipe.workers.trainer.spec import TrainerSpec
from recipe.workers.trainer.worker import TrainerWorker

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 600.0


class TrainerRanks:
    """N trainer ranks in one placement group; methods fan out to all ranks and wait."""

    def __init__(
        self,
        actor: ActorConfig,
        spec: TrainerSpec,
        *,
        world_size: int | None = None,
        use_gpu: bool | None = None,
        gpu_fraction: float = 1.0,
        placement_group: Any = None,
        owns_placement_group: bool = True,
        wait: bool = True,
    ):
        """``world_size`` defaults to ``actor.world_size``; ``use_gpu`` None: GPUs when the Ray
        cluster has any; ``gpu_fraction``: the share of a GPU each rank reserves (< 1 when the
        rollout engines share the trainer's GPUs, colocated); ``placement_group``: one bundle
        per rank (created when None); removed at shutdown when ``owns_placement_group``
        (not when the engines share its bundles: ``Placement.one_group``). ``wait`` False:
        return while the ranks still load the model, so the caller can start the engines
        meanwhile; it then calls ``wait_ready`` before anything else."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.actor, self.spec = actor, spec
        self.world_size = world_size or actor.world_size
        if use_gpu is None:
            use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        bundle = {"CPU": 1, "GPU": gpu_fraction} if use_gpu else {"CPU": 1}
        self._broken = False  # a rank died: shut down without waiting on the others
        if placement_group is None:
            placement_group = ray.util.placement_group([bundle] * self.world_size, strategy="PACK")
        ray.get(placement_group.ready(), timeout=_READY_TIMEOUT_S)
        self._pg = placement_group if owns_placement_group else None

        def on_bundle(index: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement_group, index)

        # The ranks meet at a store this process serves for the group's lifetime, on this
        # node's own address under a secret (``recipe.utils.rendezvous``).
        self._rendezvous = StoreServer.open(self.world_size, JOIN_TIMEOUT, namespace="trainer")
        worker_cls: Any = ray.remote(TrainerWorker)
        self.workers: list[Any] = [
            worker_cls.options(
                num_cpus=1,
                num_gpus=gpu_fraction if use_gpu else 0,
                scheduling_strategy=on_bundle(rank),
            ).remote(
                actor,
                spec,
                rank=rank,
                world_size=self.world_size,
                rendezvous=self._rendezvous.address,
                device="cuda" if use_gpu else "cpu",
            )
            for rank in range(self.world_size)
        ]
        self._ready = False
        if wait:
            self.wait_ready()

    def ready_refs(self) -> list[ObjectRef[None]]:
        """One reference per rank, ready once that rank has loaded the model and joined the
        group (or failed to: ``ray.get`` raises)."""
        return [w.__ray_ready__.remote() for w in self.workers]

    def senders(self) -> list[SenderClient]:
        """Each rank's end of a weight push, rank 0 (the sender) first."""
        return [SenderClient(w) for w in self.workers]

    def wait_ready(self) -> None:
        """Block until every rank has loaded the model and joined the process group (at once
        after the first time); a rank that failed is raised here, after the others were shut
        down."""
        if self._ready:
            return
        try:
            self._get_all(self.ready_refs())
        except BaseException:
            # Ranks still blocked in the rendezvous would never answer close().
            self.shutdown(graceful=False)
            raise
        self._ready = True
        address = self._rendezvous.address
        logger.info(
            "trainer group up: %d ranks, rendezvous %s:%d",
            self.world_size,
            address.host,
            address.port,
        )

    # ---- fan-out --------------------------------------------------------------------------

    def _get_all(self, refs: list[Any]) -> list[Any]:
        """Results in order (``refs[r]`` is rank r's call); raises the first failure at once
        instead of waiting on the ranks that are blocked in a collective with the failed one.
        A rank whose actor died raises ``TrainerWorkerError`` naming it."""
        import ray

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=None)
            try:
                ray.get(done)
            except Exception as exc:
                self._raise_if_died(refs.index(done[0]), exc)
                raise
        return ray.get(refs)

    def _raise_if_died(self, rank: int, exc: BaseException) -> None:
        if is_actor_death(exc) and not getattr(exc, "actor_init_failed", False):
            self._broken = True  # its peers may sit in a collective: close() would hang
            raise TrainerWorkerError(rank, describe_death(exc)) from exc

    def check_alive(self, timeout_s: float = 5.0) -> None:
        """Raise ``TrainerWorkerError`` naming a rank whose actor is dead. A rank that does
        not answer within ``timeout_s`` (busy, or blocked by a dead peer) is not judged."""
        import ray

        refs = [w.__ray_ready__.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as exc:
                self._raise_if_died(refs.index(ref), exc)
                raise

    def on_every_rank(self, call: Callable[[Any], Any]) -> list[Any]:
        """``call(rank_handle)`` (one ``.remote`` call, the same on every rank: collective
        methods need all of them) and its results, in rank order."""
        return self._get_all([call(w) for w in self.workers])

    def shard_rows(self, batch: TrainBatch) -> list[list[int]]:
        """Rows of each rank. Ranks may get different row counts (prompt groups of unequal
        size): each rank's micro-batch plan is cut to the group's largest count
        (``recipe.workers.trainer.micro_batches``)."""
        per_mini = self.actor.ppo_mini_batch_size
        return [
            batch.shard_rows(r, self.world_size, groups_per_mini_batch=per_mini)
            for r in range(self.world_size)
        ]

    # ---- PPO steps ------------------------------------------------------------------------

    def compute_log_prob(
        self, batch: TrainBatch, *, slot: str | None = None, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprobs_bt, entropy_bt) (B, T) in the batch's row order; entropy_bt is None
        with ``with_entropy=False``."""
        rows = self.shard_rows(batch)
        results = self._get_all(
            [
                w.compute_log_prob.remote(batch.select(r), slot=slot, with_entropy=with_entropy)
                for w, r in zip(self.workers, rows, strict=True)
            ]
        )
        logprob_bt = self._reassemble(batch, rows, [res[0] for res in results])
        if not with_entropy:
            return logprob_bt, None
        return logprob_bt, self._reassemble(batch, rows, [res[1] for res in results])

    @staticmethod
    def _reassemble(
        batch: TrainBatch, rows: list[list[int]], parts: list[torch.Tensor]
    ) -> torch.Tensor:
        out_bt = torch.zeros(batch.input_ids_bt.shape, dtype=torch.float32)
        for rank_rows, part_bt in zip(rows, parts, strict=True):
            out_bt[torch.tensor(rank_rows, dtype=torch.int64)] = part_bt
        return out_bt

    def update_actor(self, batch: TrainBatch) -> dict[str, float]:
        """One PPO update over the batch; metrics are global (every rank all-reduces them)."""
        rows = self.shard_rows(batch)
        metrics = self._get_all(
            [
                w.update_actor.remote(batch.select(r))
                for w, r in zip(self.workers, rows, strict=True)
            ]
        )
        return metrics[0]

    # ---- weights --------------------------------------------------------------------------

    def save_model_to_cpu(self, slot: str) -> None:
        self.on_every_rank(lambda w: w.save_model_to_cpu.remote(slot))

    def restore_model_from_cpu(self, slot: str) -> None:
        self.on_every_rank(lambda w: w.restore_model_from_cpu.remote(slot))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named CPU tensors (tied weights once), gathered by rank 0."""
        return self.on_every_rank(lambda w: w.full_state_dict.remote())[0]

    def export_weights(self, path: str, *, slot: str | None = None) -> WeightsFile:
        """Rank 0 writes the full weights (``slot``: those saved by ``save_model_to_cpu``)
        to ``path`` (safetensors); returns its record (bytes, checksum)."""
        return self.on_every_rank(lambda w: w.export_weights.remote(str(path), slot=slot))[0]

    def export_adapter(self, directory: str | Path, *, slot: str | None = None) -> AdapterFile:
        """Rank 0 writes the LoRA adapter (``slot``: the one saved by ``save_model_to_cpu``)
        as a PEFT folder at ``directory``; returns its record (bytes, checksums, rank)."""
        return self.on_every_rank(lambda w: w.export_adapter.remote(str(directory), slot=slot))[0]

    def weight_metadata(self) -> list[tuple[str, tuple[int, ...], str]]:
        return self.on_every_rank(lambda w: w.weight_metadata.remote())[0]

    def save_hf(self, path: str | Path) -> None:
        self.on_every_rank(lambda w: w.save_hf.remote(str(path)))

    def load_hf(self, path: str | Path) -> None:
        self.on_every_rank(lambda w: w.load_hf.remote(str(path)))

    def save_train_state(self, path: str | Path) -> None:
        """Optimizer + LR schedule (full, rank 0) and every rank's RNG into ``path``."""
        self.on_every_rank(lambda w: w.save_train_state.remote(str(path)))

    def load_train_state(self, path: str | Path) -> None:
        """The state ``save_train_state`` wrote (after ``load_hf`` of the same checkpoint)."""
        self.on_every_rank(lambda w: w.load_train_state.remote(str(path)))

    def shutdown(self, *, graceful: bool = True) -> None:
        """Leave the process groups, end the actors this group started, free the bundles."""
        import ray

        if graceful and self.workers and not self._broken:
            close_refs = [w.close.remote() for w in self.workers]
            _, not_closed = ray.wait(close_refs, num_returns=len(close_refs), timeout=30)
            if not_closed:
                logger.warning("%d trainer ranks did not close in 30 s", len(not_closed))
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None
