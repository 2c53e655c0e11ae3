"""The rollout worker contract: one engine, one prompt group per ``generate`` call.

A ``RolloutWorker`` owns one generation engine (vLLM or transformers) and is driven by the
rollouter, usually as a Ray actor (``ray.remote(num_cpus=...)(Worker)``); it is a plain class
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
import hashlib
import logging
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from recipe.agent.context import EpisodeCut
from recipe.observability.trace import RequestTrace
from recipe.protocol import PromptRecord, Trajectory

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GenerationRequest:
    """One prompt group to generate: ``n`` responses to ``prompt_ids``."""

    prompt_uid: str
    """The prompt's uid; becomes every trajectory's ``prompt_uid`` (the GRPO group id)."""
    prompt_ids: list[int]
    """Prompt token ids (after the chat template), length P."""
    n: int
    """Responses in the group."""
    max_tokens: int
    """Max response tokens per response, counting tokens of a resumed partial."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = -1
    """Top-k cut-off; -1 disables it."""
    seed: int | None = None
    """Base sampling seed (response i uses a seed derived from it and i); None: unseeded."""
    resume: list[Trajectory] | None = None
    """A group returned earlier (length ``n``): aborted members continue, others pass through."""
    sample_max_tokens: list[int] | None = None
    """Per-response token budgets (length ``n``, each in 1..``max_tokens``); None: all
    ``max_tokens``."""
    ignore_eos: bool = False
    """Keep generating past EOS until the budget is spent (fixed-length benchmark workloads)."""
    record: PromptRecord | None = None
    """The prompt's record; with ``rollout.multi_turn.enable`` each response is an episode
    of the environment started from it (``recipe.agent``), ``max_tokens`` its budget of
    tokens after the prompt."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"GenerationRequest({self.prompt_uid!r}).prompt_ids is empty")
        if self.n < 1:
            raise ValueError(f"GenerationRequest.n={self.n} is invalid: allowed >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"GenerationRequest.max_tokens={self.max_tokens}: allowed >= 1")
        if self.temperature < 0:
            raise ValueError(f"GenerationRequest.temperature={self.temperature}: allowed >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"GenerationRequest.top_p={self.top_p}: allowed in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"GenerationRequest.top_k={self.top_k}: allowed -1 or >= 1")
        if self.resume is not None:
            self._check_resume(self.resume)
        if self.sample_max_tokens is not None and (
            len(self.sample_max_tokens) != self.n
            or not all(1 <= m <= self.max_tokens for m in self.sample_max_tokens)
        ):
            raise ValueError(
                f"GenerationRequest.sample_max_tokens={self.sample_max_tokens}: expected "
                f"n={self.n} budgets in 1..{self.max_tokens}"
            )

    def budget(self, sample_index: int) -> int:
        """Max response tokens of response ``sample_index``."""
        if self.sample_max_tokens is None:
            return self.max_tokens
        return self.sample_max_tokens[sample_index]

    def _check_resume(self, resume: list[Trajectory]) -> None:
        if len(resume) != self.n:
            raise ValueError(
                f"GenerationRequest.resume has {len(resume)} trajectories, expected n={self.n}"
            )
        for traj in resume:
            if traj.prompt_uid != self.prompt_uid or traj.prompt_ids != self.prompt_ids:
                raise ValueError(
                    f"GenerationRequest.resume: trajectory {traj.sample_index} belongs to "
                    f"prompt {traj.prompt_uid!r}, not to {self.prompt_uid!r}"
                )


@dataclass(slots=True)
class SampleJob:
    """One response still to generate: a fresh sample or the continuation of a partial."""

    sample_index: int
    """Index within the group."""
    context_ids: list[int]
    """Engine input: prompt ids + the partial's response ids."""
    max_new_tokens: int
    """Remaining token budget (>= 1)."""
    seed: int | None
    """Per-response sampling seed, distinct per sample and per resume point."""
    partial: Trajectory | None
    """The aborted trajectory this job continues, or None for a fresh sample."""


def sample_seed(base: int | None, sample_index: int, num_done_tokens: int) -> int | None:
    """A 31-bit seed distinct per (base, sample, resume point), stable across processes."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}/{sample_index}/{num_done_tokens}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


def longtail_lengths(seed: int, n: int, max_tokens: int) -> list[int]:
    """``n`` response budgets with a long tail, deterministic in ``seed``: with probability
    0.1 a budget is uniform in [0.75, 1] x ``max_tokens``, else uniform in [1/32, 1/8] x
    ``max_tokens`` (mean ~0.16 x ``max_tokens``; a batch's slowest response is ~6x its mean)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        low, high = (0.75, 1.0) if rng.random() < 0.1 else (1 / 32, 1 / 8)
        out.append(max(1, min(max_tokens, round(max_tokens * rng.uniform(low, high)))))
    return out


def plan_group(request: GenerationRequest) -> list[SampleJob | Trajectory]:
    """Per sample index: a job to run, or a finished trajectory that passes through."""
    if request.resume is None:
        return [
            SampleJob(
                i,
                list(request.prompt_ids),
                request.budget(i),
                sample_seed(request.seed, i, 0),
                None,
            )
            for i in range(request.n)
        ]
    plan: list[SampleJob | Trajectory] = []
    for traj in request.resume:
        remaining = request.budget(traj.sample_index) - traj.num_response_tokens
        if traj.finish_reason != "aborted":
            plan.append(traj)
        elif remaining <= 0:
            # The budget ran out exactly at the cut: the response is complete.
            plan.append(_replace_finish(traj, "length"))
        else:
            seed = sample_seed(request.seed, traj.sample_index, traj.num_response_tokens)
            context = list(traj.prompt_ids) + list(traj.response_ids)
            plan.append(SampleJob(traj.sample_index, context, remaining, seed, traj))
    return plan


def _replace_finish(traj: Trajectory, finish_reason: str) -> Trajectory:
    return Trajectory(
        prompt_uid=traj.prompt_uid,
        sample_index=traj.sample_index,
        prompt_ids=traj.prompt_ids,
        response_ids=traj.response_ids,
        rollout_logprobs=traj.rollout_logprobs,
        token_versions=traj.token_versions,
        finish_reason=finish_reason,
        reward=0.0,
        response_text=traj.response_text,
    )


def finish_job(
    request: GenerationRequest,
    job: SampleJob,
    new_ids: list[int],
    new_logprobs: list[float],
    new_versions: list[int],
    finish_reason: str,
    tokenizer: Any,
) -> Trajectory:
    """Join a job's new tokens onto its partial (if any) into one trajectory, text decoded."""
    prior = job.partial
    response_ids = (list(prior.response_ids) if prior else []) + new_ids
    return Trajectory(
        prompt_uid=request.prompt_uid,
        sample_index=job.sample_index,
        prompt_ids=list(request.prompt_ids),
        response_ids=response_ids,
        rollout_logprobs=(list(prior.rollout_logprobs) if prior else []) + new_logprobs,
        token_versions=(list(prior.token_versions) if prior else []) + new_versions,
        finish_reason=finish_reason,
        response_text=tokenizer.decode(response_ids, skip_special_tokens=True),
    )


class RolloutWorker(ABC):
    """One generation engine behind a small async surface (see the module docstring)."""

    def __init__(self) -> None:
        self._version = 0
        self._paused = False
        self._closed = False
        # Set while RUNNING; generate() waits on it so a paused worker starts no new work.
        self._running = asyncio.Event()
        self._running.set()
        self._cut = asyncio.Event()  # set by cut_episodes(): waiting episodes end
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
            if self._cut.is_set():
                raise EpisodeCut("the rollout worker stopped while the episode waited")
            running = asyncio.ensure_future(self._running.wait())
            cut = asyncio.ensure_future(self._cut.wait())
            _, pending = await asyncio.wait({running, cut}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            self._check_open()

    async def cut_episodes(self) -> None:
        """End the multi-turn episodes waiting for this PAUSED worker (they finish as
        ``aborted``); the next ``resume`` lets new episodes wait again."""
        self._check_open()
        if self._paused:
            self._cut.set()

    async def check_health(self) -> None:
        """Return if the engine can serve; raise if it cannot (e.g. its process died). The
        caller restarts a worker that raises here (fully_async_policy/replicas.py)."""
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

        Waits first while the worker is paused. The result is ordered by ``sample_index``.
        """
        self._check_open()
        while self._paused:
            await self._running.wait()
            self._check_open()
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
        self._cut.clear()
        self._running.set()

    async def update_weights_from_file(self, path: str, version: int) -> None:
        """Load a safetensors file of full HF-named tensors, then serve it as ``version``.

        A running worker is paused around the load and resumed after it; a failed load
        leaves the worker paused (never serving half-updated weights) and raises.
        """
        self._check_open()
        if version <= self._version:
            raise ValueError(
                f"update_weights_from_file(version={version}): versions must increase "
                f"(serving {self._version})"
            )
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
