"""``RolloutReplicas``: the driver's handle on ``rollout.replicas`` rollout worker actors.

    driver --generate(groups)--> replica 0 (engine) ... replica k-1 (engine)
           <--list[list[Trajectory]] in request order--

Each prompt group goes to one replica (round robin; fully async places through its
``ReplicaSupervisor``, which knows the replicas in service); every replica is an async Ray
actor, so all groups of a call are in flight at once and each finishes on its own. Sampling
seeds are derived from (``rollout.seed``, prompt uid, weights version), so a run is repeatable
for a given data order and two recipes sample the same prompt the same way on equal weights.

When is a replica dead (one classifier for every recipe, deaths.py): its actor died
(``RayActorError``), or it is alive and fails ``check_health`` (its engine process died). A
replica that does not answer a health check within ``HEALTH_TIMEOUT_S`` is busy or hung, not
judged dead. A group's request and its seed: requests.py (``GroupRequest``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.faults import RolloutWorkerError, RunFailure
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import PromptRecord, Trajectory
from recipe.utils.weights_file import WeightsFile
from recipe.workers.cluster import replica_gpus
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import make_rollout_worker_cls
from recipe.workers.rollout.client import ReplicaClient
from recipe.workers.rollout.deaths import replica_death
from recipe.workers.rollout.requests import GroupRequest

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)


def _any_replica(index: int) -> bool:
    return True


class RoundRobin:
    """The one placement of groups on replicas: round robin over ``num`` replicas, skipping
    those ``serving(index)`` says take no groups now."""

    def __init__(self, num: int) -> None:
        self.num = num
        self.serving: Callable[[int], bool] = _any_replica
        self._next = 0

    def next(self) -> int:
        """The next replica that serves; ``RuntimeError`` when none does."""
        for _ in range(self.num):
            index, self._next = self._next, (self._next + 1) % self.num
            if self.serving(index):
                return index
        raise RuntimeError("no rollout replica is in service")


class RolloutReplicas:
    """``num_replicas`` engines as Ray actors, driven from one process."""

    def __init__(
        self,
        model: HFModelConfig,
        cfg: RolloutConfig,
        *,
        device: str,
        gpu_fraction: float = 1.0,
        log_dir: Path | None = None,
        placement_group: Any = None,
        placement_timeout_s: float = 300.0,
        owns_placement_group: bool = True,
        max_prompt_length: int | None = None,
        lora_rank: int = 0,
        num_cpus: float = 1.0,
        wait: bool = True,
    ) -> None:
        """``gpu_fraction``: the share of a GPU each replica reserves in Ray (< 1 colocated;
        a tensor-parallel replica takes ``rollout.tensor_parallel_size`` whole GPUs);
        ``log_dir``: where each engine writes its output (``replica_R.log``, then
        ``replica_R.restart_K.log``); None leaves it in the workers' Ray logs;
        ``placement_group``: one bundle per replica (``recipe.workers.cluster``; removed at
        shutdown when ``owns_placement_group``), replica r on bundle r, a restarted one too
        (it waits up to ``placement_timeout_s`` for its bundle when the bundle's node died);
        None: Ray places each worker where it fits; ``max_prompt_length``: the run's
        ``data.max_prompt_length``, the longest prompt an agent's request may start a segment
        with (None: the engine's context only); ``lora_rank``: ``actor.lora.rank`` (> 0:
        engines serve pushed LoRA adapters, vLLM only); ``num_cpus``: Ray's CPUs for each
        worker actor (0: a worker that must fit beside reserved groups, the judge's);
        ``wait``: return once every engine started (False: at once, the engines still
        starting; ``wait_started`` waits for them, and the object may go to another process
        first: it pickles with the actors' handles)."""

        if cfg.backend == "vllm" and cfg.engine_kwargs:
            from recipe.workers.rollout.engine_args import check_engine_kwargs

            check_engine_kwargs(cfg)  # an unknown name fails here, not inside an actor
        if lora_rank and cfg.backend != "vllm":
            raise ValueError(
                f"actor.lora.rank={lora_rank} needs rollout.backend=vllm (the {cfg.backend} "
                "engine serves no adapters)"
            )
        self.cfg = cfg
        self._lora_rank = lora_rank
        self._log_dir = str(log_dir) if log_dir is not None else None
        self._starts: list[int] = []  # workers started per replica
        worker_cls = make_rollout_worker_cls(cfg.backend)
        resources: dict[str, Any] = {"num_cpus": num_cpus}
        if device == "cuda":
            resources["num_gpus"] = replica_gpus(cfg.tensor_parallel_size, gpu_fraction)
        # What restart() needs to start a replica again.
        self._worker_cls, self._resources = worker_cls, resources
        self._pg, self._placement_timeout_s = placement_group, placement_timeout_s
        self._owns_pg = owns_placement_group
        self._max_prompt_length = max_prompt_length
        # The worker gets the resolved path: no replica builds or resolves the default itself.
        self._model_cfg = ModelConfig(
            path=str(model.path), dtype=model.dtype, trust_remote_code=model.trust_remote_code
        )
        self.workers: list[ReplicaClient] = [
            self._start_worker(index) for index in range(cfg.replicas)
        ]
        self._retired: dict[str, int] = {}  # actor id -> replica, of workers restart() replaced
        self._placement = RoundRobin(cfg.replicas)
        self._replica_of: dict[Any, int] = {}
        """The replica of each request of a batch awaited with ``get`` (to name a hung one);
        entries leave when ``get`` returns or fails."""
        if wait:  # constructors are where engines start: wait so failures surface here
            self.wait_started()

    def wait_started(self) -> None:
        """Wait for every replica's engine to start, within ``rollout.start_timeout_s``; past
        it ``RunFailure`` names the replicas still starting, and an engine that failed to start
        raises its error."""
        import ray

        refs = [w.get_version() for w in self.workers]
        ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=self.cfg.start_timeout_s)
        ray.get(ready)  # an engine that failed to start raises here
        if waiting:
            starting = [str(refs.index(ref)) for ref in waiting]
            raise RunFailure(
                f"rollout replica(s) {', '.join(starting)} did not start within "
                f"rollout.start_timeout_s={self.cfg.start_timeout_s:g} s (a hung engine start; "
                "its log is RUN_DIR/engines/replica_R.log)"
            )

    def _start_worker(self, index: int) -> ReplicaClient:
        if index == len(self._starts):
            self._starts.append(0)
        self._starts[index] += 1
        options: dict[str, Any] = dict(self._resources)
        if self._pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._pg, index)
        return ReplicaClient.start(
            self._worker_cls,
            options,
            self._model_cfg,
            self.cfg,
            self._log_path(index),
            self._max_prompt_length,
            # Only a LoRA engine takes the rank: the hf worker has no such argument.
            *([self._lora_rank] if self._lora_rank else []),
        )

    def wait_for_bundle(self, index: int) -> str:
        """The node that will run replica ``index`` again: its bundle's, once Ray has placed
        the bundle on a node that is alive (it moves when its node died and the cluster has
        room); ``PlacementError`` naming the replica when it has none within
        ``placement_timeout_s``. Blocking: async callers run it in a thread."""
        if self._pg is None:
            return ""
        from recipe.workers.cluster import PlacementError, wait_for_bundle

        try:
            return wait_for_bundle(self._pg, index, self._placement_timeout_s)
        except PlacementError as exc:
            raise PlacementError(f"rollout replica {index}: {exc}") from None

    def _log_path(self, index: int) -> str | None:
        if self._log_dir is None:
            return None
        restarts = self._starts[index] - 1
        suffix = f".restart_{restarts}" if restarts else ""
        return str(Path(self._log_dir) / f"replica_{index}{suffix}.log")

    def restart(self, index: int) -> ReplicaClient:
        """Replace replica ``index`` (dead, or with a dead engine) by a new worker with the
        same resources, loading the model from disk (version 0). Returns its handle; its
        engine is still starting (a call on it waits for that). With round-robin placement it
        takes groups at once; fully async's supervisor places none on it before it serves the
        current weights."""
        try:
            self.workers[index].kill()  # its engine processes go with it
        except Exception:  # already gone
            logger.debug("rollout replica %d was already gone", index, exc_info=True)
        self._retired[self.workers[index].actor_id] = index
        self.workers[index] = self._start_worker(index)
        return self.workers[index]

    def place_with(self, serving: Callable[[int], bool] | None) -> None:
        """Place each group submitted without a replica on one that ``serving(index)`` says
        takes groups (fully async: its supervisor's replicas in service); None: any."""
        self._placement.serving = serving or _any_replica

    def next_replica(self) -> int:
        """The replica that takes the next group (round robin over those serving)."""
        return self._placement.next()

    async def worker_error(self, exc: BaseException) -> RolloutWorkerError | None:
        """``exc``, raised by a call on a replica, as the death of that replica
        (``replica_death``, deaths.py). None when ``exc`` is an error of another kind. A
        ``RayTaskError`` does not always carry the actor's id, so without one every replica's
        health is checked."""
        actor_id = getattr(exc, "actor_id", None) or getattr(exc, "_actor_id", None)
        if actor_id in self._retired:  # a call on a worker that was replaced meanwhile
            return RolloutWorkerError(self._retired[actor_id], "replaced after it died")
        ids = [w.actor_id for w in self.workers]
        if actor_id in ids:
            index = ids.index(actor_id)
            death = await replica_death(self.workers[index], exc)
            return None if death is None else RolloutWorkerError(index, death.reason)
        if actor_id is not None:
            return None
        deaths = await asyncio.gather(*(replica_death(w, None) for w in self.workers))
        dead = ((i, d) for i, d in enumerate(deaths) if d is not None)
        return next((RolloutWorkerError(i, d.reason) for i, d in dead), None)

    def get(self, refs: list[Any]) -> list[Any]:
        """``ray.get(refs)`` of calls on the replicas; a replica that died raises
        ``RolloutWorkerError`` naming it (``rollout.max_restarts`` applies in fully_async
        only: the batch recipes stop)."""
        import ray

        try:
            return ray.get(refs, timeout=self.cfg.generation_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise self._hung(refs) from None
        except Exception as exc:
            error = asyncio.run(self.worker_error(exc))  # the driver runs no event loop
            if error is not None:
                raise error from exc
            raise
        finally:
            for ref in refs:
                self._replica_of.pop(ref, None)

    def _hung(self, refs: list[Any]) -> RunFailure:
        """The failure of a batch past ``rollout.generation_timeout_s``, naming the replicas
        whose requests are still unanswered."""
        import ray

        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
        replicas = sorted({self._replica_of.get(ref, -1) for ref in waiting} - {-1})
        return RunFailure(
            f"{len(waiting)} of {len(refs)} generation requests got no answer within "
            f"rollout.generation_timeout_s={self.cfg.generation_timeout_s:g} s (rollout "
            f"replica(s) {', '.join(map(str, replicas)) or '?'}: a hung engine process; its "
            "log is RUN_DIR/engines/replica_R.log)"
        )

    def generate(
        self,
        records: Sequence[PromptRecord],
        prompt_ids: Sequence[list[int]],
        *,
        version: int,
        n: int,
        temperature: float,
        top_p: float = 1.0,
        top_k: int = -1,
        training: bool = True,
    ) -> list[list[Trajectory]]:
        """One group per record, all in flight at once; results in ``records`` order.
        ``version``: the weights version the engines serve (it seeds the requests)."""
        groups = [
            GroupRequest(
                record.uid,
                ids,
                version,
                n,
                temperature,
                top_p,
                top_k,
                training=training,
                record=record,
            )
            for record, ids in zip(records, prompt_ids, strict=True)
        ]
        refs = [self.submit(group) for group in groups]
        return self.get(refs)

    def submit(
        self, group: GroupRequest, *, replica: int | None = None, track: bool = True
    ) -> ObjectRef[list[Trajectory]]:
        """Start ``group`` on ``replica`` (None: ``next_replica()``); returns its Ray
        ObjectRef. Multi-turn episodes (``rollout.multi_turn.enable``) need its ``record``.
        ``track=False``: a request the caller awaits itself (not through ``get``), so nothing
        remembers its replica."""
        request = group.to_request(self.cfg)
        index = self.next_replica() if replica is None else replica
        ref = self.workers[index].generate(request)
        if track:
            self._replica_of[ref] = index
        return ref

    def update_weights_from_file(self, weights: WeightsFile, version: int) -> None:
        """Every replica verifies and loads ``weights`` and serves ``version`` (a resumed
        run); the first load that fails raises at once. Within ``rollout.start_timeout_s``:
        each engine reads a whole model from disk and checks its sha256, the work of its start
        (a restarted replica's load has the same deadline); past it ``RunFailure`` names the
        replicas still loading."""
        import ray

        loads = [
            w.update_weights_from_file(weights.path, version, weights.sha256) for w in self.workers
        ]
        timeout_s = self.cfg.start_timeout_s
        end, pending = time.monotonic() + timeout_s, list(loads)
        while pending:
            ready, pending = ray.wait(pending, timeout=max(end - time.monotonic(), 0.0))
            if not ready:
                loading = ", ".join(str(loads.index(ref)) for ref in pending)
                raise RunFailure(
                    f"rollout replica(s) {loading} did not load the weights of version "
                    f"{version} within rollout.start_timeout_s={timeout_s:g} s (a hung engine "
                    "process; its log is RUN_DIR/engines/replica_R.log)"
                )
            ray.get(ready)  # a load that failed raises here

    def drain_trace(
        self, timeout_s: float = 30.0, skip: Sequence[int] = ()
    ) -> list[dict[str, Any]]:
        """Every replica's trace slices since the last call (``observability.trace``), replica
        r on its own process track; ``skip``: replicas that are gone for good."""
        import ray

        refs = [w.drain_trace(i) for i, w in enumerate(self.workers) if i not in skip]
        return [event for events in ray.get(refs, timeout=timeout_s) for event in events]

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([w.shutdown() for w in self.workers], timeout=60)
        finally:
            for worker in self.workers:
                worker.kill()
            self.workers = []
            if self._pg is not None and self._owns_pg:
                ray.util.remove_placement_group(self._pg)
            self._pg = None
