"""The agent endpoint under fuzzing (tests/unit/test_endpoint_fuzz.py): the real ``AgentServer``
on an event loop of the test's, real HTTP through aiohttp's client, episodes over a
``FuzzEngine`` that samples what a case drew, and the properties every answer keeps.

    harness = FuzzHarness(setups)         one server and loop for a module's tests
    harness.run("fields", tier, case)     one hypothesis example: case(FuzzCase) sends its
                                          requests; each answer is checked as it comes
      ep = case.open(setup)               a ChatEpisode on the server (its key, its engine)
      await case.post(ep, path, body)     checked: 200 (one turn more, showing what the
                                          engine sampled) or 4xx with an OpenAI error body
                                          (the episode unchanged, counted)
    -> then, per episode: failure() None unless the engine failed, the recorded tokens are
       the engine's in order (lengths agree), a valid request is still served; and a
       fresh episode on the same server is served

A property that breaks raises ``AssertionError`` (hypothesis shrinks it); every example is
tallied per case class (cases, answers by status, run failures) and written to
``$RECIPE_FUZZ_REPORT`` when the harness closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from recipe.agent.chat_session import ChatSession
from recipe.agent.endpoint.bodies import BUDGET_CODE
from recipe.agent.endpoint.chat import ChatEpisode, EpisodeLimits
from recipe.agent.endpoint.server import AgentServer, Credentials, body_limit
from recipe.agent.render import ObservationRenderer
from recipe.agent.tool_calls import TurnParser
from tests.helpers.endpoint_fuzz_checks import (
    FuzzEngine,
    LogCapture,
    check_answer,
    check_tokens,
    check_turn,
    snapshot,
)

logger = logging.getLogger(__name__)

LIMITS = EpisodeLimits(response_length=384, max_turns=6, max_context=4096, max_prompt=1024)
"""Every fuzzed episode's budgets: small, so that cases reach them."""
RECURSION_LIMIT = 1000
"""CPython's default, what a worker serves with. Hypothesis raises the limit by 2,000 while
a test runs, which would let nesting that fails in a worker (a model's 1,000 brackets, a
body's deep JSON) pass here: each case runs under this one."""
CASE_DEADLINE_S = 120.0
REQUEST_DEADLINE_S = 30.0
FOLLOW_UP = {"model": "m", "messages": [{"role": "user", "content": "Follow-up 7f3a: 2 + 3?"}]}
"""A valid request no fuzzed conversation extends: it always starts a new segment."""
CHAT, COMPLETE = "/chat/completions", "/completions"


@dataclass(slots=True)
class Setup:
    """What an endpoint serves with: a tokenizer and its chat template, a tool parser."""

    name: str
    renderer: ObservationRenderer
    parser: TurnParser
    tools_rendered: bool


@dataclass(slots=True)
class Answer:
    status: int
    body: Any
    """The JSON answer (None: not JSON; a list of events for a stream)."""
    text: str
    content_type: str


@dataclass(slots=True)
class OpenEpisode:
    """An episode on the server and what its answers so far add up to."""

    chat: ChatEpisode
    credentials: Credentials
    engine: FuzzEngine
    num_ok: int = 0
    """Requests answered 200: the turns the episode must hold."""
    num_agent_errors: int = 0
    """Requests refused as the agent's (4xx, not a budget, not 429)."""

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credentials.api_key}"}


@dataclass(slots=True)
class ClassTally:
    """One case class's figures in one tier."""

    cases: int = 0
    run_failures: int = 0
    """Cases that broke a property (hypothesis replays a failing case while it shrinks it)."""
    statuses: Counter[int] = field(default_factory=Counter)
    """The case's own requests' answers."""
    follow_ups: Counter[int] = field(default_factory=Counter)
    """The answers to the valid requests after each case."""
    wall_s: float = 0.0
    """The class's test, hypothesis's drawing included."""


class FuzzCase:
    """One example's requests (module docstring)."""

    def __init__(self, harness: FuzzHarness, statuses: Counter[int]):
        self.harness, self.statuses = harness, statuses
        self.episodes: list[OpenEpisode] = []

    def open(
        self, setup: Setup, engine: FuzzEngine | None = None, limits: EpisodeLimits = LIMITS
    ) -> OpenEpisode:
        """A new episode of ``setup`` on the server, sampling from ``engine``."""
        renderer = setup.renderer
        engine = engine or FuzzEngine(renderer.tokenizer)
        chat = ChatEpisode(
            engine,
            ChatSession(renderer),
            setup.parser,
            limits,
            vocab_size=len(renderer.tokenizer),
            seed=7,
            tools_rendered=setup.tools_rendered,
        )
        episode = OpenEpisode(chat, self.harness.server.open(chat), engine)
        self.episodes.append(episode)
        return episode

    async def post(
        self,
        ep: OpenEpisode,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        *,
        concurrent: bool = False,
    ) -> Answer:
        """``body`` (JSON, or bytes as they are) posted with the episode's key; checked.
        ``concurrent``: other requests of the episode run meanwhile, so only the answer
        and the counters are checked here (the tokens after the case)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json"} | ep.auth | (headers or {})
        before, refusal = snapshot(ep.chat), ep.chat.refusal
        errors_before, failed_before = ep.chat.num_request_errors, ep.engine.num_failed
        calls_before = len(ep.engine.calls)
        answer = await self.harness.send("POST", path, data, sent)
        self.statuses[answer.status] += 1
        engine_failed = ep.engine.num_failed > failed_before
        check_answer(answer, path, body, engine_error=ep.engine.error if engine_failed else None)
        if answer.status == 200:
            ep.num_ok += 1
            if not concurrent:
                check_turn(answer, body, ep.engine.calls[calls_before:], ep.chat)
        elif not concurrent:
            assert snapshot(ep.chat) == before, f"a {answer.status} answer changed the episode"
            budget = _code(answer) == BUDGET_CODE
            assert (ep.chat.refusal is not None) == (budget or refusal is not None), answer.text
        if _is_agents(answer):
            ep.num_agent_errors += 1
        if not concurrent:
            counted = ep.chat.num_request_errors - errors_before
            assert counted == int(_is_agents(answer)), (answer.status, answer.text[:300])
        failure = self.harness.server.failure(ep.credentials)
        if ep.engine.num_failed:
            assert failure is ep.engine.error, f"the engine's failure is not held: {failure!r}"
        else:
            assert failure is None, f"a failure charged to the engine: {failure!r}"
        return answer

    async def raw(
        self,
        ep: OpenEpisode,
        method: str,
        path: str,
        data: bytes | None,
        headers: dict[str, str],
        *,
        routed: bool,
    ) -> Answer:
        """A request as it is (any method, path, headers); checked. ``routed``: it surely
        reaches ``ep`` (its key as ``Bearer <key>``, POST to a completions path)."""
        before, errors_before = snapshot(ep.chat), ep.chat.num_request_errors
        answer = await self.harness.send(method, path, data, headers)
        self.statuses[answer.status] += 1
        check_answer(answer, path, _json_or_none(data), engine_error=None, head=method == "HEAD")
        if answer.status == 200 and method == "POST":
            ep.num_ok += 1
        else:
            assert snapshot(ep.chat) == before, f"a {answer.status} answer changed the episode"
        counted = ep.chat.num_request_errors - errors_before
        assert counted in (0, int(_is_agents(answer))), (answer.status, answer.text[:300])
        if routed:
            assert counted == int(_is_agents(answer)), (answer.status, answer.text[:300])
        ep.num_agent_errors += counted
        assert self.harness.server.failure(ep.credentials) is None
        return answer

    async def finish(self, follow_ups: Counter[int]) -> None:
        """The properties that hold after the case: per episode, then a fresh one (their
        answers counted in ``follow_ups``)."""
        self.statuses = follow_ups
        for ep in list(self.episodes):
            await self._follow_up(ep)
            check_tokens(ep.chat, ep.engine)
            assert ep.chat.num_turns == ep.num_ok, (ep.chat.num_turns, ep.num_ok)
            assert ep.chat.num_request_errors == ep.num_agent_errors
        fresh = self.open(self.harness.setups[0])
        answer = await self.post(fresh, CHAT, FOLLOW_UP)
        assert answer.status == 200, f"a fresh episode is not served: {answer.text[:300]}"

    async def _follow_up(self, ep: OpenEpisode) -> None:
        if ep.engine.num_failed:  # the run fails here; nothing more to serve
            return
        spent = ep.chat.refusal is not None or ep.chat.num_turns >= ep.chat.limits.max_turns
        answer = await self.post(ep, CHAT, FOLLOW_UP)
        if answer.status != 200 or spent:
            assert (answer.status, _code(answer)) == (400, BUDGET_CODE), (
                f"a valid request after the case: {answer.status} {answer.text[:300]}"
            )

    def close(self) -> None:
        for ep in self.episodes:
            self.harness.server.close_episode(ep.credentials)


class FuzzHarness:
    """The server, its loop and a client, for one module's fuzz tests."""

    def __init__(self, setups: list[Setup]):
        self.setups = setups
        self.loop = asyncio.new_event_loop()
        self.logs = LogCapture(self.loop)
        self.server = AgentServer("127.0.0.1")
        self.tally: dict[str, dict[str, ClassTally]] = {}
        self.seeds: dict[str, int] = {}
        """The hypothesis seed of each tier that was not derandomized (for the report)."""
        self._http: aiohttp.ClientSession | None = None
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        await self.server.start(body_limit(LIMITS.max_context))
        # A connection per request: a request the server refuses mid-body may leave its
        # connection unusable, which must not fail the next case.
        connector = aiohttp.TCPConnector(force_close=True)
        self._http = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    @property
    def max_body_bytes(self) -> int:
        return self.server.max_body_bytes

    def tally_of(self, tier: str, name: str) -> ClassTally:
        return self.tally.setdefault(tier, {}).setdefault(name, ClassTally())

    def run(self, name: str, tier: str, case: Callable[[FuzzCase], Awaitable[None]]) -> None:
        """One example of class ``name``: ``case``'s requests, then ``FuzzCase.finish``."""
        tally = self.tally_of(tier, name)
        tally.cases += 1
        fuzz = FuzzCase(self, tally.statuses)
        self.logs.clear()
        try:
            with _recursion_limit(RECURSION_LIMIT):
                self.loop.run_until_complete(
                    asyncio.wait_for(self._case(fuzz, case, tally.follow_ups), CASE_DEADLINE_S)
                )
            self.logs.check(engine_failed=any(ep.engine.num_failed for ep in fuzz.episodes))
        except BaseException:
            tally.run_failures += 1
            raise
        finally:
            fuzz.close()

    async def _case(
        self,
        fuzz: FuzzCase,
        case: Callable[[FuzzCase], Awaitable[None]],
        follow_ups: Counter[int],
    ) -> None:
        await case(fuzz)
        await fuzz.finish(follow_ups)

    async def send(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> Answer:
        """One request to ``/v1`` + ``path``; a dropped connection fails the case."""
        assert self._http is not None
        url = self.server.base_url + path
        timeout = aiohttp.ClientTimeout(total=REQUEST_DEADLINE_S)
        try:
            async with self._http.request(
                method, url, data=data, headers=headers, timeout=timeout
            ) as response:
                raw = await response.read()
                content_type = response.content_type
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise AssertionError(f"{method} {path}: no answer ({exc!r})") from exc
        text = raw.decode("utf-8", errors="replace")
        return Answer(response.status, _decode(text, content_type), text, content_type)

    def close(self) -> None:
        if self._http is not None:
            self.loop.run_until_complete(self._http.close())
        self.loop.run_until_complete(self.server.close())
        self.loop.close()
        self.logs.close()
        self.report()

    def report(self) -> None:
        """One line per class, and ``$RECIPE_FUZZ_REPORT`` (JSON) when set."""
        out: dict[str, Any] = {}
        for tier, classes in self.tally.items():
            rows = {name: _row(t) for name, t in classes.items()}
            for name, row in rows.items():
                logger.info("endpoint fuzz %s/%s: %s", tier, name, json.dumps(row))
            out[tier] = {
                "seed": self.seeds.get(tier),
                "cases": sum(r["cases"] for r in rows.values()),
                "run_failures": sum(r["run_failures"] for r in rows.values()),
                "wall_s": round(sum(r["wall_s"] for r in rows.values()), 1),
                "classes": rows,
            }
        path = os.environ.get("RECIPE_FUZZ_REPORT")
        if path and out:
            with open(path, "w") as f:
                json.dump(out, f, indent=2)


def _row(tally: ClassTally) -> dict[str, Any]:
    return {
        "cases": tally.cases,
        "run_failures": tally.run_failures,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "follow_up_statuses": {str(k): v for k, v in sorted(tally.follow_ups.items())},
        "wall_s": round(tally.wall_s, 2),
    }


@contextlib.contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    saved = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(saved)


def _decode(text: str, content_type: str) -> Any:
    if content_type == "text/event-stream":
        events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
        return [e if e == "[DONE]" else json.loads(e) for e in events]
    try:
        return json.loads(text)
    except ValueError:
        return None


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _code(answer: Answer) -> Any:
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def _is_agents(answer: Answer) -> bool:
    """What ``agent/request_errors`` counts: a 4xx that is not a budget nor a 429."""
    return 400 <= answer.status < 500 and answer.status != 429 and _code(answer) != BUDGET_CODE
