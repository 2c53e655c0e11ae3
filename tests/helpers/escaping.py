"""A command that starts a child in a session of its own (as Ray's raylet and workers do), and
a check that the child is gone: for the tests of a deadline's kill."""

from __future__ import annotations

import sys
import time
from pathlib import Path

SCRIPT = """
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
)
Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(120)
"""


def escaping_command(tmp_path: Path) -> tuple[list[str], Path]:
    """(the command, the file its escaping child's pid is written to)."""
    script = tmp_path / "escaping.py"
    script.write_text(SCRIPT)
    pid_file = tmp_path / "child.pid"
    return [sys.executable, str(script), str(pid_file)], pid_file


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` is dead (a zombie not yet reaped by init counts) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False
