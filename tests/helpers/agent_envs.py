"""Environments the integration tests load by file path (``rollout.multi_turn.environment``),
as a user's environment file would be."""

from __future__ import annotations

import asyncio
import zlib

from recipe.agent import Environment, StepResult

PATH = __file__


class FixedTurns(Environment):
    """Answers every turn with `` obs<k>:`` until ``turns`` model turns were taken, then ends
    with reward 1; a short sleep per step stands in for a tool's latency, a long one
    (``slow_s``) for the prompts of every third uid (by hash), so some groups are still
    running when the others are done."""

    def __init__(self, turns: int = 3, step_s: float = 0.01, slow_s: float | None = None):
        self.turns, self.step_s, self.slow_s = turns, step_s, slow_s
        self._taken, self._slow = 0, False

    async def reset(self, record):
        self._taken = 0
        self._slow = self.slow_s is not None and zlib.crc32(record.uid.encode()) % 3 == 0
        return record.prompt

    async def step(self, action):
        self._taken += 1
        if self._taken >= self.turns:  # the answer: scored at once
            return StepResult(reward=1.0, done=True)
        await asyncio.sleep(self.slow_s if self._slow else self.step_s)
        return StepResult(observation=f" obs{self._taken}:")


class SavedTurns(FixedTurns):
    """``FixedTurns`` that saves its state: a checkpoint keeps its episodes in flight."""

    def state_dict(self):
        return {"taken": self._taken, "slow": self._slow}

    def load_state_dict(self, state, record):
        self._taken, self._slow = state["taken"], state["slow"]


class HalfSaved(FixedTurns):
    """Saves its state but cannot load it: rejected at startup."""

    def state_dict(self):
        return {"taken": self._taken}


class UnsaveableTurns(SavedTurns):
    """Its state is not JSON: a checkpoint starts its episodes again."""

    def state_dict(self):
        return {"taken": object()}


class UnloadableTurns(SavedTurns):
    """Rejects its saved state: the continued episode ends as ``env_error``."""

    def load_state_dict(self, state, record):
        raise KeyError("taken")
