"""What users write for multi-turn rollouts: an ``Environment`` (most users) or an
``AgentLoop`` (full control), and what the framework gives them back.

    prompt record --reset--> observation --render--> prompt ids
         +--> model turn (ctx.generate) --> action text --step--> observation, reward, done
         |                                                             |
         +------------------- not done: observation rendered, appended (mask 0) <--+

An ``Environment`` owns its tools: a tool call is an action the environment parses and
answers with an observation. Observations are text, or chat messages rendered by the model's
chat template as a delta after what came before (``recipe.agent.render``). Rewards may come
per step (summed) or at the end; an episode whose environment gives none is scored by the
reward function (``reward.*``), like a single-turn response.

An ``AgentLoop`` drives the engine itself through an ``AgentContext``
(``recipe.agent.context``): ``await ctx.generate()`` for the next model turn and
``ctx.append_observation(...)`` for environment tokens. The default loop,
``recipe.agent.env_loop.EnvironmentLoop``, drives an ``Environment``; single-turn prompts
are its one-step case.

Both are loaded from the config by import path (``rollout.multi_turn.environment`` /
``rollout.multi_turn.agent_loop``: ``FILE.py:Class`` or ``package.module:Class``), built
once per rollout worker with the keyword arguments of ``..._kwargs``; ``reset`` starts a
fresh episode, so one environment object serves one episode at a time and the worker builds
one per concurrent episode.

Checkpoints (``mode=fully_async``): an environment that implements ``state_dict`` and
``load_state_dict`` has its episodes in flight saved mid-way (the tokens so far, the
context's counters and its state) and continued after a resume; one that does not has them
started again from scratch (``prompts/readmitted``). A custom ``AgentLoop`` is a coroutine
the framework cannot re-enter, so its episodes always start again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from recipe.agent.context import AgentContext
from recipe.agent.episode import Observation
from recipe.protocol import PromptRecord


@dataclass(slots=True)
class StepResult:
    """What an environment returns for one action."""

    observation: Observation | None = None
    """Shown to the model before its next turn; None or empty: nothing is appended."""
    reward: float | None = None
    """Reward of this step (summed over the episode); None: no reward for this step."""
    done: bool = False
    """The episode ends after this step."""
    info: dict[str, Any] = field(default_factory=dict)
    """Numbers to log as ``agent/info/<key>`` (means over the step's episodes)."""
    tool_error: bool = False
    """The action called a tool that failed; the observation says so (counted as
    ``agent/tool_errors``)."""


class Environment(ABC):
    """One episode at a time: ``reset`` then ``step`` until ``done`` (see module docstring).

    Methods are coroutines, or plain functions when they block (a subprocess, a sandbox, a
    synchronous client): those run in a worker thread, so they never block other episodes
    or the engine. Raising from ``reset`` or ``step``, or running past
    ``rollout.multi_turn.step_timeout_s``, ends the episode with finish reason ``env_error``
    (counted, not trained on); it does not stop the run unless more than
    ``rollout.multi_turn.max_env_error_ratio`` of a step's episodes fail.
    """

    @abstractmethod
    async def reset(self, record: PromptRecord) -> Observation:
        """Start an episode for ``record``; returns the first observation (the prompt)."""

    @abstractmethod
    async def step(self, action: str) -> StepResult:
        """Answer the model's turn ``action`` (its decoded text)."""

    # Optional, both or neither: an environment that saves its state lets a checkpoint keep
    # its episodes in flight; one that does not has them started again from scratch.

    def state_dict(self) -> dict[str, Any]:
        """This episode's state between two steps, as JSON values (dicts, lists, strings,
        numbers). Called only while no ``reset``/``step`` runs, before the next model turn."""
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any], record: PromptRecord) -> None:
        """Continue the episode of ``record`` from ``state`` (what ``state_dict`` returned),
        on a fresh object instead of ``reset``; the next call is ``step``."""
        raise NotImplementedError


def saves_state(cls: type[Environment]) -> bool:
    """Whether ``cls`` implements the optional state hooks; ``ValueError`` when it
    implements only one of them."""
    own = [
        name
        for name in ("state_dict", "load_state_dict")
        if getattr(cls, name) is not getattr(Environment, name)
    ]
    if len(own) == 1:
        missing = ({"state_dict", "load_state_dict"} - set(own)).pop()
        raise ValueError(
            f"rollout.multi_turn.environment: {cls.__name__} implements {own[0]} but not "
            f"{missing}; an environment saves its state with both or neither"
        )
    return bool(own)


class AgentLoop(ABC):
    """Full control over one episode (see module docstring)."""

    @abstractmethod
    async def run(self, ctx: AgentContext, record: PromptRecord) -> None:
        """Build the episode through ``ctx`` (``start``, ``generate``,
        ``append_observation``, ``add_reward``, ``finish``); the framework takes the
        episode from ``ctx`` when this returns."""
