"""Built-in environments, named in ``rollout.multi_turn.environment``.

``calculator``: multi-step arithmetic with a one-operation calculator tool (``Calculator``),
on the ``calculator`` data task; ``python -m recipe env=calculator`` sets it all up (the data
task, the environment, the budgets and the tiny model warm-started on the format).

``retry``: a wrong answer gets feedback and another turn (``RetryWithFeedback``). It scores
with the reward registry's scorer of the record's ``data_source`` (the same scorer the
single-turn task uses), so it runs on any dataset the registry knows, the default
arithmetic one included: ``rollout.multi_turn.enable=true rollout.multi_turn.environment=retry``.

``tool_latency``: a fixed number of tool turns whose latency has a long tail
(``ToolLatency``), the multi-turn workload of ``recipe.tools.bench.e2e workload=multiturn``.

All three save their state (``state_dict``/``load_state_dict``), so a fully_async
checkpoint keeps their episodes in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any

from recipe.agent.episode import Observation
from recipe.agent.interface import Environment, StepResult
from recipe.data.calculator import calculator_step
from recipe.protocol import PromptRecord
from recipe.reward.registry import get_scorer


class Calculator(Environment):
    """Each model turn is a call (``A+B`` / ``A-B``, answered ``=VALUE``), a final answer (a
    bare integer: reward 1 when it equals the record's ground truth, else 0; the episode
    ends), or malformed (``=error``, a tool error). Calls score 0, so an episode that runs
    out of turns before answering has reward 0 from the environment itself. The tool is
    ``recipe.data.calculator.calculator_step``."""

    def __init__(self) -> None:
        self._truth: str | None = None
        self._calls = 0

    async def reset(self, record: PromptRecord) -> Observation:
        self._truth, self._calls = record.ground_truth.strip(), 0
        return record.prompt

    async def step(self, action: str) -> StepResult:
        assert self._truth is not None, "step() before reset()"
        step = calculator_step(action)
        if step.answer is not None:
            correct = str(step.answer) == self._truth
            info = {"calls": float(self._calls), "correct": float(correct)}
            return StepResult(reward=float(correct), done=True, info=info)
        self._calls += 1
        return StepResult(observation=step.observation, reward=0.0, tool_error=step.error)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self._calls}

    def load_state_dict(self, state: dict[str, Any], record: PromptRecord) -> None:
        self._truth, self._calls = record.ground_truth.strip(), int(state["calls"])


class RetryWithFeedback(Environment):
    """Up to ``max_attempts`` answers; the first right one ends the episode with reward
    ``decay ** (attempt - 1)``, a wrong one is answered with ``feedback`` (``{prompt}`` is
    the question again, for plain-string prompts), and the last wrong one ends it with 0."""

    def __init__(self, max_attempts: int = 3, decay: float = 0.5, feedback: str = "\n{prompt}"):
        if max_attempts < 1:
            raise ValueError(f"RetryWithFeedback(max_attempts={max_attempts}): allowed >= 1")
        if not 0 <= decay <= 1:
            raise ValueError(f"RetryWithFeedback(decay={decay}): allowed in [0, 1]")
        self.max_attempts, self.decay, self.feedback = max_attempts, decay, feedback
        self._record: PromptRecord | None = None
        self._attempt = 0

    async def reset(self, record: PromptRecord) -> Observation:
        self._record, self._attempt = record, 0
        return record.prompt

    async def step(self, action: str) -> StepResult:
        record = self._record
        assert record is not None, "step() before reset()"
        self._attempt += 1
        score = get_scorer(record.data_source)(
            record.data_source, action, record.ground_truth, record.extra_info
        )
        correct = float(score) >= 1.0
        info = {"attempts": float(self._attempt), "correct": float(correct)}
        if correct:
            return StepResult(reward=self.decay ** (self._attempt - 1), done=True, info=info)
        if self._attempt >= self.max_attempts:
            return StepResult(reward=0.0, done=True, info=info)
        question = record.prompt if isinstance(record.prompt, str) else "Wrong, try again."
        return StepResult(observation=self.feedback.format(prompt=question), info=info)

    def state_dict(self) -> dict[str, Any]:
        return {"attempt": self._attempt}

    def load_state_dict(self, state: dict[str, Any], record: PromptRecord) -> None:
        self._record, self._attempt = record, int(state["attempt"])


class ToolLatency(Environment):
    """``turns`` model turns, each answered after a tool latency drawn per (prompt, turn,
    episode): ``long_s`` with probability ``long_p``, else ``short_s`` (x uniform 0.5..1.5).
    No reward of its own: the reward function scores the episode's text."""

    _episodes: dict[str, int] = {}  # noqa: RUF012 - per-process draw counter, seeds only

    def __init__(
        self, turns: int = 3, short_s: float = 0.05, long_s: float = 1.0, long_p: float = 0.1
    ):
        if turns < 1 or short_s < 0 or long_s < 0 or not 0 <= long_p <= 1:
            raise ValueError(
                f"ToolLatency(turns={turns}, short_s={short_s}, long_s={long_s}, "
                f"long_p={long_p}): allowed turns >= 1, latencies >= 0, long_p in [0, 1]"
            )
        self.turns, self.short_s, self.long_s, self.long_p = turns, short_s, long_s, long_p
        self._rng = random.Random(0)
        self._taken = 0

    async def reset(self, record: PromptRecord) -> Observation:
        self._rng, self._taken = episode_rng(record.uid, ToolLatency._episodes), 0
        return record.prompt

    async def step(self, action: str) -> StepResult:
        self._taken += 1
        latency, long = draw_latency(self._rng, self.short_s, self.long_s, self.long_p)
        await asyncio.sleep(latency)
        info = {"latency_s": latency, "long": float(long)}
        if self._taken >= self.turns:
            return StepResult(done=True, info=info)
        return StepResult(observation=f" tool[{self._taken}]={len(action)}.", info=info)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self._rng.getstate()
        return {"taken": self._taken, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any], record: PromptRecord) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._taken = int(state["taken"])


def episode_rng(uid: str, counts: dict[str, int]) -> random.Random:
    """A generator seeded by the prompt and how many of its episodes ``counts`` has seen in
    this process (so the n episodes of a group draw differently, reproducibly)."""
    episode = counts.get(uid, 0)
    counts[uid] = episode + 1
    digest = hashlib.blake2b(f"{uid}/{episode}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def draw_latency(
    rng: random.Random, short_s: float, long_s: float, long_p: float
) -> tuple[float, bool]:
    """(seconds, long?): ``long_s`` with probability ``long_p``, else ``short_s``, times a
    uniform 0.5..1.5."""
    long = rng.random() < long_p
    return (long_s if long else short_s) * rng.uniform(0.5, 1.5), long
