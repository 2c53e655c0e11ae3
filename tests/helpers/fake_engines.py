"""In-process engines for unit tests of the fully async rollouter and its supervisor.

    LocalHandle(obj)      an object behind Ray's call syntax: ``h.method.remote(...)`` starts
                          the call at once on the running loop and returns its future (what
                          the rollouter awaits of an ObjectRef); ``kill()`` makes every call,
                          in flight or new, fail as a dead actor's would (the message queue)
    LocalReplica(worker)  a ``ReplicaClient`` of an in-process rollout worker, over the same
                          calls (not Ray's syntax: the rollouter's code calls the client)
    ScriptedWorker        the real ``RolloutWorker`` contract (pause aborts in flight and
                          returns partials; resume continues them through ``plan_group``;
                          weights change only while paused) over a scripted engine: one token
                          per ``tick_s``, token ids from the prompt, each stamped with the
                          served version
    ScriptedEngines       ``EngineReplicas`` of ScriptedWorkers (the real placement, restarts,
                          ``GroupRequest`` as the real RolloutReplicas submits it)

Fakes for the fast tier only: every path they stand in for also runs against real engines in
tests/integration/.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from recipe.faults import RolloutWorkerError
from recipe.protocol import Trajectory
from recipe.utils.weights_file import WeightsFile
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.base import RolloutWorker
from recipe.workers.rollout.deaths import actor_death
from recipe.workers.rollout.replicas import RoundRobin
from recipe.workers.rollout.requests import (
    GenerationRequest,
    GroupRequest,
    SampleJob,
    finish_job,
    plan_group,
)


def actor_died(pid: int = 4242) -> Exception:
    """The error Ray raises for a call on an actor whose process died."""
    from ray.exceptions import ActorDiedError

    error = ActorDiedError()
    error.error_msg = (
        "The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: VLLMRolloutWorker\n\tactor_id: 0a1b\n"
        f"\tpid: {pid}\n\tip: 10.0.0.1\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR"
    )
    return error


class LocalHandle:
    """``obj`` called as a Ray actor is (see the module docstring)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.dead = False
        self.calls: set[asyncio.Task] = set()
        self._died = asyncio.Event()

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(self, getattr(self.obj, name))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.Future:
        """Start ``fn(*args, **kwargs)`` at once on the running loop; its future."""
        loop = asyncio.get_running_loop()
        if self.dead:
            future = loop.create_future()
            future.set_exception(actor_died())
            return future
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            future = loop.create_future()
            future.set_exception(exc)
            return future
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self.calls.add(task)
            task.add_done_callback(self.calls.discard)
            return asyncio.ensure_future(self.outcome(task))
        future = loop.create_future()
        future.set_result(result)
        return future

    def kill(self) -> None:
        """The actor's process dies: calls in flight and every later call raise
        ``ActorDiedError``."""
        self.dead = True
        self._died.set()

    async def outcome(self, task: asyncio.Task) -> Any:
        died = asyncio.ensure_future(self._died.wait())
        await asyncio.wait({task, died}, return_when=asyncio.FIRST_COMPLETED)
        died.cancel()
        if self.dead:
            task.cancel()
            raise actor_died()
        return task.result()


class _Remote:
    def __init__(self, handle: LocalHandle, fn: Callable[..., Any]) -> None:
        self._handle, self._fn = handle, fn

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Future:
        return self._handle.call(self._fn, *args, **kwargs)


class LocalReplica:
    """A ``ReplicaClient`` (recipe/workers/rollout/client.py) of an in-process ``worker``:
    every call starts at once on the running loop and returns its future (what the rollouter
    awaits of an ObjectRef); ``kill()`` makes every call, in flight or new, fail as a dead
    actor's would."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        self._actor = LocalHandle(worker)
        self.actor_id = f"local-{id(worker):x}"

    @property
    def dead(self) -> bool:
        return self._actor.dead

    def kill(self) -> None:
        self._actor.kill()

    def generate(self, request: GenerationRequest) -> asyncio.Future:
        return self._actor.call(self.worker.generate, request)

    def pause(self) -> asyncio.Future:
        return self._actor.call(self.worker.pause)

    def resume(self) -> asyncio.Future:
        return self._actor.call(self.worker.resume)

    def cut_episodes(self) -> asyncio.Future:
        return self._actor.call(self.worker.cut_episodes)

    def is_paused(self) -> asyncio.Future:
        return self._actor.call(self.worker.is_paused)

    def check_health(self) -> asyncio.Future:
        return self._actor.call(self.worker.check_health)

    def engine_failure(self) -> asyncio.Future:
        return self._actor.call(self.worker.engine_failure)

    def get_version(self) -> asyncio.Future:
        return self._actor.call(self.worker.get_version)

    def update_weights_from_file(
        self, path: str, version: int, sha256: str | None = None
    ) -> asyncio.Future:
        return self._actor.call(self.worker.update_weights_from_file, path, version, sha256=sha256)

    def commit_weights(self, version: int, transfer_id: int) -> asyncio.Future:
        return self._actor.call(self.worker.commit_weights, version, transfer_id)

    def drain_trace(self, replica: int) -> asyncio.Future:
        return self._actor.call(self.worker.drain_trace, replica)

    def shutdown(self) -> asyncio.Future:
        return self._actor.call(self.worker.shutdown)


class _Tokens:
    """Decodes token ids as their numbers (what the reward functions see)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


class ScriptedWorker(RolloutWorker):
    """A rollout worker whose engine emits one token per ``tick_s`` (module docstring).

    Response ``i`` to a prompt whose first token is ``p`` stops after ``stop_after(p, i)``
    tokens (``stop``), else at its budget (``length``); token ``k`` of it is
    ``(p + i + k) % 97``, log-prob -0.5. The default lengths vary from prompt to prompt (2 to
    12 tokens), so groups admitted together finish at different times."""

    def __init__(
        self, tick_s: float = 0.002, stop_after: Callable[[int, int], int] | None = None
    ) -> None:
        super().__init__()
        self.tick_s = tick_s
        self.stop_after = stop_after or (lambda p, i: 2 + (7 * p + i) % 11)
        self.loaded: list[tuple[str, int]] = []
        """(path, version) of every weights file loaded."""
        self.num_requests = 0
        self._abort = asyncio.Event()
        self._running_jobs = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def _generate_group(self, request: GenerationRequest) -> list[Trajectory]:
        self.num_requests += 1
        plan = plan_group(request)
        jobs = [self._sample(request, item) for item in plan if isinstance(item, SampleJob)]
        done = {t.sample_index: t for t in await asyncio.gather(*jobs)}
        return [done[item.sample_index] if isinstance(item, SampleJob) else item for item in plan]

    async def _sample(self, request: GenerationRequest, job: SampleJob) -> Trajectory:
        self._running_jobs += 1
        self._idle.clear()
        try:
            ids: list[int] = []
            reason = "length"
            done_before = len(job.partial.response_ids) if job.partial else 0
            stop_at = self.stop_after(request.prompt_ids[0], job.sample_index) - done_before
            while len(ids) < job.max_new_tokens:
                if self._abort.is_set():
                    reason = "aborted"
                    break
                await asyncio.sleep(self.tick_s)
                k = done_before + len(ids)
                ids.append((request.prompt_ids[0] + job.sample_index + k) % 97)
                if len(ids) >= stop_at and not request.ignore_eos:
                    reason = "stop"
                    break
            versions = [self.version] * len(ids)
            return finish_job(request, job, ids, [-0.5] * len(ids), versions, reason, _Tokens())
        finally:
            self._running_jobs -= 1
            if not self._running_jobs:
                self._idle.set()

    async def _abort_in_flight(self) -> None:
        self._abort.set()
        await self._idle.wait()
        self._abort.clear()

    async def _load_weights(self, path: str) -> None:
        self.loaded.append((path, self.version + 1))

    async def _receiver_call(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        return [{}]  # a push's load: nothing staged to copy in this engine

    async def _close_engine(self) -> None:
        return None


class ScriptedEngines:
    """``EngineReplicas`` (fully_async_policy/rollouter/engine_replicas.py) of in-process
    ScriptedWorkers."""

    def __init__(self, cfg: RolloutConfig, make_worker: Callable[[], ScriptedWorker]) -> None:
        self.cfg = cfg
        self._make_worker = make_worker
        self.workers = [LocalReplica(make_worker()) for _ in range(cfg.replicas)]
        self.restarted: list[int] = []
        self.lost: set[int] = set()
        """Replicas whose node is gone for good (``wait_for_bundle`` fails)."""
        self._loop = asyncio.get_running_loop()  # built on the loop the rollouter runs on
        self._placement = RoundRobin(cfg.replicas)

    def submit(self, group: GroupRequest, *, replica: int | None = None, track: bool = True) -> Any:
        index = self.next_replica() if replica is None else replica
        return self.workers[index].generate(group.to_request(self.cfg))

    def next_replica(self) -> int:
        return self._placement.next()

    def place_with(self, serving: Callable[[int], bool] | None) -> None:
        self._placement.serving = serving or (lambda index: True)

    def restart(self, index: int) -> LocalReplica:
        self.workers[index].kill()
        self.workers[index] = LocalReplica(self._make_worker())
        self.restarted.append(index)
        return self.workers[index]

    def wait_started(self) -> None:
        """In-process workers start in their constructor."""

    def wait_for_bundle(self, index: int) -> str:
        if index in self.lost:
            from recipe.workers.cluster import PlacementError

            raise PlacementError(f"rollout replica {index}: bundle {index}: its node is gone")
        return "node"

    async def worker_error(self, exc: BaseException) -> RolloutWorkerError | None:
        death = actor_death(exc)
        if death is None:
            return None
        index = next((i for i, w in enumerate(self.workers) if w.dead), 0)
        return RolloutWorkerError(index, death.reason)

    def drain_trace(
        self, timeout_s: float = 30.0, skip: Sequence[int] = ()
    ) -> list[dict[str, Any]]:
        return []

    def update_weights_from_file(self, weights: WeightsFile, version: int) -> None:
        """Blocking, as the real one (callers run it in a thread)."""
        for replica in self.workers:
            load = replica.worker.update_weights_from_file(weights.path, version)
            asyncio.run_coroutine_threadsafe(load, self._loop).result(timeout=30)

    def shutdown(self) -> None:
        for replica in self.workers:
            replica.kill()
