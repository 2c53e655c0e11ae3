"""The user's agent, as ``rollout.multi_turn.agent`` or ``agent_command`` names it.

    agent=FILE.py:fn        async def fn(client: openai.AsyncOpenAI, record) -> float | None
                            on an event loop of its own in a thread of its own (a blocking
                            call stalls only its episode: ``loop_thread``), with one client per
                            episode made there, pointed at its endpoint and key, deaf to
                            proxies; the whole record, ``ground_truth`` included (the user's
                            own code, in the worker's process)
    agent_command="CMD ..." one process per episode (``agent_process``): the record as JSON on
                            stdin (``ground_truth``/``extra_info`` only with
                            ``agent_command_ground_truth``), an allow-listed environment with
                            OPENAI_BASE_URL, OPENAI_API_KEY (what the openai clients of every
                            language read); its last stdout line is the reward

Both are checked at startup (``load_agent``): the import path, that ``fn`` is a coroutine
function taking (client, record), that the command's program exists, that the variables
``agent_env`` passes through are set. A reward must be a finite number or None (None: the
reward function scores the episode's final answer); a command prints it as its last stdout
line: a number, ``{"reward": x}``, ``null`` or nothing at all. An agent that raises, exits
non-zero, returns something else or prints another last line fails its episode
(``AgentError``; the runner makes it ``env_error``).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shlex
import shutil
import ssl
from collections.abc import Mapping
from typing import Any, Protocol

from recipe.agent.config import MultiTurnConfig
from recipe.agent.endpoint.agent_process import base_environment, episode_environment, run_process
from recipe.agent.endpoint.loop_thread import run_on_own_loop
from recipe.agent.endpoint.server import Credentials
from recipe.protocol import PromptRecord
from recipe.utils.import_path import load_attribute

REWARD_LINE_FORMS = 'a number, {"reward": x}, or null to let the reward function score'
"""What a command agent may print as its last stdout line (or print nothing at all)."""


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
        if self._ssl is None:
            # Built once: a client's default context loads the CA certificates (~40 ms of CPU
            # per episode). Each episode keeps a pool of its own (one shared pool scans all
            # its connections on every request).
            self._ssl = ssl.create_default_context()
        ssl_context = self._ssl

        async def episode() -> float | None:  # on the episode's own loop, client and all
            return await self._episode(credentials, record, ssl_context)

        return await run_on_own_loop(episode, f"agent {self._spec} on prompt {record.uid}")

    async def _episode(
        self, credentials: Credentials, record: PromptRecord, ssl_context: ssl.SSLContext
    ) -> float | None:
        import openai

        http = openai.DefaultAsyncHttpxClient(
            timeout=self._timeout_s,
            verify=ssl_context,
            trust_env=False,  # no HTTP(S)_PROXY of the worker's may reroute the endpoint
        )
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

    def __init__(
        self,
        command: str,
        env: Mapping[str, str | None] | None = None,
        ground_truth: bool = False,
    ):
        key = "rollout.multi_turn.agent_command"
        try:
            self._argv = shlex.split(command)
        except ValueError as exc:
            raise ValueError(f"{key}={command!r} cannot be split into arguments: {exc}") from exc
        if not self._argv:
            raise ValueError(f"{key}={command!r} is empty")
        if shutil.which(self._argv[0]) is None:
            raise ValueError(f"{key}={command!r}: command not found: {self._argv[0]!r}")
        self._command, self._ground_truth = command, ground_truth
        self._env = base_environment(env or {}, os.environ)

    async def close(self) -> None:
        """Nothing is shared between episodes' processes."""

    async def run(self, credentials: Credentials, record: PromptRecord) -> float | None:
        payload: dict[str, Any] = {
            "uid": record.uid,
            "prompt": record.prompt,
            "data_source": record.data_source,
        }
        if self._ground_truth:
            payload |= {"ground_truth": record.ground_truth, "extra_info": record.extra_info}
        env = episode_environment(self._env, credentials)
        done = await run_process(self._argv, env, json.dumps(payload).encode())
        if done.returncode != 0:
            last = done.last_stderr_line or "no stderr"
            raise AgentError(f"agent command exited with {done.returncode}: {last}")
        return reward_line(done.last_stdout_line, self._command)


def reward_line(line: str, command: str) -> float | None:
    """The reward a command printed as its last stdout line (``REWARD_LINE_FORMS``; "", no
    output: None); ``AgentError`` naming the line for anything else."""
    if not line:
        return None
    try:
        value: Any = json.loads(line)
    except ValueError:
        value = line
    if isinstance(value, dict) and "reward" in value:
        value = value["reward"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        shown = line if len(line) <= 200 else line[:200] + "..."
        raise AgentError(
            f"agent command {command!r}: its last stdout line is not a reward: {shown!r} "
            f"(print the reward as the last line: {REWARD_LINE_FORMS})"
        )
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
        return CommandAgent(
            config.agent_command, config.agent_env_spec, config.agent_command_ground_truth
        )
    raise ValueError("rollout.multi_turn: no agent or agent_command is set")
