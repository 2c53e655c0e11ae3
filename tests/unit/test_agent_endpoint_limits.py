"""The agent endpoint's limits (recipe/agent/endpoint): request bodies bounded by what an
episode holds, requests in flight per episode, requests cancelled when their episode ends,
budgets that end an episode for good, a new segment's prompt within the run's prompt budget,
and IPv6 node addresses. Through the real HTTP server (tests/helpers/agent_endpoint.py)."""

from __future__ import annotations

import asyncio
import socket
import textwrap
import time

import pytest

from recipe.agent.endpoint import chat, server
from recipe.agent.metrics import agent_metrics
from recipe.tiny import build_tokenizer
from tests.helpers.agent_endpoint import (
    RAW,
    RAW_AGENT,
    RECORD,
    ScriptedEngine,
    make_endpoint,
    run_episode,
)
from tests.helpers.chat_templates import TOOLS_TEMPLATE

pytestmark = pytest.mark.model  # builds a transformers tokenizer

CHAT, COMPLETE = "/chat/completions", "/completions"
USER = {"role": "user", "content": "What is 2 + 3?"}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def _agent(tmp_path, body: str) -> str:
    path = tmp_path / "limits_agent.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:run"


def _raw(tokenizer, script, replies, budget=200, **attributes):
    RAW.reset(script)
    engine = ScriptedEngine(tokenizer, replies)
    endpoint = make_endpoint(tokenizer, RAW_AGENT, max_assistant_turns=8)
    for name, value in attributes.items():
        setattr(endpoint, name, value)
    return run_episode(endpoint, engine, budget=budget), engine, RAW.answers


def test_the_body_limit_follows_the_engines_context_with_a_floor():
    assert server.body_limit(None) == server.body_limit(1024) == server.MIN_BODY_BYTES
    assert server.body_limit(131072) == 64 * 131072  # 8 MiB, not 64 MiB whatever the context


def test_a_body_over_what_an_episode_holds_is_refused_413(tokenizer):
    huge = {"messages": [{"role": "user", "content": "a" * (server.MIN_BODY_BYTES + 1)}]}
    script = [(CHAT, huge), (CHAT, {"messages": [USER]})]
    episode, engine, answers = _raw(tokenizer, script, ["Five."], max_context=1024)
    assert [a.status for a in answers] == [413, 200]
    assert f"over {server.MIN_BODY_BYTES} bytes" in answers[0].message
    assert episode.num_request_errors == 1 and len(engine.calls) == 1


def test_requests_beyond_the_cap_of_one_episode_are_refused_429_and_counted(tokenizer, tmp_path):
    extra = 4
    spec = _agent(
        tmp_path,
        f"""
        import asyncio, openai

        async def run(client, record):
            async def one(i):
                try:
                    await client.chat.completions.create(
                        model="m", messages=[{{"role": "user", "content": f"q{{i}}"}}])
                    return 200
                except openai.RateLimitError as exc:
                    return exc.status_code
            requests = [one(i) for i in range({chat.MAX_REQUESTS_PER_EPISODE + extra})]
            codes = await asyncio.gather(*requests)
            return float(codes.count(429))
        """,
    )
    # The first turn takes its time: every request arrives while it is served.
    replies = [f"a{i}" for i in range(chat.MAX_REQUESTS_PER_EPISODE)]
    engine = ScriptedEngine(tokenizer, replies, delays=[2.0])
    endpoint = make_endpoint(tokenizer, spec, max_assistant_turns=chat.MAX_REQUESTS_PER_EPISODE)
    episode = run_episode(endpoint, engine)
    assert episode.finish_reason == "stop", episode.error
    assert episode.reward == extra and episode.num_requests_throttled == extra
    assert len(engine.calls) == chat.MAX_REQUESTS_PER_EPISODE
    metrics = agent_metrics([episode.to_trajectory("p", 0)])
    assert metrics["agent/requests_throttled"] == extra and metrics["agent/request_errors"] == 0


def test_a_request_in_flight_when_its_episode_ends_is_cancelled_and_records_nothing(
    tokenizer, tmp_path
):
    spec = _agent(
        tmp_path,
        """
        import asyncio

        async def run(client, record):
            messages = [{"role": "user", "content": "hi"}]
            await client.chat.completions.create(model="m", messages=messages)
            again = client.chat.completions.create(model="m", messages=messages + messages)
            asyncio.get_running_loop().create_task(again)  # left running: the agent returns
            await asyncio.sleep(0.3)
            return 1.0
        """,
    )
    engine = ScriptedEngine(tokenizer, ["Hello.", "Again."], delays=[0.0, 30.0])
    endpoint = make_endpoint(tokenizer, spec)

    async def go():
        try:
            episode = await endpoint.run_episode(engine, RECORD, 200, 7)
            built = list(episode.tokens.response_ids)
            deadline = time.monotonic() + 5.0
            while not engine.cancelled and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return episode, built
        finally:
            await endpoint.close()

    episode, built = asyncio.run(go())
    assert engine.cancelled == 1 and len(engine.calls) == 2  # its engine request aborted
    assert episode.num_turns == 1 and episode.tokens.response_ids == built
    assert episode.finish_reason == "stop" and episode.reward == 1.0


def test_after_a_budget_refusal_every_request_of_the_episode_is_refused(tokenizer):
    long = {"role": "user", "content": "Explain it again, at length. " * 4}
    script = [
        (CHAT, {"messages": [USER]}),
        lambda a: (CHAT, {"messages": [USER, a[0].body["choices"][0]["message"], long]}),
        # A fresh conversation (a new segment) would fit: the episode has ended anyway.
        (CHAT, {"messages": [{"role": "user", "content": "Hi."}]}),
        (COMPLETE, {"prompt": "Hi."}),
    ]
    episode, engine, answers = _raw(tokenizer, script, ["Five.", "Hi.", "Hi."], budget=60)
    assert [a.status for a in answers] == [200, 400, 400, 400]
    assert {a.code for a in answers[1:]} == {"context_length_exceeded"}
    assert "the episode ended on a budget" in answers[2].message
    assert episode.finish_reason == "length" and len(engine.calls) == 1
    assert episode.num_request_errors == 0  # budgets are not malformed requests


def test_a_new_segments_prompt_over_the_runs_prompt_budget_is_refused(tokenizer):
    long = {"role": "user", "content": "What is 2 + 3? " * 8}
    script = [(CHAT, {"messages": [long]}), (COMPLETE, {"prompt": long["content"]})]
    replies = ["Five.", "Six."]
    episode, engine, answers = _raw(tokenizer, script, replies, max_prompt_length=64)
    assert [a.status for a in answers] == [400, 400]
    assert answers[0].code == "context_length_exceeded"
    assert "over the run's prompt budget of 64 (data.max_prompt_length)" in answers[0].message
    assert not engine.calls
    RAW.reset([(CHAT, {"messages": [USER]})])  # a short one fits the same budget
    endpoint = make_endpoint(tokenizer, RAW_AGENT)
    endpoint.max_prompt_length = 64
    episode = run_episode(endpoint, ScriptedEngine(tokenizer, ["Five."]))
    assert [a.status for a in RAW.answers] == [200] and episode.finish_reason == "stop"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_an_ipv6_node_address_is_written_in_brackets():
    assert server.base_url("::1", 80) == "http://[::1]:80/v1"
    assert server.base_url("10.0.0.2", 80) == "http://10.0.0.2:80/v1"


@pytest.mark.skipif(not _ipv6_loopback(), reason="this host has no IPv6 loopback")
def test_an_agent_reaches_an_endpoint_served_on_ipv6(tokenizer, tmp_path):
    spec = _agent(
        tmp_path,
        """
        async def run(client, record):
            out = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            return 1.0 if out.choices[0].message.content == "Hello." else 0.0
        """,
    )
    endpoint = make_endpoint(tokenizer, spec)
    endpoint.server._host = "::1"
    episode = run_episode(endpoint, ScriptedEngine(tokenizer, ["Hello."]))
    assert episode.finish_reason == "stop" and episode.reward == 1.0, episode.error
