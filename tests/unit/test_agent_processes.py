"""``kill_tree``, which ends command agents (and runs) at a deadline, with real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from recipe.utils import process_tree
from tests.helpers.escaping import gone


def test_kill_tree_kills_what_it_may_and_reports_what_it_may_not(monkeypatch, caplog):
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    script = (
        "import subprocess, sys, time\n"
        f"kids = [subprocess.Popen({sleeper!r}, start_new_session=True) for _ in range(3)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    kids = [int(p) for p in parent.stdout.readline().split()]
    protected = kids[0]
    real_kill = os.kill

    def kill(pid, sig):  # as if the first child belonged to another user
        if pid == protected:
            raise PermissionError(1, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr(process_tree.os, "kill", kill)
    try:
        with caplog.at_level("WARNING"):
            denied = process_tree.kill_tree(parent.pid)
        assert denied == [protected]
        assert f"not permitted to signal {protected}" in caplog.text
        parent.wait(timeout=10)
        assert all(gone(pid) for pid in kids[1:]), "a child after the refused one survived"
        assert not gone(protected, within_s=0.2)
    finally:
        real_kill(protected, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            real_kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        parent.stdout.close()
