"""Function agents (``rollout.multi_turn.agent=FILE.py:fn``) run off the worker's event loop:
an agent that blocks (``time.sleep``, ``subprocess.run``, a synchronous HTTP call to its own
endpoint) stalls only its own episode, the other episodes of the worker go on meanwhile, and
``agent_timeout_s`` ends one that blocks too long. Real endpoint, real HTTP, agent files
loaded by path as users name them."""

from __future__ import annotations

import logging
import textwrap

import pytest

from tests.helpers.endpoint_episodes import REPLY, chat_tokenizer, record, run_episodes

pytestmark = pytest.mark.model  # builds a transformers tokenizer

AGENT = """
import json, os, subprocess, sys, threading, time, urllib.request
from pathlib import Path

FLAGS = Path({flags!r})
WAIT_S = 20.0  # a blocked worker loop would never let the others finish: fail, not hang


def wait_blocking(name):
    \"\"\"Block this thread (no await) until the flag ``name`` appears; whether it did.\"\"\"
    end = time.monotonic() + WAIT_S
    while not (FLAGS / name).exists() and time.monotonic() < end:
        time.sleep(0.01)
    return (FLAGS / name).exists()


def sync_chat(client, content):
    \"\"\"A blocking HTTP request to the episode's own endpoint.\"\"\"
    body = {{"model": "m", "messages": [{{"role": "user", "content": content}}]}}
    request = urllib.request.Request(
        str(client.base_url) + "chat/completions", data=json.dumps(body).encode(),
        headers={{"Authorization": "Bearer " + client.api_key,
                 "Content-Type": "application/json"}})
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.load(response)["choices"][0]["message"]["content"]


async def ask(client):
    out = await client.chat.completions.create(
        model="m", messages=[{{"role": "user", "content": "hi"}}])
    return out.choices[0].message.content


async def run(client, record):
    kind = record.uid.split("-")[0]
    if kind == "other":  # an ordinary episode: one request, then it lets the blocker go
        answer = await ask(client)
        (FLAGS / record.uid).touch()
        return 1.0 if answer == {reply!r} else 0.0
    others = ["other-0", "other-1", "other-2"]
    thread = threading.current_thread() is not threading.main_thread()
    if kind == "sleep":
        ok = all(wait_blocking(name) for name in others)
    elif kind == "subprocess":
        poll = ("import sys, time; from pathlib import Path; end = time.monotonic() + 20\\n"
                "while not all(Path(p).exists() for p in sys.argv[1:]) "
                "and time.monotonic() < end: time.sleep(0.01)")
        paths = [str(FLAGS / name) for name in others]
        subprocess.run([sys.executable, "-c", poll, *paths], check=True, timeout=WAIT_S)
        ok = all((FLAGS / name).exists() for name in others)
    elif kind == "http":
        ok = sync_chat(client, "hi") == {reply!r}
    elif kind == "stuck":  # blocks past agent_timeout_s, until the test lets it go
        wait_blocking("release")
        ok = False
    ok = ok and await ask(client) == {reply!r}  # and the engine still serves it
    return 1.0 if ok and thread else 0.0
"""


def _agent(tmp_path) -> str:
    flags = tmp_path / "flags"
    flags.mkdir()
    path = tmp_path / "blocking_agent.py"
    path.write_text(textwrap.dedent(AGENT.format(flags=str(flags), reply=REPLY)))
    return f"{path}:run"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("kind", ["sleep", "subprocess", "http"])
def test_a_blocking_function_agent_stalls_only_its_own_episode(tokenizer, tmp_path, kind):
    # The blocker starts first and waits (blocking its thread) for the others to finish:
    # they can only if the worker's loop still serves them meanwhile.
    records = [record(f"{kind}-0")] + [record(f"other-{i}") for i in range(3)]
    episodes = run_episodes(tokenizer, records, agent=_agent(tmp_path), agent_timeout_s=60.0)
    for episode in episodes:
        assert (episode.finish_reason, episode.reward) == ("stop", 1.0), episode.error


def test_agent_timeout_ends_a_function_agent_blocked_past_it(tokenizer, tmp_path, caplog):
    records = [record("stuck-0")] + [record(f"other-{i}") for i in range(3)]
    spec = _agent(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            stuck, *others = run_episodes(tokenizer, records, agent=spec, agent_timeout_s=2.0)
    finally:
        (tmp_path / "flags" / "release").touch()  # the abandoned thread ends too
    assert stuck.finish_reason == "env_error" and stuck.timed_out, stuck.error
    assert "agent_timeout_s=2" in stuck.error
    for episode in others:
        assert (episode.finish_reason, episode.reward) == ("stop", 1.0), episode.error
    abandoned = [r for r in caplog.records if "is abandoned" in r.getMessage()]
    assert len(abandoned) == 1 and "stuck-0" in abandoned[0].getMessage()
