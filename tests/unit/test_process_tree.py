"""A deadline's kill reaches every process a run started, in whatever session."""

from __future__ import annotations

import subprocess
import time

from recipe.tools.study.runs import run_logged
from recipe.utils.process_tree import descendants, kill_tree
from tests.helpers.escaping import escaping_command, gone


def _pid_when_written(pid_file, within_s: float = 10.0) -> int:
    deadline = time.monotonic() + within_s
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the command never started its child"
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_kill_tree_kills_a_child_that_left_the_process_group(tmp_path):
    command, pid_file = escaping_command(tmp_path)
    proc = subprocess.Popen(command, start_new_session=True)
    child = _pid_when_written(pid_file)
    assert child in descendants(proc.pid)
    kill_tree(proc.pid)
    proc.wait(timeout=10)
    assert gone(child), "the child in its own session survived"
    kill_tree(proc.pid)  # all gone already: nothing to do, no error


def test_a_study_run_past_its_deadline_takes_what_it_started_with_it(tmp_path):
    command, pid_file = escaping_command(tmp_path)
    failed, took_s = run_logged(command, tmp_path / "run", timeout_s=2)
    assert failed == "past timeout_s=2" and took_s < 30
    assert gone(int(pid_file.read_text())), "the study left the run's child running"
