"""The user's agent, as ``rollout.multi_turn.agent`` or ``agent_command`` names it.

    agent=FILE.py:fn        async def fn(client: openai.AsyncOpenAI, record) -> float | None
                            (one client per episode, pointed at its endpoint and key)
    agent_command="CMD ..." one process per episode; its environment holds
                            OPENAI_BASE_URL, OPENAI_API_KEY (what the openai clients of every
                            language read) and RECIPE_RECORD (the prompt record as JSON, also
                            on stdin); its last stdout line, when a number, is the reward

Both are checked at startup (``load_agent``): the import path, that ``fn`` is a coroutine
function taking (client, record), that the command's program exists. A reward must be a
finite number or None (None: the reward function scores the episode's final answer). An
agent that raises, exits non-zero or returns something else fails its episode
(``AgentError``; the runner makes it ``env_error``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import shlex
import shutil
import ssl
from typing import Any, Protocol

from recipe.agent.config import MultiTurnConfig
from recipe.agent.endpoint.server import Credentials
from recipe.protocol import PromptRecord
from recipe.utils.import_path import load_attribute
from recipe.utils.process_tree import kill_tree

_STDERR_TAIL = 2000  # characters of a failed command's stderr kept for its error line


class AgentError(Exception):
    """The user's agent failed its episode (one line)."""


class UserAgent(Protocol):
    async def run(self, credentials: Credentials, record: PromptRecord) -> float | None:
        """Run one episode against ``credentials``; the reward, or None."""
        ...

    async def close(self) -> None:
        """Release what the episodes shared (connections)."""
        ...


class FunctionAgent:
    """``async def fn(client, record)`` with an ``openai.AsyncOpenAI`` per episode."""

    def __init__(self, spec: str, timeout_s: float):
        key = "rollout.multi_turn.agent"
        _, fn = load_attribute(key, spec, "function")
        if not inspect.iscoroutinefunction(fn):
            raise ValueError(
                f"{key}={spec!r}: {getattr(fn, '__name__', fn)!r} is not an async function "
                "(write 'async def fn(client, record) -> float | None')"
            )
        try:
            inspect.signature(fn).bind(None, None)
        except TypeError as exc:
            raise ValueError(
                f"{key}={spec!r}: {fn.__name__} must take (client, record): {exc}"
            ) from exc
        try:
            import openai  # noqa: F401 - checked at startup, used per episode
        except ImportError as exc:
            raise ValueError(f"{key}={spec!r}: the openai package is not installed") from exc
        self._fn, self._spec, self._timeout_s = fn, spec, timeout_s
        self._ssl: ssl.SSLContext | None = None

    async def run(self, credentials: Credentials, record: PromptRecord) -> float | None:
        import openai

        if self._ssl is None:
            # Built once: a client's default context loads the CA certificates (~40 ms of CPU
            # per episode). Each episode keeps a pool of its own (one shared pool scans all
            # its connections on every request).
            self._ssl = ssl.create_default_context()
        http = openai.DefaultAsyncHttpxClient(timeout=self._timeout_s, verify=self._ssl)
        client = openai.AsyncOpenAI(
            base_url=credentials.base_url,
            api_key=credentials.api_key,
            max_retries=0,  # a refused request is an answer, not a network blip
            timeout=self._timeout_s,
            http_client=http,
        )
        try:
            return reward_of(await self._fn(client, record), self._spec)
        finally:
            await client.close()

    async def close(self) -> None:
        """Nothing outlives an episode but the SSL context."""


class CommandAgent:
    """One process per episode (module docstring)."""

    def __init__(self, command: str):
        key = "rollout.multi_turn.agent_command"
        try:
            self._argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"{key}={command!r} cannot be split into arguments: {exc}") from exc
        if not self._argv:
            raise ValueError(f"{key}={command!r} is empty")
        if shutil.which(self._argv[0]) is None:
            raise ValueError(f"{key}={command!r}: command not found: {self._argv[0]!r}")
        self._command = command

    async def close(self) -> None:
        """Nothing is shared between episodes' processes."""

    async def run(self, credentials: Credentials, record: PromptRecord) -> float | None:
        payload = json.dumps(
            {
                "uid": record.uid,
                "prompt": record.prompt,
                "ground_truth": record.ground_truth,
                "data_source": record.data_source,
                "extra_info": record.extra_info,
            }
        )
        env = os.environ | {
            "OPENAI_BASE_URL": credentials.base_url,
            "OPENAI_API_KEY": credentials.api_key,
            "RECIPE_RECORD": payload,
        }
        process = await asyncio.create_subprocess_exec(
            *self._argv,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its children go with it on a timeout
        )
        try:
            out, err = await process.communicate(payload.encode())
        except BaseException:
            _kill(process)
            await process.wait()
            raise
        if process.returncode != 0:
            tail = err.decode(errors="replace")[-_STDERR_TAIL:].strip().splitlines()
            last = tail[-1] if tail else "no stderr"
            raise AgentError(f"agent command exited with {process.returncode}: {last}")
        lines = out.decode(errors="replace").strip().splitlines()
        return _reward_line(lines[-1] if lines else "", self._command)


def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        kill_tree(process.pid)


def _reward_line(line: str, command: str) -> float | None:
    """The reward on a command's last stdout line: a number, ``{"reward": x}``, or None."""
    try:
        value: Any = json.loads(line)
    except ValueError:
        return None  # not a number: the reward function scores the answer
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, str) or value is None:
        return None
    return reward_of(value, command)


def reward_of(result: Any, source: str) -> float | None:
    """``result`` as a reward: a finite number or None; ``AgentError`` otherwise."""
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise AgentError(
            f"agent {source!r} returned {type(result).__name__}, expected a float reward or None"
        )
    if not math.isfinite(result):
        raise AgentError(f"agent {source!r} returned the reward {result!r} (not finite)")
    return float(result)


def load_agent(config: MultiTurnConfig) -> UserAgent:
    """The configured agent, checked (``ValueError`` naming the key otherwise)."""
    if config.agent:
        return FunctionAgent(config.agent, config.agent_timeout_s)
    if config.agent_command:
        return CommandAgent(config.agent_command)
    raise ValueError("rollout.multi_turn: no agent or agent_command is set")
