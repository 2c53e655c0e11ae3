"""``RolloutFeed``: the fully async trainer's end of the rollout stream, every wait bounded.

    start()          the rollouter's ``run()`` in flight (its error surfaces in any wait)
    take(v)          R groups from the queue; while waiting, restarted replicas are given the
                     served weights (``ServedWeights.heal``); groups older than
                     ``max_staleness`` go back to the rollouter and are replaced
    within(ref, c)   the answer to rollouter call ``c`` within the sum of the deadlines of
                     what the call waits for (``RolloutDeadlines.call``: a sync phase's
                     checkpoint_engine.timeout_s, a validation's generation_timeout_s, ...)
    from_queue(r, c) the message queue's answer to ``c`` within checkpoint_engine.timeout_s
    pull_trace()     the rollouter's and its engines' trace events, never waited on mid-run

A wait past its deadline stops the run with a ``RunFailure`` naming what did not answer (the
busy replicas, the call and its deadline's keys), instead of hanging on a stuck process for
good; a ``RunFailure`` the rollouter raised (one of its own waits ran out) comes back as its
one line. ``RolloutAnswers`` is that bounded wait on its own, for the other users of the
rollouter's client (``ServedWeights``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fully_async_policy.deadlines import RolloutDeadlines
from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.served_weights import ServedWeights
from fully_async_policy.messages import EndOfStream, PromptGroup
from recipe.config import RecipeConfig
from recipe.faults import RunFailure, resume_hint
from recipe.observability.trace import Tracer, traced
from recipe.utils.ray_errors import remote_cause


class RolloutAnswers:
    """The trainer's waits on rollouter calls, each within its deadline (module docstring)."""

    def __init__(self, cfg: RecipeConfig, rollouter: RolloutClient, run_dir: Path) -> None:
        self.rollouter, self.waits, self.run_dir = rollouter, rollouter.waits, run_dir
        self.deadlines = RolloutDeadlines(cfg)

    def within(self, ref: Any, call: str) -> Any:
        """The result of ``ref``, the rollouter call ``call``, within
        ``deadlines.call(call)``; past it the run stops (``RunFailure``) naming the call,
        instead of waiting on a hung process for good."""
        deadline = self.deadlines.call(call)
        try:
            return self.waits.get(ref, timeout=deadline.seconds)
        except TimeoutError:  # Ray's GetTimeoutError is one
            raise RunFailure(
                f"the rollouter gave no answer to {call} within {deadline}: a hung rollouter "
                f"or engine process (rollout replica(s) {self.busy_replicas()} generating; "
                f"engine logs: RUN_DIR/engines/); {resume_hint(self.run_dir)}"
            ) from None
        except RunFailure as exc:
            cause = remote_cause(exc)
            if cause is exc:
                raise
            # Raised by the rollouter: its one line, not Ray's remote traceback.
            raise RunFailure(f"{cause}; {resume_hint(self.run_dir)}") from None

    def busy_replicas(self) -> str:
        """The replicas with groups generating, as the rollouter says within 10 s ("?" when
        it does not answer), for a deadline's message."""
        try:
            busy = self.waits.get(self.rollouter.busy_replicas(), timeout=10)
        except Exception:  # the rollouter itself does not answer
            busy = []
        return ", ".join(map(str, busy)) or "?"


class RolloutFeed:
    """Groups and answers from the rollouter within deadlines (module docstring)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        rollouter: RolloutClient,
        queue: QueueClient,
        served: ServedWeights,
        *,
        tracer: Tracer,
        run_dir: Path,
    ) -> None:
        self.cfg, self.rollouter, self.queue, self.served = cfg, rollouter, queue, served
        self.waits = rollouter.waits
        self.tracer, self.run_dir = tracer, run_dir
        self.answers = RolloutAnswers(cfg, rollouter, run_dir)
        self.wait_s = 0.0
        """Seconds spent waiting for groups so far."""
        self.run_ref: Any = None
        """The rollouter's ``run()`` in flight (``start``)."""
        self._replica_request: Any = None
        """Pending ``rollouter.wait_replica_request`` (a restarted replica wants weights)."""
        self._trace_ref: Any = None
        """The rollouter's trace drain in flight (``pull_trace``)."""

    def start(self) -> None:
        self.run_ref = self.rollouter.run()

    def take(self, num_groups: int, version: int) -> list[PromptGroup]:
        """``num_groups`` groups for a step of the trainer holding ``version``; groups older
        than ``max_staleness`` go back for re-admission and are replaced."""
        max_staleness = self.cfg.async_training.max_staleness
        groups: list[PromptGroup] = []
        while len(groups) < num_groups:
            got = self._get_batch(num_groups - len(groups), version)
            stale = {
                g.ticket
                for g in got
                if max_staleness is not None and version - g.min_version > max_staleness
            }
            if stale:
                back = [(g.ticket, g.prompt_uid) for g in got if g.ticket in stale]
                self.within(self.rollouter.readmit(back), "readmit")
            groups += [g for g in got if g.ticket not in stale]
        return groups

    @traced("wait_batch")
    def _get_batch(self, num_groups: int, version: int) -> list[PromptGroup]:
        start = time.perf_counter()
        deadline = start + self.cfg.rollout.generation_timeout_s
        ref = self.queue.get_batch(num_groups)
        while True:  # while waiting, bring restarted rollout replicas back into service
            if self._replica_request is None:
                self._replica_request = self.rollouter.wait_replica_request()
            waiting = [ref, self.run_ref, self._replica_request]
            left_s = max(deadline - time.perf_counter(), 0.0)
            ready = self.waits.first_ready(waiting, timeout=left_s)
            if not ready:
                raise self._no_batch(num_groups)
            if ref in ready or self.run_ref in ready:
                break
            self._replica_request = None
            self.served.heal(version)
        self.wait_s += time.perf_counter() - start
        if ref not in ready:
            self.within(self.run_ref, "run")  # raises the rollouter's error
            raise RuntimeError("the rollouter stopped while the trainer waited for groups")
        got = self.waits.get(ref)
        if isinstance(got, EndOfStream):  # the rollouter failed: its run() raises (its end
            self.within(self.run_ref, "run")  # is bounded: rollouter/stream.py)
            raise RuntimeError(f"the message queue closed with {got.num_left} groups left")
        return got

    def _no_batch(self, num_groups: int) -> RunFailure:
        """The failure of a batch wait past ``rollout.generation_timeout_s``: the rollouter
        runs, but no group finished (hung engine processes), naming the busy replicas."""
        timeout_s = self.cfg.rollout.generation_timeout_s
        return RunFailure(
            f"no batch of {num_groups} prompt groups within rollout.generation_timeout_s="
            f"{timeout_s:g} s (rollout replica(s) {self.answers.busy_replicas()} still generating: "
            "a hung engine process; its log is RUN_DIR/engines/replica_R.log)"
        )

    def within(self, ref: Any, call: str) -> Any:
        """The answer to the rollouter call ``call`` within its deadline
        (``RolloutAnswers.within``)."""
        return self.answers.within(ref, call)

    def from_queue(self, ref: Any, call: str) -> Any:
        """The answer to the message queue's ``call`` (one that never waits: stats, drain,
        close) within ``checkpoint_engine.timeout_s``; past it ``RunFailure`` names the
        queue and the call."""
        deadline = self.answers.deadlines.answer
        try:
            return self.waits.get(ref, timeout=deadline.seconds)
        except TimeoutError:
            raise RunFailure(
                f"the message queue gave no answer to {call} within {deadline}: a hung queue "
                f"actor; {resume_hint(self.run_dir)}"
            ) from None

    def pull_trace(self, *, wait: bool) -> list[dict[str, Any]]:
        """Events of the drain asked for at the previous step, if it is done, and the next
        drain asked for: the rollouter and its engines answer while they generate, so the
        trainer never waits on them between steps. ``wait`` (at the end): everything left."""
        events: list[dict[str, Any]] = []
        if self._trace_ref is not None:
            ready = self.waits.first_ready([self._trace_ref], timeout=30 if wait else 0)
            if not ready:
                return events
            ref, self._trace_ref = self._trace_ref, None
            events = self.waits.get(ref)  # a failed drain raises once: the next call asks anew
        self._trace_ref = self.rollouter.drain_trace()
        if wait:
            ref, self._trace_ref = self._trace_ref, None
            events += self.waits.get(ref, timeout=30)
        return events
