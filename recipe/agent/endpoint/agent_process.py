"""One command agent's process (``rollout.multi_turn.agent_command``): what it is given, how
it ends.

    environment  the worker's PATH, HOME, LANG, LC_*, TMPDIR; then ``agent_env``; then the
                 episode's OPENAI_BASE_URL / OPENAI_API_KEY, and NO_PROXY / no_proxy naming
                 the endpoint's host, so a proxy the agent's own tools use cannot reroute
                 the endpoint's traffic
    stdin        the record as JSON, from an unlinked temporary file: the agent may read it,
                 read part of it or exit without reading it
    stdout       unlinked temporary files, read once it exited (stdout's last line: the
    stderr       reward; stderr's last line: a failure's error line), so a background job
                 holding them open cannot keep the episode waiting
    its end      it leads a session of its own: once it exits, or is killed at
                 agent_timeout_s, whatever is left in that session is killed too

Files, not pipes: writing the record into a pipe the agent closed by exiting fails the
episode (uvloop raises), and reading a pipe waits for every process that inherited it.

Nothing else of the worker's environment reaches it: not the W&B, HF or cloud keys a run is
launched with, nor the worker's proxy settings, nor the record (a model running shell tools
would read its answer there, and one environment string is limited to 128 KiB).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO
from urllib.parse import urlsplit

from recipe.agent.endpoint.server import Credentials
from recipe.utils.process_tree import kill_session, kill_tree

logger = logging.getLogger(__name__)

PASSED_THROUGH = ("PATH", "HOME", "LANG", "TMPDIR")
"""Worker variables every command agent gets (with every ``LC_*``)."""
TAIL_BYTES = 64 * 1024
"""Bytes of stdout (and stderr) read back from their ends: the last line is all we use."""
EXIT_WAIT_S = 10.0
"""How long a killed agent may take to be reaped before it is left to the OS (logged)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """How an agent's process ended."""

    returncode: int | None
    """Its exit status (negative: the signal that ended it); None: it could not be reaped."""
    last_stdout_line: str
    """Its stdout's last non-blank line ("" when it printed nothing)."""
    last_stderr_line: str
    """Its stderr's last non-blank line ("" when it printed nothing)."""


def base_environment(spec: Mapping[str, str | None], worker: Mapping[str, str]) -> dict[str, str]:
    """The part of every agent's environment fixed for the run: the allow-listed worker
    variables and ``rollout.multi_turn.agent_env`` (``spec``, None: ``worker``'s value);
    ``ValueError`` naming the key for a name to pass through that ``worker`` lacks."""
    env = {k: v for k, v in worker.items() if k in PASSED_THROUGH or k.startswith("LC_")}
    for name, value in spec.items():
        if value is None and name not in worker:
            raise ValueError(
                f"rollout.multi_turn.agent_env: {name} is not set in this process's "
                f"environment (set it, or give its value: agent_env={{{name}: ...}})"
            )
        env[name] = worker[name] if value is None else value
    return env


def episode_environment(base: Mapping[str, str], credentials: Credentials) -> dict[str, str]:
    """``base`` with the episode's endpoint, which no proxy may reroute."""
    host = urlsplit(credentials.base_url).hostname or ""
    no_proxy = base.get("NO_PROXY") or base.get("no_proxy") or ""
    no_proxy = f"{no_proxy},{host}" if no_proxy else host
    return dict(base) | {
        "OPENAI_BASE_URL": credentials.base_url,
        "OPENAI_API_KEY": credentials.api_key,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


async def run_process(argv: list[str], env: dict[str, str], stdin: bytes) -> Finished:
    """Run ``argv`` to its end (module docstring); cancelled (the episode's deadline), it is
    killed with everything it started."""
    with (
        tempfile.TemporaryFile() as stdin_file,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        stdin_file.write(stdin)
        stdin_file.seek(0)
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=stdin_file,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its pid is its session's id: see _end
        )
        try:
            await process.wait()
        finally:
            returncode = await _end(process)
        return Finished(returncode, _last_line(out), _last_line(err))


async def _end(process: asyncio.subprocess.Process) -> int | None:
    """Kill the process if it still runs, then what is left of its session (background
    jobs); its exit status, None if it could not be reaped in time."""
    if process.returncode is None:
        await asyncio.to_thread(kill_tree, process.pid)
        try:
            await asyncio.wait_for(process.wait(), EXIT_WAIT_S)
        except TimeoutError:
            logger.warning(
                "agent command (pid %d) was not reaped within %g s of SIGKILL; left to the OS",
                process.pid,
                EXIT_WAIT_S,
            )
    await asyncio.to_thread(kill_session, process.pid)
    return process.returncode


def _last_line(file: IO[bytes]) -> str:
    size = file.seek(0, os.SEEK_END)
    file.seek(max(size - TAIL_BYTES, 0))
    lines = file.read().decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""
