"""Deadlines of the fully async recipe's waits: each wait is bounded by the deadline of what
it waits for, and the trainer's wait on a rollouter call by the sum of that call's own waits.

    the rollouter waits for                                 deadline (config key)
    a validation run to finish                              rollout.generation_timeout_s
    its groups in flight to finish (partial_rollout=false)  rollout.generation_timeout_s
    each replica to pause, resume or cut its episodes       checkpoint_engine.timeout_s
    groups cut by a pause (or by the end) to come back      checkpoint_engine.timeout_s, plus
                                                            the environment step an episode
                                                            may be in (multi_turn.step_timeout_s;
                                                            an agent's: agent_timeout_s)
    the message queue (a put at the end, close, snapshot)   checkpoint_engine.timeout_s
    every engine to load a weights file (a resume)          rollout.start_timeout_s

    the trainer waits for a rollouter call                  the sum of that call's waits above,
                                                            plus checkpoint_engine.timeout_s
                                                            for the answer (``call``)

The rollouter's own deadlines fire first and name the wait (``bounded``): "hold_for_sync: the
validation of version 3 did not finish within rollout.generation_timeout_s=1800 s". The
trainer's is the backstop for a rollouter that does not answer at all. The long waits of a
sync (validation, draining) run in ``hold_for_sync``, before ``begin_sync`` pauses the
engines, so the pause itself stays a sync phase: a hung engine is caught there within
``checkpoint_engine.timeout_s``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from recipe.config import RecipeConfig
from recipe.faults import RunFailure

T = TypeVar("T")

Within = Callable[[Any, str], Any]
"""``within(ref, call)``: the result of the rollouter call ``call`` within its deadline, else
a ``RunFailure`` naming it (``RolloutAnswers.within``, driver/feed.py)."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """Seconds a wait may take: a sum of config values, named by their keys in a failure."""

    parts: tuple[tuple[str, float], ...] = ()
    """(config key, seconds) of each term; empty: no wait at all (0 s)."""

    @classmethod
    def of(cls, key: str, seconds: float) -> Deadline:
        return cls(((key, float(seconds)),))

    @property
    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.parts)

    def __add__(self, other: Deadline) -> Deadline:
        return Deadline(self.parts + other.parts)

    def __str__(self) -> str:
        terms = [
            f"{key}={seconds:g} s" if num == 1 else f"{num} x {key}={seconds:g} s"
            for (key, seconds), num in Counter(self.parts).items()
        ]
        if len(self.parts) == 1:
            return terms[0]
        return f"{' + '.join(terms)} = {self.seconds:g} s"


NO_WAIT = Deadline()


async def bounded(awaitable: Awaitable[T], deadline: Deadline, what: str) -> T:
    """``awaitable``'s result within ``deadline``; past it, it is cancelled and ``RunFailure``
    says "``what`` did not finish within ``deadline``". Its own errors pass through (a
    ``TimeoutError`` of its own is not taken for this deadline)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=deadline.seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise RunFailure(f"{what} did not finish within {deadline}")
    return task.result()


class RolloutDeadlines:
    """The deadline of each wait of the fully async rollouter and of the trainer's wait on
    each rollouter call, from the run's config (module docstring)."""

    def __init__(self, cfg: RecipeConfig) -> None:
        rollout, multi_turn = cfg.rollout, cfg.rollout.multi_turn
        self.answer = Deadline.of("checkpoint_engine.timeout_s", cfg.checkpoint_engine.timeout_s)
        """A replica's pause, resume or cut (each), a message queue call, a call's answer."""
        self.generation = Deadline.of("rollout.generation_timeout_s", rollout.generation_timeout_s)
        """A validation run; the groups in flight finishing on the old weights."""
        self.weights_load = Deadline.of("rollout.start_timeout_s", rollout.start_timeout_s)
        """Every engine loading a weights file (a whole model from disk, as at its start)."""
        self.cut_back = self.answer
        """Groups cut by a pause, or by the end of the run, coming back to the rollouter."""
        if multi_turn.enable:  # an episode is cut after the environment step it may be in
            step = (
                Deadline.of("rollout.multi_turn.agent_timeout_s", multi_turn.agent_timeout_s)
                if multi_turn.endpoint_agent
                else Deadline.of("rollout.multi_turn.step_timeout_s", multi_turn.step_timeout_s)
            )
            self.cut_back = step + self.answer
        self._calls = self._call_waits(cfg)

    def call(self, name: str) -> Deadline:
        """The trainer's deadline for the rollouter call ``name``: the sum of its waits, plus
        the answer itself; ``KeyError`` for a call not listed."""
        return self._calls[name] + self.answer

    def _call_waits(self, cfg: RecipeConfig) -> dict[str, Deadline]:
        """What each call on the rollouter (rollouter/actor.py) may wait for, in order."""
        multi_turn = cfg.rollout.multi_turn.enable
        partial = cfg.async_training.partial_rollout
        pause = self.answer  # every replica at once, each within it
        validation = self.generation if cfg.trainer.test_freq > 0 else NO_WAIT
        restart = Deadline.of("ray.placement_timeout_s", cfg.ray.placement_timeout_s)
        restart += Deadline.of("rollout.start_timeout_s", cfg.rollout.start_timeout_s) + pause
        # The stream's end: the groups cut come back, the last releases go into the queue,
        # and (after a failure) the queue is closed.
        stream_end = self.cut_back + self.answer + self.answer
        cut_episodes = pause + pause + self.cut_back if multi_turn else NO_WAIT
        hold = validation + (NO_WAIT if partial else self.generation)
        begin = pause + (self.cut_back if partial and not multi_turn else NO_WAIT)
        return {
            "open_sync": hold + begin + pause,  # the health checks: each within the answer
            "hold_for_sync": hold,
            "begin_sync": begin,
            "resume_engines": pause,
            "end_sync": pause,
            "snapshot": cut_episodes + self.answer,
            "stop": validation + pause + (pause if multi_turn else NO_WAIT) + stream_end + pause,
            "run": stream_end,
            "validate": validation + self.generation,
            "load_weights": self.weights_load,
            "recover_replicas": restart,
            "install_weights": self.weights_load + pause,
            "engine_workers": NO_WAIT,
            "readmit": NO_WAIT,
            "restore": NO_WAIT,
            "poll": NO_WAIT,
        }
