"""Run a model's Python code in a fresh, resource-limited subprocess: the ``python`` tool of
``recipe.agent.examples.python_tool_agent``.

    run_python(code) --Popen--> python -I -c BOOTSTRAP          (own session = process group;
                                  |  fork                        empty env, stdin /dev/null,
                                  v                              no inherited fds)
                                child: setrlimit(AS, CPU, FSIZE, NPROC, CORE=0)
                                  |  execv
                                  v
                                python -I -u main.py            (cwd: a fresh temporary dir)
    wall deadline or leader exit --> killpg(SIGKILL) of the whole group --> temp dir removed

Each call starts a new interpreter in a new temporary directory, removed afterwards. Limits
are set in the child between ``fork`` and ``exec`` by a small bootstrap interpreter, not by
``Popen(preexec_fn=...)``, which Python documents as unsafe in a process with threads (an
agent's episodes each run in a thread of the rollout worker). The bootstrap stays as the
code's parent and waits for it, so ``os.kill(os.getppid(), 9)`` in the code hits the
bootstrap, never the caller. stdout and stderr go to files in the directory (no pipes to
drain, and ``RLIMIT_FSIZE`` bounds them); at most ``max_output_bytes`` of each is read back:
stdout's head, stderr's tail (a traceback ends with what failed).
The exit of the group leader is awaited on a pidfd (``os.pidfd_open``), so the group is
killed while the leader is still unreaped and its id cannot have been reused.

What it does NOT protect against: it is not a security boundary (use a container, gVisor or
a VM for untrusted code). The code runs as the caller's user unless ``user`` is given: it can
read every file that user can (datasets with their answers, credentials in the home
directory), write outside its directory (such files are not removed), open network
connections, and signal the user's other processes (``os.kill(-1, 9)`` kills them all).
``RLIMIT_NPROC`` counts every process and thread of the user and is not enforced for root:
as root a fork loop is stopped only by the wall deadline unless ``user`` names another
account (which then needs an interpreter it can execute, ``python``). A process that leaves
the process group (``os.setsid()``) survives the group kill. ``RLIMIT_AS`` bounds each
process's address space, not the sum over the processes the code starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    # One thread per numerical library: threads count against RLIMIT_NPROC and RLIMIT_AS,
    # and a tool call should not take every core of the node.
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The code's whole environment, plus ``HOME`` and ``TMPDIR``: its temporary directory."""

# Runs as `python -I -c BOOTSTRAP AS_BYTES CPU_S FSIZE_BYTES NPROC PYTHON`: forks, limits
# the child and execs the code there; waits and ends the way the code ended.
BOOTSTRAP = """\
import os, resource, signal, sys
mem, cpu, fsize, nproc = (int(a) for a in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
pid = os.fork()
if pid == 0:
    for kind, soft, hard in ((resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_CPU, cpu, cpu + 1),
                             (resource.RLIMIT_FSIZE, fsize, fsize),
                             (resource.RLIMIT_NPROC, nproc, nproc)):
        resource.setrlimit(kind, (soft, hard))
    os.execv(sys.argv[5], [sys.argv[5], "-I", "-u", "main.py"])
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if code < 0:
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What one run of the code gave."""

    stdout: str
    """Its standard output, at most ``max_output_bytes`` of it (UTF-8, bad bytes replaced)."""
    stderr: str
    """Its standard error, cut the same way but to its last ``max_output_bytes`` (where a
    traceback names what failed)."""
    exit_code: int | None
    """The exit status; ``-N``: killed by signal N (``-signal.SIGXCPU``: CPU time,
    ``-signal.SIGXFSZ``: file size); None: killed at the wall deadline."""
    timed_out: bool
    """It ran past ``timeout_s`` and its process group was killed."""
    truncated: bool
    """stdout or stderr was longer than ``max_output_bytes`` and was cut."""
    seconds: float
    """Wall time from start to end (or kill), the tool's latency."""


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 4096,
    cpu_s: int | None = None,
    max_file_bytes: int = 16 << 20,
    max_processes: int = 64,
    python: str | None = None,
    user: str | int | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh interpreter (see the module docstring).

    ``timeout_s``: wall-clock deadline of the whole process group; ``memory_mb``: address
    space per process; ``cpu_s``: CPU seconds per process (default: ``timeout_s`` rounded
    up, plus 1); ``max_file_bytes``: largest file it may write (its output included);
    ``max_processes``: ``RLIMIT_NPROC`` (see above for when it applies); ``python``: the
    interpreter (default: this one); ``user``: run as this account (``Popen(user=...)``,
    needs root). Blocks until the code ends: from a coroutine, ``await run_python_async``.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes < 0 or max_processes <= 0:
        raise ValueError(
            f"run_python: timeout_s={timeout_s}, memory_mb={memory_mb}, max_processes="
            f"{max_processes} must be > 0 and max_output_bytes={max_output_bytes} >= 0"
        )
    cpu = cpu_s if cpu_s is not None else math.ceil(timeout_s) + 1
    python = python or sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="sandbox-"))
    try:
        if user is not None:
            shutil.chown(workdir, user=user)
        (workdir / "main.py").write_text(code, encoding="utf-8")
        limits = [memory_mb << 20, cpu, max_file_bytes, max_processes]
        argv = [python, "-I", "-c", BOOTSTRAP, *map(str, limits), python]
        env = ENV | {"HOME": str(workdir), "TMPDIR": str(workdir)}
        with open(workdir / ".stdout", "wb+") as out, open(workdir / ".stderr", "wb+") as err:
            started = time.perf_counter()
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                user=user,
                extra_groups=[] if user is not None else None,
            )
            timed_out = not _wait_unreaped(proc, timeout_s)
            _kill_group(proc.pid)
            exit_code = proc.wait()
            seconds = time.perf_counter() - started
            stdout, cut_out = _read_capped(out, max_output_bytes)
            stderr, cut_err = _read_capped(err, max_output_bytes, tail=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=None if timed_out else exit_code,
        timed_out=timed_out,
        truncated=cut_out or cut_err,
        seconds=seconds,
    )


async def run_python_async(code: str, **limits: object) -> SandboxResult:
    """``run_python`` in a worker thread, so the caller's event loop goes on meanwhile."""
    return await asyncio.to_thread(run_python, code, **limits)  # type: ignore[arg-type]


def _wait_unreaped(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether ``proc`` exited within ``timeout_s``, leaving it unreaped (a zombie keeps its
    pid, so the group id cannot be reused before ``_kill_group``)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # Linux before 5.3: Popen's own polling wait (reaps the leader)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(pidfd)


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the group: the code's children outlive it otherwise."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_capped(file: BinaryIO, max_bytes: int, *, tail: bool = False) -> tuple[str, bool]:
    """The first (``tail``: the last) ``max_bytes`` of ``file`` as text, and whether there
    was more."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - max_bytes) if tail else 0)
    data = file.read(max_bytes)
    return data.decode("utf-8", errors="replace"), size > max_bytes
