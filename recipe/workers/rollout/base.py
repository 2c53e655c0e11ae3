"""The rollout worker contract: one engine, one prompt group per ``generate`` call.

A ``RolloutWorker`` owns one generation engine (vLLM or transformers) and is driven by the
rollouter, usually as a Ray actor called through ``ReplicaClient`` (client.py); it is a plain class
so tests can also drive it in-process. Rewards are not computed here: the caller scores the
returned trajectories.

State machine and its invariant::

    RUNNING --pause()--> PAUSED --resume()--> RUNNING        any --shutdown()--> CLOSED
                           |
                           +-- update_weights_from_file(): load, bump version (stays PAUSED)
                           +-- commit_weights(): load a verified push, bump version (same)

    Invariant: weights change only while PAUSED with no engine request in flight, so all
    tokens of one engine request come from one weights version, the one stamped on them.

``pause()`` aborts what is in flight: each response cut short comes back from its
``generate`` call with ``finish_reason="aborted"`` and the tokens it had. Passing that group
back as ``GenerationRequest.resume`` continues each aborted response from prompt + partial
tokens with the remaining token budget; the new tokens carry the new version (partial
rollout), and responses that had already finished pass through unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from recipe.agent.context import EpisodeCut
from recipe.checkpoint_engine.host import export_node_id
from recipe.observability.request_trace import RequestTrace
from recipe.protocol import Trajectory
from recipe.utils.weights_file import verify_weights_file
from recipe.workers.rollout.requests import GenerationRequest, unstarted_group

logger = logging.getLogger(__name__)


class RolloutWorker(ABC):
    """One generation engine behind a small async surface (see the module docstring)."""

    keeps_choices: ClassVar[bool] = False
    """Whether its engine keeps responses to ``GenerationRequest.choices`` (constrained
    decoding); a worker that cannot refuses such a request rather than ignore it."""

    def __init__(self) -> None:
        export_node_id()  # the engine's processes, started next, learn this Ray node
        self._version = 0
        self._paused = False
        self._closed = False
        # Set while RUNNING; generate() waits on it so a paused worker starts no new work.
        self._running = asyncio.Event()
        self._running.set()
        self._episodes_cut = asyncio.Event()  # set by cut_episodes(): waiting episodes end
        self._requests = RequestTrace()  # one trace slice per generate() call
        self._num_finished = 0  # responses that ended at EOS or their budget (not aborted)

    @property
    def version(self) -> int:
        """The weights version served; starts at 0."""
        return self._version

    def get_version(self) -> int:
        """``version`` as a method, for Ray callers (actor properties are not remote)."""
        return self._version

    def is_paused(self) -> bool:
        return self._paused

    async def wait_until_running(self) -> None:
        """Return once the worker is RUNNING (at once if it is); ``EpisodeCut`` when
        ``cut_episodes`` ends the wait instead."""
        while self._paused:
            if self._episodes_cut.is_set():
                raise EpisodeCut("the rollout worker stopped while the episode waited")
            running = asyncio.ensure_future(self._running.wait())
            cut = asyncio.ensure_future(self._episodes_cut.wait())
            _, pending = await asyncio.wait({running, cut}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            self._check_open()

    async def cut_episodes(self) -> None:
        """End what waits for this PAUSED worker, and what comes to wait before the next
        ``resume``: multi-turn episodes (after their environment step) finish as ``aborted``
        (with their state, when their environment saves one); ``generate`` calls that came
        after the pause return their group as it was, unstarted (``unstarted_group``: a pause
        that overtook the call cuts it at its first token). The next ``resume`` lets new
        calls wait again."""
        self._check_open()
        if self._paused:
            self._episodes_cut.set()

    async def check_health(self) -> None:
        """Return if the engine can serve; raise if it cannot (e.g. its process died). The
        caller restarts a worker that raises here (fully_async_policy/rollouter/replicas.py)."""
        self._check_open()
        await self._check_engine()

    async def _check_engine(self) -> None:  # noqa: B027 - optional hook
        """Raise if the engine is dead (in-process engines cannot die on their own)."""

    def process_ids(self) -> dict[str, Any]:
        """This worker's process id and those of the processes it started (engine cores)."""
        import os

        try:
            import psutil  # comes with vLLM and Ray; without it, no children are listed
        except ImportError:
            return {"worker": os.getpid(), "engine": []}
        children = psutil.Process().children(recursive=True)
        return {"worker": os.getpid(), "engine": [child.pid for child in children]}

    async def generate(self, request: GenerationRequest) -> list[Trajectory]:
        """Generate one group; returns when every response finished or was aborted.

        Waits first while the worker is paused, unless ``cut_episodes`` ends the wait or the
        request is ``cut_if_paused``. The result is ordered by ``sample_index``.
        """
        self._check_open()
        if request.choices is not None and not self.keeps_choices:
            raise ValueError(
                f"GenerationRequest.choices needs a worker that keeps to them: "
                f"{type(self).__name__} cannot (rollout.backend=vllm can)"
            )
        if self._paused and request.cut_if_paused:
            return unstarted_group(request)
        try:
            await self.wait_until_running()
        except EpisodeCut:  # the run stops (cut_episodes) while this call waited
            return unstarted_group(request)
        start_us, slot = self._requests.begin()
        try:
            trajectories = await self._generate_group(request)
        finally:
            self._requests.end(slot)
        self._requests.generated(request, trajectories, start_us, slot)
        self._num_finished += sum(t.finish_reason != "aborted" for t in trajectories)
        return trajectories

    def engine_failure(self) -> dict[str, Any]:
        """What the engine left behind when it failed: ``error``, its root error line
        (``"Type: message"``, None if unknown), ``log``, the engine's log file (None if it
        has none), and ``num_finished``, the responses it completed before."""
        error, log = self._engine_error()
        return {"error": error, "log": log, "num_finished": self._num_finished}

    def _engine_error(self) -> tuple[str | None, str | None]:
        """(root error, log path) of a failed engine; in-process engines raise their own."""
        return None, None

    def drain_trace(self, replica: int) -> list[dict[str, Any]]:
        """Trace slices of the requests finished since the last call, as engine ``replica``
        (``recipe.observability.trace``)."""
        return self._requests.drain(replica)

    async def pause(self) -> None:
        """Stop scheduling; abort in-flight responses (they return as ``aborted`` partials).

        Returns once nothing is in flight. Idempotent.
        """
        self._check_open()
        if self._paused:
            return
        self._paused = True
        self._running.clear()
        await self._abort_in_flight()
        logger.info("rollout worker paused at version %d", self._version)

    async def resume(self) -> None:
        """Start scheduling again; generate() calls waiting on the pause go ahead."""
        self._check_open()
        self._paused = False
        self._episodes_cut.clear()
        self._running.set()

    async def update_weights_from_file(
        self, path: str, version: int, *, sha256: str | None = None
    ) -> None:
        """Load a safetensors file of full HF-named tensors, then serve it as ``version``.

        ``sha256``: the checksum its writer recorded (``recipe.utils.weights_file``); the file
        is verified against it first, while the worker still serves, and refused
        (``WeightsFileError``) when this node sees another file. A running worker is paused
        around the load and resumed after it; a failed load leaves the worker paused (never
        serving half-updated weights) and raises.
        """
        self._check_open()
        if version <= self._version:
            raise ValueError(
                f"update_weights_from_file(version={version}): versions must increase "
                f"(serving {self._version})"
            )
        if sha256 is not None:
            await asyncio.to_thread(verify_weights_file, path, sha256)
        was_running = not self._paused
        await self.pause()
        await self._load_weights(path)
        self._version = version
        logger.info("rollout worker serves version %d from %s", version, path)
        if was_running:
            await self.resume()

    # ---- pushed weights (recipe.checkpoint_engine) ---------------------------------------

    async def weight_receiver_call(self, method: str, *args: Any) -> list[Any]:
        """``WeightReceiver.<method>(*args)`` on each engine worker, in local-rank order.

        ``receive`` fills a staging buffer, never the live weights, so it may run while the
        worker generates (the engine runs it between two of its steps); only
        ``commit_weights`` needs the worker PAUSED.
        """
        self._check_open()
        from recipe.checkpoint_engine.base import raise_wire_error

        return [raise_wire_error(result) for result in await self._receiver_call(method, args)]

    async def commit_weights(self, version: int, transfer_id: int) -> dict[str, Any]:
        """Load the verified push ``transfer_id`` from staging, reset caches, then serve
        ``version``. Needs PAUSED and stays PAUSED; a failure keeps the old version."""
        self._check_open()
        if not self._paused:
            raise RuntimeError(f"{type(self).__name__}: commit pushed weights only while paused")
        if version <= self._version:
            raise ValueError(
                f"commit_weights(version={version}): versions must increase "
                f"(serving {self._version})"
            )
        from recipe.checkpoint_engine.base import raise_wire_error

        reports = [raise_wire_error(r) for r in await self._receiver_call("load", (transfer_id,))]
        await self._after_weights_loaded()
        self._version = version
        logger.info("rollout worker serves pushed version %d (transfer %d)", version, transfer_id)
        return reports[0]

    async def _receiver_call(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        """Run a ``WeightReceiver`` method where this engine's weights live."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive pushed weights")

    async def _after_weights_loaded(self) -> None:  # noqa: B027 - optional hook
        """Drop state computed by the old weights (KV and prefix caches)."""

    async def shutdown(self) -> None:
        """Abort what is in flight and release the engine. Idempotent."""
        if self._closed:
            return
        if not self._paused:
            try:
                await self.pause()
            except Exception:  # a dead engine cannot pause: it is closed all the same
                logger.info("pausing before shutdown failed; closing anyway", exc_info=True)
        self._closed = True
        self._running.set()  # wake waiters so they fail with "closed"
        await self._close_engine()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is shut down")

    @abstractmethod
    async def _generate_group(self, request: GenerationRequest) -> list[Trajectory]:
        """Run one group on the engine (the worker is RUNNING when this starts)."""

    @abstractmethod
    async def _abort_in_flight(self) -> None:
        """Abort every in-flight response and return once their generate() calls have them."""

    @abstractmethod
    async def _load_weights(self, path: str) -> None:
        """Copy the file's tensors into the engine (called while PAUSED, nothing in flight)."""

    @abstractmethod
    async def _close_engine(self) -> None:
        """Release the engine's processes and memory."""
