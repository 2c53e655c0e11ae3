"""The agent endpoint's rule, fuzzed: whatever a request carries or a model writes, only the
engine's generate failing is the run's (recipe/agent/endpoint/chat.py).

Property-based (hypothesis) against the real ``AgentServer`` over HTTP, on the tiny tokenizer
with a template that renders tools and one that raises on non-alternating roles (as Llama 3
and Mistral templates do), with our hermes parser and vLLM's pythonic one, over a scripted
engine that samples drawn text or token ids (tests/helpers/endpoint_fuzz.py). Every answer is
200 or an OpenAI-shaped 4xx (a 500 only when the engine failed, and then the failure is held
for the run), a refused request leaves its episode unchanged and is counted, a 200 shows
the turn the engine sampled (usage, finish reason, text), the recorded tokens are the
engine's in order, and a valid request is served afterwards (tests/helpers/
endpoint_fuzz_checks.py).

    case class       what is drawn
    fields           valid bodies with fields replaced by any JSON, or dropped
    messages         message lists: any roles, content types, tool_calls, orders; extended
    token_ids        /v1/completions prompts: id lists of every kind, text, special tokens
    tool_schemas     tools of any shape, names and parameters; a call to them, answered
    sizes            long strings, many messages or tools, deep nesting, the body limit
    raw              non-JSON and bad UTF-8 bodies, content types and encodings, keys,
                     paths, methods
    model_output     what the engine samples (tool-call-like text, deep brackets, ids), with
                     and without tools, streamed or not, cut by a weight sync
    sequences        several requests of one episode: continue, edit, truncate, change
                     tools, stream, mix completions and chat, bad ones between, concurrent
    engine_failure   the engine raising inside generate, or in its wait after a weight
                     sync's cut: 500 (503: the worker stopped) and the failure held

Two sizes: the CI tier runs each class ``CI_EXAMPLES`` times, derandomized; the nightly tier
(``-m nightly``) runs ``NIGHTLY_SCALE`` times as many from ``$RECIPE_FUZZ_SEED`` (or a random
seed, printed). ``RECIPE_FUZZ_REPORT=path.json`` writes cases, answers by status and run
failures per class.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from recipe.agent.context import EpisodeCut
from recipe.agent.endpoint.chat import EpisodeLimits, renders_tools
from recipe.agent.endpoint.server import body_limit
from recipe.agent.render import ObservationRenderer
from recipe.agent.tool_parsers import make_tool_parser
from recipe.tiny import build_tokenizer
from tests.helpers import endpoint_fuzz_bodies as bodies
from tests.helpers import endpoint_fuzz_edges as edges
from tests.helpers.chat_templates import TOOLS_TEMPLATE
from tests.helpers.endpoint_fuzz import (
    LIMITS,
    Answer,
    FuzzCase,
    FuzzHarness,
    OpenEpisode,
    Setup,
)
from tests.helpers.endpoint_fuzz_checks import FuzzEngine

pytestmark = pytest.mark.model  # builds transformers tokenizers, imports vLLM's parsers

CHAT, COMPLETE, USER = bodies.CHAT, bodies.COMPLETE, bodies.USER
# As Llama 3 and Mistral templates do: raise_exception on roles that do not alternate.
ALTERNATING_TEMPLATE = (
    "{% for m in messages %}{% if loop.index0 > 0 and "
    "m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}{% endfor %}" + TOOLS_TEMPLATE
)
LONG_TURNS = EpisodeLimits(response_length=3800, max_turns=6, max_context=4096, max_prompt=256)
"""Room for a model turn of 1,500 nested brackets (two tokens each)."""
CI_EXAMPLES = {
    "fields": 70,
    "messages": 70,
    "token_ids": 50,
    "tool_schemas": 50,
    "sizes": 25,
    "raw": 70,
    "model_output": 70,
    "sequences": 50,
    "engine_failure": 15,
}
NIGHTLY_SCALE = 25
NIGHTLY_SEED = int(os.environ.get("RECIPE_FUZZ_SEED") or random.randrange(2**32))
TIERS = [pytest.param("ci"), pytest.param("nightly", marks=pytest.mark.nightly)]
DEEP = "[" * 1000 + "]" * 1000
KNOWN_CASES = {
    "messages": [
        ("tools/hermes", ([USER, {"role": "assistant", "tool_calls": ["x"]}], [], False, [])),
        ("strict/hermes", ([USER, USER], [], False, [])),  # the template's raise_exception
    ],
    "token_ids": [("tools/hermes", ([1, 10**12], [], "", False, []))],
    "tool_schemas": [  # tools that vLLM's request model rejects (strict is not a bool)
        ("tools/pythonic", ([{"function": {"name": "add", "strict": [1]}}], None, ["[add(a=1)]"]))
    ],
    "model_output": [
        ("tools/hermes", ([f"<tool_call>{DEEP}</tool_call>"], True, False, None)),
        ("tools/pythonic", ([f"[add(a={DEEP})]"], True, False, None)),
    ],
}
"""Cases run in both tiers, (setup, drawn) of their class: those that ended a whole run
before the rule (tool_calls that are not objects, a template's raise_exception, a token id
of 10**12, a model's 1,000 nested brackets) and tools only vLLM's parser rejects."""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    setups = []
    for template_name, template in (("tools", TOOLS_TEMPLATE), ("strict", ALTERNATING_TEMPLATE)):
        tok = build_tokenizer(tmp_path_factory.mktemp(template_name), model_max_length=4096)
        tok.chat_template = template
        assert len(tok) == bodies.VOCAB_SIZE
        renderer = ObservationRenderer(tok, [tok.eos_token_id], "user")
        for parser in ("hermes", "pythonic"):
            setups.append(
                Setup(
                    f"{template_name}/{parser}",
                    renderer,
                    make_tool_parser(parser, tok),
                    renders_tools(tok),
                )
            )
    fuzz = FuzzHarness(setups)
    yield fuzz
    fuzz.close()


Case = Callable[[FuzzCase, Any], Awaitable[None]]


def _fuzz(harness: FuzzHarness, tier: str, name: str, strategy: Any, case: Case) -> None:
    """Run ``case`` on ``strategy``'s examples in ``tier``'s size."""
    setups = st.sampled_from(harness.setups)

    @given(setups, strategy)
    def one(setup: Setup, drawn: Any) -> None:
        harness.run(name, tier, lambda fuzz: case(fuzz, (setup, drawn)))

    by_name = {setup.name: setup for setup in harness.setups}
    for setup_name, drawn in KNOWN_CASES.get(name, []):
        one = example(by_name[setup_name], drawn)(one)
    nightly = tier == "nightly"
    test = settings(
        max_examples=CI_EXAMPLES[name] * (NIGHTLY_SCALE if nightly else 1),
        derandomize=not nightly,
        database=None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )(one)
    if nightly:
        print(f"endpoint fuzz {name}: RECIPE_FUZZ_SEED={NIGHTLY_SEED}")
        harness.seeds[tier] = NIGHTLY_SEED
        test = seed(NIGHTLY_SEED)(test)
    start = time.perf_counter()
    try:
        test()
    finally:
        harness.tally_of(tier, name).wall_s += time.perf_counter() - start


def _reply(answer: Answer) -> dict[str, Any]:
    """The assistant message of a 200 answer, as a client echoes it (a stream: its delta)."""
    if isinstance(answer.body, list):
        delta = dict(answer.body[0]["choices"][0]["delta"])
        for call in delta.get("tool_calls") or []:
            call.pop("index", None)
        return delta
    return answer.body["choices"][0]["message"]


def _text(answer: Answer) -> str:
    """The text of a 200 ``/v1/completions`` answer (a stream: its chunks joined)."""
    if isinstance(answer.body, list):
        return "".join(e["choices"][0]["text"] for e in answer.body if e != "[DONE]")
    return str(answer.body["choices"][0]["text"])


def _results(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """What an agent sends after ``reply``: a result per tool call, or a user turn."""
    calls = reply.get("tool_calls") or []
    if not calls:
        return [{"role": "user", "content": "And 4 + 4?"}]
    return [{"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in calls]


def _engine(setup: Setup, outputs: list[Any], **kwargs: Any) -> FuzzEngine:
    return FuzzEngine(setup.renderer.tokenizer, outputs, **kwargs)


# ---- one case class each ---------------------------------------------------------------------


async def _fields(fuzz: FuzzCase, drawn: Any) -> None:
    setup, ((path, body), output) = drawn
    ep = fuzz.open(setup, _engine(setup, [output]))
    await fuzz.post(ep, path, body)


async def _messages(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (first, more, with_tools, outputs) = drawn
    ep = fuzz.open(setup, _engine(setup, outputs))
    tools = {"tools": bodies.TOOLS} if with_tools else {}
    answer = await fuzz.post(ep, CHAT, {"messages": first} | tools)
    if answer.status == 200:
        await fuzz.post(ep, CHAT, {"messages": [*first, _reply(answer), *more]} | tools)


async def _token_ids(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (prompt, more_ids, more_text, stream, outputs) = drawn
    ep = fuzz.open(setup, _engine(setup, outputs))
    answer = await fuzz.post(ep, COMPLETE, {"prompt": prompt, "stream": stream})
    if answer.status != 200:
        return
    if isinstance(prompt, str):  # the text so far, extended: a delta of the same segment
        await fuzz.post(ep, COMPLETE, {"prompt": prompt + _text(answer) + more_text})
    elif isinstance(prompt, list):
        await fuzz.post(ep, COMPLETE, {"prompt": [*prompt, *more_ids]})


async def _tool_schemas(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (tools, choice, outputs) = drawn
    ep = fuzz.open(setup, _engine(setup, outputs))
    body: dict[str, Any] = {"messages": [USER], "tools": tools}
    if choice is not None:
        body["tool_choice"] = choice
    answer = await fuzz.post(ep, CHAT, body)
    if answer.status == 200:
        reply = _reply(answer)
        await fuzz.post(ep, CHAT, body | {"messages": [USER, reply, *_results(reply)]})


async def _sizes(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (path, data) = drawn
    ep = fuzz.open(setup, _engine(setup, []))
    await fuzz.post(ep, path, data)


async def _raw(fuzz: FuzzCase, drawn: Any) -> None:
    setup, ((method, path, data, headers), output) = drawn
    ep = fuzz.open(setup, _engine(setup, [output]))
    key = ep.credentials.api_key
    headers = {k: v.replace(edges.KEY, key) for k, v in headers.items()}
    routed = (
        method == "POST"
        and path in (CHAT, COMPLETE)
        and headers.get("Authorization") == f"Bearer {key}"
    )
    await fuzz.raw(ep, method, path, data, headers, routed=routed)


async def _model_output(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (outputs, tools, stream, cut_at) = drawn
    ep = fuzz.open(setup, _engine(setup, outputs, cut_at=cut_at), LONG_TURNS)
    body: dict[str, Any] = {"messages": [USER], "stream": stream}
    if tools:
        body["tools"] = bodies.TOOLS
    answer = await fuzz.post(ep, CHAT, body)
    if answer.status == 200:
        reply = _reply(answer)
        await fuzz.post(ep, CHAT, body | {"messages": [USER, reply, *_results(reply)]})


async def _engine_failure(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (error, fail_after, cut_at, in_wait) = drawn
    fail_in_wait = in_wait and cut_at is not None  # the wait comes only after a cut
    engine = _engine(
        setup, [], cut_at=cut_at, fail=error("the engine died"), fail_after=fail_after,
        fail_in_wait=fail_in_wait,
    )  # fmt: skip
    ep = fuzz.open(setup, engine)
    history: list[dict[str, Any]] = [USER]
    for _ in range(1 if fail_in_wait else fail_after + 1):  # up to the failing call
        answer = await fuzz.post(ep, CHAT, {"messages": history})
        if answer.status != 200:
            break
        history += [_reply(answer), {"role": "user", "content": "More?"}]
    assert engine.num_failed and fuzz.harness.server.failure(ep.credentials) is engine.error


ACTIONS = [
    "continue", "tool_results", "edit", "truncate", "same", "tools_on", "tools_off",
    "tools_changed", "stream", "max_tokens", "complete_new", "complete_extended",
    "complete_ids", "bad", "concurrent",
]  # fmt: skip
CHANGED_TOOLS = [{"type": "function", "function": {"name": "mul", "parameters": {}}}]


class Conversation:
    """One episode's requests as an agent sends them: its history as the endpoint returned
    it, its tools, its completions text."""

    def __init__(self, fuzz: FuzzCase, ep: OpenEpisode, bad: list[Any]):
        self.fuzz, self.ep, self.bad = fuzz, ep, bad
        self.history: list[dict[str, Any]] = []
        self.tools: list[Any] | None = None
        self.text: str | None = None
        self.last: tuple[str, Any] | None = None

    async def chat(self, messages: list[dict[str, Any]], **extra: Any) -> None:
        body = {"model": "m", "messages": messages} | extra
        if self.tools:
            body["tools"] = self.tools
        await self._post(CHAT, body)

    async def complete(self, prompt: Any, **extra: Any) -> None:
        await self._post(COMPLETE, {"model": "m", "prompt": prompt} | extra)

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        self.last = (path, body)
        answer = await self.fuzz.post(self.ep, path, body)
        self._returned(path, body, answer)

    def _returned(self, path: str, body: dict[str, Any], answer: Answer) -> None:
        if answer.status != 200:
            return
        if path == CHAT:
            self.history = [*body["messages"], _reply(answer)]
        elif isinstance(body["prompt"], str):
            self.text = body["prompt"] + _text(answer)

    def next_messages(self) -> list[dict[str, Any]]:
        if not self.history:
            return [USER]
        return [*self.history, *_results(self.history[-1])]

    async def act(self, action: str, number: int) -> None:
        """One action; ``number`` sizes it (max_tokens, requests at once)."""
        if action in ("continue", "tool_results"):
            await self.chat(self.next_messages())
        elif action == "edit" and self.history:
            first = dict(self.history[0], content=f"{self.history[0].get('content')} (edited)")
            await self.chat([first, *self.next_messages()[1:]])
        elif action == "truncate":
            await self.chat([*self.history[:-3], {"role": "user", "content": "Again?"}])
        elif action == "same" and self.last is not None:
            await self._post(*self.last)
        elif action.startswith("tools_"):
            self.tools = {"tools_on": bodies.TOOLS, "tools_off": None}.get(action, CHANGED_TOOLS)
            await self.chat(self.next_messages())
        elif action == "stream":
            await self.chat(self.next_messages(), stream=True)
        elif action == "max_tokens":
            await self.chat(self.next_messages(), max_tokens=number)
        elif action == "complete_new":
            await self.complete("Q: 2 + 3 =")
        elif action == "complete_extended" and self.text is not None:
            await self.complete(self.text + " Q: 4 + 4 =", stream=number % 2 == 0)
        elif action == "complete_ids":
            await self.complete(list(range(60, 60 + number)))
        elif action == "bad" and self.bad:
            await self.fuzz.post(self.ep, *self.bad.pop())
        elif action == "concurrent":
            await self._at_once(number)

    async def _at_once(self, number: int) -> None:
        body = {"model": "m", "messages": self.next_messages()}
        posts = [self.fuzz.post(self.ep, CHAT, body, concurrent=True) for _ in range(number)]
        for answer in await asyncio.gather(*posts):
            self._returned(CHAT, body, answer)


async def _sequences(fuzz: FuzzCase, drawn: Any) -> None:
    setup, (actions, bad, outputs, cut_at) = drawn
    conversation = Conversation(fuzz, fuzz.open(setup, _engine(setup, outputs, cut_at=cut_at)), bad)
    for action, number in actions:
        await conversation.act(action, number)


MODEL_OUTPUTS = st.lists(edges.model_outputs, max_size=3)
STRATEGIES: dict[str, tuple[Any, Case]] = {
    "fields": (st.tuples(bodies.field_requests(), edges.model_outputs), _fields),
    "messages": (
        st.tuples(bodies.messages, bodies.messages, st.booleans(), MODEL_OUTPUTS),
        _messages,
    ),
    "token_ids": (
        st.tuples(bodies.prompts, bodies.valid_ids, bodies.text, st.booleans(), MODEL_OUTPUTS),
        _token_ids,
    ),
    "tool_schemas": (
        st.tuples(bodies.tool_lists, bodies.tool_choice, MODEL_OUTPUTS),
        _tool_schemas,
    ),
    "sizes": (edges.sized_requests(body_limit(LIMITS.max_context)), _sizes),
    "raw": (st.tuples(edges.raw_requests(), edges.model_outputs), _raw),
    "model_output": (
        st.tuples(
            st.lists(edges.model_outputs, min_size=1, max_size=2),
            st.booleans(),
            st.booleans(),
            st.none() | st.integers(1, 40),
        ),
        _model_output,
    ),
    "sequences": (
        st.tuples(
            st.lists(
                st.tuples(st.sampled_from(ACTIONS), st.integers(1, 20)), min_size=1, max_size=8
            ),
            st.lists(bodies.field_requests(), max_size=2),
            st.lists(edges.model_outputs, max_size=8),
            st.none() | st.integers(1, 20),
        ),
        _sequences,
    ),
    "engine_failure": (
        st.tuples(
            st.sampled_from(
                [RuntimeError, ValueError, KeyError, OSError, TimeoutError, MemoryError, EpisodeCut]
            ),
            st.integers(0, 2),
            st.none() | st.integers(1, 3),
            st.booleans(),
        ),
        _engine_failure,
    ),
}


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("name", [n for n in STRATEGIES])
def test_no_request_or_model_turn_fails_the_run_unless_the_engine_does(harness, tier, name):
    strategy, case = STRATEGIES[name]
    _fuzz(harness, tier, name, strategy, case)
