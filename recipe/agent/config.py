"""``rollout.multi_turn.*``: multi-turn episodes driven by an environment or an agent loop.

Names follow verl's ``actor_rollout_ref.rollout.multi_turn`` where verl has the knob
(``enable``, ``max_assistant_turns``, ``max_user_turns``, ``max_tool_response_length``).
Token budgets: ``rollout.response_length`` bounds everything after the prompt (model turns
and observations together, the length the trainer pads to); ``max_turn_tokens`` bounds one
model turn.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from recipe.utils.config_check import (
    ConfigError,
    require,
    require_fraction,
    require_positive,
)

logger = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_KEY")
"""Set per episode by the endpoint; ``agent_env`` may not name them."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class MultiTurnConfig:
    enable: bool = False
    """Run episodes (``recipe.agent``) instead of single responses."""
    environment: str | None = None
    """The ``Environment`` class: ``FILE.py:Class``, ``package.module:Class``, or a built-in
    name (``recipe.agent.builtin``). Needed unless ``agent_loop`` is set."""
    environment_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    agent_loop: str | None = None
    """An ``AgentLoop`` class (same spellings) that drives the engine itself; None: the
    default loop driving ``environment``."""
    agent_loop_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent loop's constructor."""
    agent: str | None = None
    """An agent written against the OpenAI chat API: ``FILE.py:fn`` or ``package.module:fn``,
    ``async def fn(client, record) -> float | None`` (``client``: an ``openai.AsyncOpenAI``
    pointed at its episode's endpoint; None: the reward function scores the final answer).
    See ``recipe.agent.endpoint``."""
    agent_command: str | None = None
    """An agent in another process or language: a command run once per episode (split like a
    shell line, not run by a shell, in a session of its own that ends with it) with the
    prompt record as JSON on stdin and ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` in an
    environment of its own (``agent_env``); its last stdout line is the reward: a number,
    ``{"reward": x}``, ``null`` or no output at all (None: the reward function scores)."""
    agent_env: Any = None
    """What a command agent's environment holds beyond ``PATH``, ``HOME``, ``LANG``,
    ``LC_*``, ``TMPDIR`` and the endpoint's variables: a list of names passed through from
    the rollout worker's environment (``[HF_TOKEN]``), or a mapping of names to values
    (``{MODE: fast, HF_TOKEN: null}``; null passes the worker's value through)."""
    agent_command_ground_truth: bool = False
    """Put the record's ``ground_truth`` and ``extra_info`` (what the reward function scores
    with) on a command agent's stdin; false: only ``uid``, ``prompt`` and ``data_source``, so
    the model's tools cannot read the answer. A function agent always gets the whole record."""
    agent_timeout_s: float = 600.0
    """An ``agent``/``agent_command`` episode running longer ends as ``env_error``."""
    tool_parser: str = "hermes"
    """How a model turn's text becomes ``tool_calls`` for an agent that passed ``tools``:
    ``hermes`` (``<tool_call>`` JSON, built in) or a tool parser vLLM registers."""
    max_assistant_turns: int = 4
    """Model turns per episode; the episode ends (``length``) when they are used up."""
    max_user_turns: int = 4
    """Environment steps per episode (observations appended)."""
    max_turn_tokens: int | None = None
    """Max tokens of one model turn; None: whatever is left of ``rollout.response_length``."""
    max_tool_response_length: int = 256
    """Tokens of one observation's content; longer content is cut (counted)."""
    observation_role: str = "user"
    """Chat role of a text observation under a chat template (``user`` or ``tool``)."""
    step_timeout_s: float = 60.0
    """A ``reset``/``step`` call running longer ends its episode as ``env_error`` (not
    trained on, counted as ``agent/env_timeouts``, toward ``max_env_error_ratio``)."""
    max_env_error_ratio: float = 0.5
    """The run stops when more than this fraction of one step's episodes end in
    ``env_error`` (one line naming the environment and a prompt uid)."""

    def __post_init__(self) -> None:
        self.environment_kwargs = dict(self.environment_kwargs)
        self.agent_loop_kwargs = dict(self.agent_loop_kwargs)
        require(
            not self.enable or bool(self.environment or self.agent_loop or self.endpoint_agent),
            "rollout.multi_turn.environment",
            self.environment,
            "an Environment class ('FILE.py:Class' or 'package.module:Class') when "
            "rollout.multi_turn.enable=true and no agent_loop, agent or agent_command is set",
        )
        drivers = [
            key
            for key in ("environment", "agent_loop", "agent", "agent_command")
            if getattr(self, key)
        ]
        require(
            not self.endpoint_agent or len(drivers) == 1,
            f"rollout.multi_turn.{drivers[-1] if drivers else 'agent'}",
            getattr(self, drivers[-1]) if drivers else None,
            f"one of environment, agent_loop, agent, agent_command (set: {', '.join(drivers)})",
        )
        require_positive("rollout.multi_turn.agent_timeout_s", self.agent_timeout_s)
        parse_agent_env(self.agent_env)  # fails here, at startup, naming the entry
        for key in ("agent_env", "agent_command_ground_truth"):
            if getattr(self, key) and not self.agent_command:
                logger.warning(
                    "rollout.multi_turn.%s has no effect without agent_command; it is ignored",
                    key,
                )
        require_positive("rollout.multi_turn.max_assistant_turns", self.max_assistant_turns)
        require(
            self.max_user_turns >= 0,
            "rollout.multi_turn.max_user_turns",
            self.max_user_turns,
            ">= 0",
        )
        if self.max_turn_tokens is not None:
            require_positive("rollout.multi_turn.max_turn_tokens", self.max_turn_tokens)
        require_positive(
            "rollout.multi_turn.max_tool_response_length", self.max_tool_response_length
        )
        require(
            self.observation_role in ("user", "tool"),
            "rollout.multi_turn.observation_role",
            self.observation_role,
            "'user' or 'tool'",
        )
        require_positive("rollout.multi_turn.step_timeout_s", self.step_timeout_s)
        require_fraction(
            "rollout.multi_turn.max_env_error_ratio", self.max_env_error_ratio, open_low=False
        )

    @property
    def agent_env_spec(self) -> dict[str, str | None]:
        """``agent_env`` as names to values (None: the worker's value passes through)."""
        return parse_agent_env(self.agent_env)

    @property
    def endpoint_agent(self) -> bool:
        """Episodes are driven by a user's agent through the OpenAI-compatible endpoint."""
        return bool(self.agent or self.agent_command)


def parse_agent_env(value: Any) -> dict[str, str | None]:
    """``rollout.multi_turn.agent_env`` as a mapping of names to values (None: the worker's
    value passes through); ``ConfigError`` naming the key and the bad entry otherwise."""
    key = "rollout.multi_turn.agent_env"
    if value is None:
        return {}
    if isinstance(value, str):
        raise ConfigError(
            f"{key}={value!r} is invalid: a list of names ([{value}]) or a mapping of names "
            "to values ({NAME: value})"
        )
    if isinstance(value, list | tuple):
        for name in value:
            if isinstance(name, str) and "=" in name:
                head, _, tail = name.partition("=")
                raise ConfigError(
                    f"{key}: {name!r} is not a name (a list passes names through from the "
                    f"worker; give values as a mapping: {{{head}: {tail}}})"
                )
        value = dict.fromkeys(value)
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key}={value!r} is invalid: a list of names or a mapping of names to values"
        )
    spec: dict[str, str | None] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{key}: {name!r} is not an environment variable name")
        if name in ENDPOINT_VARIABLES:
            raise ConfigError(f"{key}: {name} is set per episode by the endpoint")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float | None):
            raise ConfigError(
                f"{key}.{name}={raw!r} is invalid: a string or a number (quote true/false), "
                "or null to pass the worker's value through"
            )
        spec[name] = None if raw is None else str(raw)
    return spec
