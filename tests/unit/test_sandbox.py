"""recipe.agent.sandbox against hostile code: each run ends within its deadline, within its
limits, and leaves nothing behind (no process of its group, no directory, no harm to us)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from recipe.agent.sandbox import ENV, run_python, run_python_async

SLACK_S = 3.0  # two shared cores: an interpreter's start and a group kill may wait on others


def _gone(pid: int, deadline_s: float = 5.0) -> bool:
    """Whether ``pid`` has ended (a zombie counts as ended) within ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_program_prints_and_exits_cleanly():
    result = run_python("print(1 + 1)")
    assert (result.stdout, result.stderr, result.exit_code) == ("2\n", "", 0)
    assert not result.timed_out and not result.truncated and 0 < result.seconds < SLACK_S


def test_an_infinite_loop_is_killed_at_the_wall_deadline():
    result = run_python("while True:\n    pass", timeout_s=1.0, cpu_s=30)
    assert result.timed_out and result.exit_code is None
    assert 1.0 <= result.seconds < 1.0 + SLACK_S


def test_cpu_time_past_its_limit_ends_the_program_with_sigxcpu():
    result = run_python("while True:\n    pass", timeout_s=30.0, cpu_s=1)
    assert not result.timed_out and result.exit_code == -signal.SIGXCPU


def test_a_memory_bomb_gets_memory_error_at_the_address_space_limit():
    code = "a = []\nwhile True:\n    a.append(bytearray(1 << 20))"
    result = run_python(code, memory_mb=256, timeout_s=10.0)
    assert not result.timed_out and result.exit_code == 1
    assert "MemoryError" in result.stderr


def test_printing_a_gigabyte_is_cut_by_the_file_limit_and_read_back_capped():
    code = "line = 'x' * 1023\nfor _ in range(1 << 20):\n    print(line)"  # 1 GiB
    result = run_python(code, max_output_bytes=4096, max_file_bytes=1 << 20, timeout_s=10.0)
    assert result.truncated and len(result.stdout) == 4096
    assert result.exit_code == 1 and "File too large" in result.stderr
    assert result.seconds < 5.0


def test_writing_a_huge_file_stops_at_the_file_size_limit():
    code = "with open('big', 'wb') as f:\n    while True:\n        f.write(bytes(1 << 20))"
    result = run_python(code, max_file_bytes=8 << 20, timeout_s=10.0)
    assert result.exit_code == 1 and "File too large" in result.stderr


def test_the_program_sees_none_of_our_environment(monkeypatch):
    monkeypatch.setenv("SECRET_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    result = run_python("import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.isolated)")
    names, isolated = result.stdout.splitlines()
    assert eval(names) == sorted([*ENV, "HOME", "TMPDIR"]) and isolated == "1"
    assert "sk-do-not-leak" not in result.stdout + result.stderr


def test_a_syntax_error_is_reported_on_stderr():
    result = run_python("def f(:\n    pass")
    assert result.exit_code == 1 and "SyntaxError" in result.stderr


def test_a_long_traceback_keeps_its_end_and_a_long_stdout_its_start():
    code = (
        "import sys\nprint('first line')\nprint('x' * 10000)\n"
        "sys.stderr.write('noise\\n' * 2000)\nraise ValueError('the named cause')"
    )
    result = run_python(code, max_output_bytes=256)
    assert result.truncated and result.exit_code == 1
    assert result.stdout.startswith("first line") and len(result.stdout.encode()) == 256
    assert result.stderr.rstrip().endswith("ValueError: the named cause"), result.stderr
    assert len(result.stderr.encode()) <= 256


def test_killing_its_parent_does_not_reach_the_caller():
    result = run_python("import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(30)")
    assert result.exit_code == -signal.SIGKILL and result.seconds < SLACK_S
    os.kill(os.getpid(), 0)  # we are still here (a SIGKILL would have ended the test run)


def test_a_grandchild_that_outlives_the_program_is_killed_with_its_group():
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid)"
    )
    result = run_python(code)
    assert result.exit_code == 0
    assert _gone(int(result.stdout)), "the grandchild survived the sandbox"


def test_the_working_directory_is_fresh_and_removed_afterwards():
    code = "import os\nprint(os.getcwd())\nprint(sorted(os.listdir()))\nopen('x', 'w').write('1')"
    first = run_python(code)
    workdir, listing = first.stdout.splitlines()
    assert eval(listing) == [".stderr", ".stdout", "main.py"]
    assert not Path(workdir).exists()
    assert run_python(code).stdout.splitlines()[0] != workdir


def test_stdin_is_empty():
    assert run_python("import sys\nprint(repr(sys.stdin.read()))").stdout == "''\n"


def test_a_fork_loop_is_bounded_by_the_process_limit_and_killed():
    """RLIMIT_NPROC counts every process of the user and binds no root process: as root the
    code runs as ``nobody`` with the system's interpreter (the venv may sit in root's home)."""
    code = (
        "import os\nprint('group', os.getpgrp(), flush=True)\nwhile True:\n"
        "    try:\n        os.fork()\n    except OSError:\n        print('refused', flush=True)\n"
    )
    limits: dict = {"timeout_s": 2.0, "max_output_bytes": 1 << 16}
    if os.geteuid() == 0:
        if not os.access("/usr/bin/python3", os.X_OK):
            pytest.skip("as root the fork loop needs /usr/bin/python3 to run as nobody")
        limits |= {"user": "nobody", "python": "/usr/bin/python3", "max_processes": 32}
    else:
        mine = sum(p.num_threads() for p in psutil.process_iter() if p.uids().real == os.getuid())
        limits["max_processes"] = mine + 32
    result = run_python(code, **limits)
    assert result.timed_out and result.seconds < 2.0 + SLACK_S
    assert "refused" in result.stdout, "no fork was refused: the process limit did not bind"
    pgid = int(re.search(r"group (\d+)", result.stdout).group(1))
    assert _group_gone(pgid), "processes of the fork loop survived the group kill"


def _group_gone(pgid: int, deadline_s: float = 5.0) -> bool:
    """Whether every process of group ``pgid`` has ended (SIGKILL is delivered at once, but
    dying takes each process a moment)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not any(_live_in_group(p, pgid) for p in psutil.process_iter()):
            return True
        time.sleep(0.05)
    return False


def _live_in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.NoSuchProcess):
        return False


def test_the_async_variant_leaves_the_event_loop_free():
    async def two_at_once() -> float:
        started = time.perf_counter()
        sleep = "import time\ntime.sleep(1.0)"
        await asyncio.gather(run_python_async(sleep), run_python_async(sleep))
        return time.perf_counter() - started

    assert asyncio.run(two_at_once()) < 1.9


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="timeout_s=0"):
        run_python("print(1)", timeout_s=0)
