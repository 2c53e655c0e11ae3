"""The default agent loop: drive an ``Environment`` turn by turn.

    obs = reset(record) -> prompt        (a continued episode: load_state_dict instead)
    repeat: action = model turn          (None: a budget is spent -> "length")
            result = step(action)
            reward += result.reward; done -> "stop"; else append result.observation

An environment that raises, whose ``reset``/``step`` runs past ``step_timeout_s``, or whose step
reward is not a finite number (NaN, inf, a string: logged, naming it and the value) ends its
episode as ``env_error`` with the error on the episode: it is not trained on (masked out of the
loss and out of its group's baseline), counted (``agent/env_errors``, ``agent/env_timeouts``)
and counts toward ``max_env_error_ratio``; nothing else is affected. A tool failure the
environment reports itself (``StepResult.tool_error``) is part of the episode the model
learns from. ``reset``/``step`` written as plain (blocking) functions run in a worker thread;
one past its deadline cannot be stopped: it is abandoned, logged once, and finishes in the
background. ``SingleTurnEnvironment`` is
the one-step case: the prompt, one model turn, done, scored by the reward function.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from recipe.agent.context import AgentContext, EnvRewardError, EnvTimeoutError
from recipe.agent.interface import AgentLoop, Environment, Observation, StepResult
from recipe.protocol import PromptRecord
from recipe.utils.ray_errors import error_line

logger = logging.getLogger(__name__)


class EnvironmentLoop(AgentLoop):
    """Runs one ``Environment`` episode per ``run`` (see the module docstring)."""

    def __init__(self, environment: Environment):
        self.environment = environment

    async def run(self, ctx: AgentContext, record: PromptRecord) -> None:
        """``ctx`` already started: an episode continued from a checkpoint, its environment
        restored (``load_state_dict``) instead of reset."""
        if ctx.tokens is None:
            try:
                first = await ctx.call_env(_call(self.environment.reset, record))
            except Exception as exc:  # the environment's failure ends only its own episode
                ctx.start(record.prompt)  # so the failed episode still has a sequence
                self._failed(ctx, "reset", exc)
                return
            ctx.start(first)
        while True:
            action = await ctx.generate()
            if action is None:
                return  # a budget is spent: "length"
            result = await self._step(ctx, action)
            if result is None:
                return
            if result.reward is not None and not self._add_reward(ctx, result.reward):
                return
            ctx.add_info(result.info)
            if result.done:
                ctx.finish("stop")
                return
            if result.observation and not ctx.append_observation(result.observation):
                return  # no room for another observation and turn: "length"

    async def _step(self, ctx: AgentContext, action: str) -> StepResult | None:
        """One environment step; None when the environment failed (the episode is over)."""
        ctx.num_tool_calls += 1
        try:
            result = await ctx.call_env(_call(self.environment.step, action))
        except Exception as exc:
            self._failed(ctx, "step", exc)
            return None
        if not isinstance(result, StepResult):
            ctx.finish(
                "env_error",
                f"step returned {type(result).__name__}, expected recipe.agent.StepResult",
            )
            return None
        ctx.num_tool_errors += int(result.tool_error)
        return result

    def _add_reward(self, ctx: AgentContext, reward: float) -> bool:
        """Add the step's reward; False when it is not a finite number, a fault of the
        environment that ends its episode as ``env_error`` (logged, naming it and the value)."""
        try:
            ctx.add_reward(reward)
        except EnvRewardError as exc:
            logger.warning(
                "%s.step: %s; the episode ends as env_error",
                type(self.environment).__name__,
                exc,
            )
            self._failed(ctx, "step", exc)
            return False
        return True

    def _failed(self, ctx: AgentContext, call: str, exc: Exception) -> None:
        """End the episode as ``env_error``; a call past its deadline is also logged, as its
        thread (a blocking environment) runs on unseen otherwise."""
        if isinstance(exc, EnvTimeoutError):
            ctx.timed_out = True
            logger.warning(
                "%s.%s: %s; the episode ends as env_error (a blocking call's thread is "
                "abandoned and finishes in the background)",
                type(self.environment).__name__,
                call,
                exc,
            )
        ctx.finish("env_error", f"{call}: {error_line(exc)}")


def _call(method: Callable[[Any], Any], arg: Any) -> Awaitable[Any]:
    """``method(arg)`` as an awaitable: a coroutine method runs on the event loop, a plain
    (blocking) one in a worker thread, so it never stalls other episodes or the engine. A
    thread past ``step_timeout_s`` is abandoned, not stopped: it finishes in the background."""
    if inspect.iscoroutinefunction(method):
        return method(arg)
    return asyncio.to_thread(method, arg)


class SingleTurnEnvironment(Environment):
    """The prompt, one model turn, done; the reward function scores the response."""

    async def reset(self, record: PromptRecord) -> Observation:
        return record.prompt

    async def step(self, action: str) -> StepResult:
        return StepResult(done=True)
