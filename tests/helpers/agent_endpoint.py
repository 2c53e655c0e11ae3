"""The agent endpoint (recipe/agent/endpoint) in-process for unit tests: a scripted engine in
place of vLLM, the endpoint on the tiny tokenizer, and ``raw_agent``, an agent that sends
the raw request bodies a test scripts (what no typed client would send) and keeps every
answer.

    ScriptedEngine(tokenizer, replies)   samples each reply + EOS; can cut a turn as a
                                         weight sync does, fail, or take its time
    make_endpoint(tokenizer, spec=...)   EndpointEpisodes on 127.0.0.1
    run_episode(endpoint, engine)        one episode, the endpoint closed after it
    RAW.script = [("/chat/completions", body), ...]; spec RAW_AGENT -> RAW.answers
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import EpisodeCut, TurnOutput
from recipe.agent.endpoint.episodes import EndpointEpisodes
from recipe.agent.render import ObservationRenderer
from recipe.protocol import PromptRecord

RECORD = PromptRecord("p-0", "What is 2 + 3?", "5", "test")
RAW_AGENT = "tests.helpers.agent_endpoint:raw_agent"


class ScriptedEngine:
    """Samples the test's replies in order (each + EOS). ``cut_at``: the first request is
    aborted after that many tokens and the version goes up, as a weight sync does; the
    continuation request samples the rest. ``fail``: every request raises it. ``delays``:
    seconds each request takes, in order (then none); a request cancelled meanwhile (its
    episode ended) is counted in ``cancelled``, as vLLM aborts it."""

    def __init__(self, tokenizer, replies, *, cut_at=None, fail=None, wait_cut=False, delays=()):
        self.tokenizer, self.replies = tokenizer, list(replies)
        self.cut_at, self.fail, self.wait_cut = cut_at, fail, wait_cut
        self.delays = list(delays)
        self.version, self.calls, self.sampled = 0, [], []
        self.cancelled = 0
        self._pending: list[int] = []

    async def generate_turn(self, context_ids, max_tokens, seed):
        self.calls.append({"context": list(context_ids), "max_tokens": max_tokens, "seed": seed})
        if self.fail is not None:
            raise self.fail
        try:
            await asyncio.sleep(self.delays.pop(0) if self.delays else 0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if not self._pending:
            text = self.replies.pop(0)
            eos = [self.tokenizer.eos_token_id]
            self._pending = list(self.tokenizer.encode(text, add_special_tokens=False)) + eos
        take = min(max_tokens, len(self._pending))
        finish = "stop" if take == len(self._pending) else "length"
        if self.cut_at is not None and take > self.cut_at:
            take, finish, self.cut_at = self.cut_at, "aborted", None
        ids, self._pending = self._pending[:take], self._pending[take:]
        if finish == "length":
            self._pending = []
        out = TurnOutput(ids, [-0.25] * take, [self.version] * take, finish, num_cached_tokens=3)
        if finish == "aborted":
            self.version += 1
        self.sampled += ids
        return out

    async def wait_until_running(self):
        if self.wait_cut:
            raise EpisodeCut("the worker stopped")


def make_endpoint(tokenizer, spec=None, command=None, **overrides) -> EndpointEpisodes:
    config = MultiTurnConfig(enable=True, agent=spec, agent_command=command, **overrides)
    renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id], "user")
    endpoint = EndpointEpisodes(config, renderer)
    endpoint.server._host = "127.0.0.1"
    return endpoint


def run_episode(endpoint, engine, budget=200, seed=7, record=RECORD):
    async def go():
        try:
            return await endpoint.run_episode(engine, record, budget, seed)
        finally:
            await endpoint.close()

    return asyncio.run(go())


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


Step = tuple[str, Any] | Callable[[list["Answer"]], tuple[str, Any]]
"""A request of ``RAW.script``: (path under /v1, body), or a function of the answers so
far that returns one. A body of bytes is sent as is, anything else as JSON."""


@dataclass(slots=True)
class Answer:
    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return self.body.get("error", {}).get("message", "")

    @property
    def code(self) -> str | None:
        return self.body.get("error", {}).get("code")


@dataclass(slots=True)
class RawScript:
    script: list[Step] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)

    def reset(self, script: list[Step]) -> None:
        self.script, self.answers = list(script), []


RAW = RawScript()


async def raw_agent(client, record) -> None:
    """Sends ``RAW.script`` in order with the episode's key; keeps each answer."""
    headers = {"Authorization": f"Bearer {client.api_key}"}
    async with httpx.AsyncClient(
        base_url=str(client.base_url).rstrip("/"), headers=headers, timeout=30
    ) as http:
        for step in RAW.script:
            path, body = step(RAW.answers) if callable(step) else step
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = await http.post(
                path, content=content, headers={"Content-Type": "application/json"}
            )
            try:
                answer = response.json()
            except ValueError:
                answer = {"error": {"message": response.text}}
            RAW.answers.append(Answer(response.status_code, answer))
