"""Build agent loops from ``rollout.multi_turn`` (import paths and keyword arguments).

``agent_loop_factory(config)`` checks everything it can at startup (the import path, that
the class implements the interface, that its constructor takes the configured keyword
arguments) and returns a callable that builds one ``AgentLoop`` per episode: each episode
gets its own environment object, so environments never share per-episode state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from recipe.agent.config import MultiTurnConfig
from recipe.agent.env_loop import EnvironmentLoop, SingleTurnEnvironment
from recipe.agent.interface import AgentLoop, Environment, saves_state
from recipe.utils.import_path import load_attribute

BUILTIN_ENVIRONMENTS: dict[str, str] = {
    "single_turn": "recipe.agent.env_loop:SingleTurnEnvironment",
    "calculator": "recipe.agent.builtin:Calculator",
    "retry": "recipe.agent.builtin:RetryWithFeedback",
    "tool_latency": "recipe.agent.builtin:ToolLatency",
}
"""Names ``rollout.multi_turn.environment`` accepts besides import paths."""


def load_class(key: str, spec: str, base: type) -> type:
    """The class named by ``spec`` (``FILE.py:Class`` or ``package.module:Class``), which
    must subclass ``base``; ``ValueError`` naming ``key`` otherwise."""
    _, cls = load_attribute(key, spec, "class")
    if not isinstance(cls, type) or not issubclass(cls, base):
        what = cls.__name__ if isinstance(cls, type) else type(cls).__name__
        raise ValueError(
            f"{key}={spec!r}: {what} does not subclass {base.__module__}.{base.__name__}"
        )
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ValueError(f"{key}={spec!r}: {cls.__name__} does not implement {', '.join(missing)}")
    return cls


def check_kwargs(key: str, cls: type, kwargs: dict[str, Any]) -> None:
    """``cls(**kwargs)`` must bind and construct; ``ValueError`` naming ``key`` otherwise
    (one probe object is built and dropped, so a constructor's own checks run at startup)."""
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{key}={kwargs!r}: {cls.__name__}(...) rejects them: {exc}") from exc
    try:
        cls(**kwargs)
    except Exception as exc:
        raise ValueError(
            f"{key}={kwargs!r}: {cls.__name__}(...) failed: {type(exc).__name__}: {exc}"
        ) from exc


def agent_loop_factory(config: MultiTurnConfig) -> Callable[[], AgentLoop]:
    """One fresh ``AgentLoop`` per call (see the module docstring)."""
    if config.agent_loop:
        loop_cls = load_class("rollout.multi_turn.agent_loop", config.agent_loop, AgentLoop)
        kwargs = dict(config.agent_loop_kwargs)
        check_kwargs("rollout.multi_turn.agent_loop_kwargs", loop_cls, kwargs)
        return lambda: loop_cls(**kwargs)
    env_cls = environment_class(config.environment)
    env_kwargs = dict(config.environment_kwargs)
    check_kwargs("rollout.multi_turn.environment_kwargs", env_cls, env_kwargs)
    return lambda: EnvironmentLoop(env_cls(**env_kwargs))


def environment_class(spec: str | None) -> type[Environment]:
    if not spec:
        return SingleTurnEnvironment
    spec = BUILTIN_ENVIRONMENTS.get(spec, spec)
    return load_class("rollout.multi_turn.environment", spec, Environment)


def episodes_save_state(config: MultiTurnConfig) -> bool:
    """Whether a checkpoint can keep this config's episodes in flight: the default loop
    over an environment with ``state_dict``/``load_state_dict`` (``ValueError`` when it has
    only one of them)."""
    return not config.agent_loop and saves_state(environment_class(config.environment))
