"""Command agents (``rollout.multi_turn.agent_command``) as the endpoint runs them: their
stdin, their reward line, their end; real processes (Python and shell scripts) talking HTTP
to the real in-process endpoint, under the standard event loop and under uvloop (which
rollout workers may run on). And ``kill_tree``, which ends them at a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from recipe.utils import process_tree
from tests.helpers.endpoint_episodes import (
    chat_tokenizer,
    python_command,
    record,
    run_episodes,
)
from tests.helpers.escaping import gone

pytestmark = pytest.mark.model  # builds a transformers tokenizer

LOOPS = ["asyncio", "uvloop"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def _loop_factory(name: str):
    if name == "asyncio":
        return None
    return pytest.importorskip("uvloop").new_event_loop


def _finished(episodes, reward):
    for episode in episodes:
        assert (episode.finish_reason, episode.reward) == ("stop", reward), episode.error


@pytest.mark.parametrize("loop", LOOPS)
def test_a_command_agent_that_never_reads_its_stdin_or_exits_first_is_not_a_failure(
    tokenizer, tmp_path, loop
):
    # A record larger than a pipe's buffer (64 KiB): writing it cannot finish before the
    # agent exits without reading it.
    big = record("big", prompt="x" * 100_000)
    command = python_command(
        tmp_path,
        """
if sys.argv[1] == "part":
    sys.stdin.buffer.read(10)
chat("hi")
print(0.5)
""",
        "{mode}",
    )
    for mode in ("none", "part"):
        episodes = run_episodes(
            tokenizer,
            [big, record("small")],
            loop_factory=_loop_factory(loop),
            agent_command=command.replace("{mode}", mode),
        )
        _finished(episodes, 0.5)
    shell = tmp_path / "agent.sh"  # the two-line agent: never reads stdin, exits at once
    shell.write_text(f'env > "{tmp_path}/env.txt"\necho 0\n')
    episodes = run_episodes(
        tokenizer,
        [record(f"sh-{i}") for i in range(32)],  # a busy loop: many exit before their write
        loop_factory=_loop_factory(loop),
        agent_command=f"sh {shell}",
    )
    errors = {episode.error for episode in episodes}
    assert errors == {"agent: the agent made no model request"}  # their only failure


@pytest.mark.parametrize(
    ("last", "reward"),
    [
        ("0.25", 0.25),
        ('{"reward": 0.5, "note": "x"}', 0.5),
        ("null", None),
        ('{"reward": null}', None),
        ("", None),  # no stdout at all
    ],
)
def test_a_command_agents_reward_line_in_a_documented_form_is_its_reward(
    tokenizer, tmp_path, last, reward
):
    body = f'chat("hi")\nprint("a log line", file=sys.stderr)\nprint({last!r}, end="")\n'
    (episode,) = run_episodes(
        tokenizer, [record("r")], agent_command=python_command(tmp_path, body)
    )
    _finished([episode], reward)


@pytest.mark.parametrize("last", ["done", '"0.5"', '{"score": 1}', "true", "[1]"])
def test_any_other_last_stdout_line_fails_the_episode_naming_it(tokenizer, tmp_path, last):
    body = f'chat("hi")\nprint("0.5")\nprint({last!r})\n'
    (episode,) = run_episodes(
        tokenizer, [record("r")], agent_command=python_command(tmp_path, body)
    )
    assert episode.finish_reason == "env_error" and episode.reward is None
    assert f"its last stdout line is not a reward: {last!r}" in episode.error
    assert 'print the reward as the last line: a number, {"reward": x}, or null' in episode.error


BACKGROUND = """
import subprocess
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
jobs = [subprocess.Popen(sleeper, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(sleeper, process_group=0)]  # same session, a group of its own
with open(sys.argv[1], "w") as out:
    out.write(" ".join(str(job.pid) for job in jobs))
chat("hi")
if sys.argv[2] == "hang":
    time.sleep(300)
print(1)
"""


@pytest.mark.parametrize("end", ["exit", "hang"])
def test_a_command_agents_background_processes_end_with_its_episode(tokenizer, tmp_path, end):
    pids_file = tmp_path / "pids"
    command = python_command(tmp_path, "import time\n" + BACKGROUND, str(pids_file), end)
    try:
        (episode,) = run_episodes(
            tokenizer, [record("bg")], agent_command=command, agent_timeout_s=3.0
        )
        pids = [int(p) for p in pids_file.read_text().split()]
        if end == "exit":
            _finished([episode], 1.0)
        else:
            assert episode.timed_out and episode.finish_reason == "env_error"
        assert all(gone(pid, within_s=3.0) for pid in pids), "a background job survived"
    finally:
        for pid in pids_file.read_text().split() if pids_file.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


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
