"""An episode's chat requests as token sequences (recipe/agent/chat_session.py) and a model
turn's tool calls as the chat API shows them (recipe/agent/tool_calls.py), on the tiny
byte-level tokenizer with a chat template that renders tools and tool messages."""

from __future__ import annotations

import itertools
import json

import pytest

from recipe.agent.chat_session import ChatSession, extends
from recipe.agent.render import ObservationRenderer
from recipe.agent.tool_calls import parse_tool_calls
from recipe.protocol import ENV_TOKEN_VERSION
from recipe.tiny import build_tokenizer
from tests.helpers.chat_templates import TOOLS, TOOLS_TEMPLATE

pytestmark = pytest.mark.model  # builds a transformers tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


@pytest.fixture
def session(tokenizer):
    return ChatSession(ObservationRenderer(tokenizer, [tokenizer.eos_token_id], "user"))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _render(tokenizer, messages, tools=None) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    return _ids(tokenizer, text)


def _turn(tokenizer, session, step, text: str, version: int):
    """The model samples ``text`` + EOS after ``step`` (a request's continuation), which is
    recorded; returns the turn's ids and the message the client gets."""
    ids = [*_ids(tokenizer, text), tokenizer.eos_token_id]
    parsed = parse_tool_calls(text, "hermes", (f"call_{i}" for i in itertools.count()))
    message = parsed.message()
    session.record(step, ids, [-0.5] * len(ids), [version] * len(ids), message)
    return ids, message


def test_a_tool_round_trip_extends_one_segment_with_the_sampled_tokens_kept(tokenizer, session):
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+3?"}]
    step = session.context(messages, TOOLS)
    assert step.new and step.context_ids == _render(tokenizer, messages, TOOLS)
    assert '"name": "add"' in tokenizer.decode(step.context_ids)  # tools rendered
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    turn_ids, message = _turn(tokenizer, session, step, call, version=3)
    segment = step.segment
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    # The client echoes the assistant message with keys of its own, then the tool's answer.
    echoed = {**message, "refusal": None, "annotations": []}
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "5"}
    again = session.context([*messages, echoed, tool], TOOLS)
    assert again.segment is segment and not again.new and len(session.segments) == 1
    whole = [*messages, message, tool]
    # Token-exact: nothing re-rendered.
    assert again.context_ids == _render(tokenizer, whole, TOOLS)
    _turn(tokenizer, session, again, "5.", version=3)
    delta = len(again.delta_ids)
    second = len(segment.tokens.response_ids) - len(turn_ids) - delta
    assert segment.tokens.loss_mask == [1] * len(turn_ids) + [0] * delta + [1] * second
    env = [ENV_TOKEN_VERSION] * delta
    assert segment.tokens.versions == [3] * len(turn_ids) + env + [3] * second
    assert segment.tokens.response_ids[: len(turn_ids)] == turn_ids


def test_sampled_tokens_that_a_re_render_would_change_are_kept_as_sampled(tokenizer, session):
    messages = [{"role": "user", "content": "Say hi."}]
    step = session.context(messages)
    # Spaces the template's rendering of the parsed message would not reproduce.
    text = "  hi  "
    ids, message = _turn(tokenizer, session, step, text, version=0)
    again = session.context([*messages, message, {"role": "user", "content": "Again."}])
    assert again.segment is step.segment and not again.new
    assert step.segment.tokens.response_ids == ids
    assert len(session.segments) == 1


def test_edited_history_starts_a_new_segment_and_is_counted(tokenizer, session):
    messages = [{"role": "user", "content": "Plan a trip."}]
    step = session.context(messages)
    _, message = _turn(tokenizer, session, step, "Step one.", version=1)
    first = step.segment
    summary = [{"role": "user", "content": "Summary: step one done. Continue."}]
    second = session.context(summary)
    assert second.new and second.context_ids == _render(tokenizer, summary)
    assert session.num_new_segments == 0  # not part of the session before its turn
    _turn(tokenizer, session, second, "Step two.", version=1)
    assert session.num_new_segments == 1 and session.segments == [first, second.segment]
    # The first keeps its turn.
    assert first.tokens.loss_mask.count(1) == len(first.tokens.response_ids)
    # A request that drops the last messages does not extend the new segment either.
    assert not extends([*summary, message], summary[:0])


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, TOOLS),  # added
        (TOOLS, None),  # removed
        (TOOLS, [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "sum"}}]),  # changed
    ],
    ids=["added", "removed", "changed"],
)
def test_a_request_whose_tools_differ_starts_a_segment_rendered_with_them(
    tokenizer, session, before, after
):
    messages = [{"role": "user", "content": "2+3?"}]
    step = session.context(messages, before)
    _, message = _turn(tokenizer, session, step, "Five.", version=0)
    extended = [*messages, message, {"role": "user", "content": "Sure?"}]
    same = session.context(extended, [] if before is None else before)  # [] is no tools
    assert not same.new and same.segment is step.segment
    other = session.context(extended, after)
    assert other.new and other.context_ids == _render(tokenizer, extended, after)
    assert other.segment.tools == after


def test_messages_compare_by_what_the_api_defines():
    held = [{"role": "assistant", "content": None, "tool_calls": []}]
    assert extends(held, [{"role": "assistant", "content": ""}, {"role": "user", "content": "x"}])
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with_call = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    other = {**call, "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert not extends(with_call, [{"role": "assistant", "content": None, "tool_calls": [other]}])
    assert not extends([{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}])


def test_a_turn_whose_lengths_disagree_is_refused(tokenizer, session):
    step = session.context([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="a model turn has 3 tokens, 2 log-probs"):
        session.record(step, [1, 2, 3], [0.0, 0.0], [0, 0, 0], {"role": "assistant"})
    assert session.segments == [] and step.segment.tokens.response_ids == []


@pytest.mark.parametrize(
    ("text", "content", "names", "malformed"),
    [
        ("The sum is 5.", "The sum is 5.", [], False),
        ('Let me add.<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
         "Let me add.", ["add"], False),
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
         '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>',
         None, ["a", "b"], False),
        ('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>', None, [], True),
        ('<tool_call>{"arguments": {}}</tool_call>', None, [], True),
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', None, [], True),
        ('<tool_call>{"name": "add", "arguments": {}}', None, [], True),
        ('<tool_call>{"name": "add", "arguments": {"a": ' + "[" * 1500 + "]" * 1500 + "}}"
         "</tool_call>", None, [], True),  # nested past the JSON decoder's recursion limit
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": 1}'
         "</tool_call>", None, [], True),  # one bad call of two: no ids taken
    ],
)  # fmt: skip
def test_hermes_tool_calls_parse_or_come_back_as_text(text, content, names, malformed):
    parsed = parse_tool_calls(text, "hermes", (f"call_{i}" for i in itertools.count()))
    assert parsed.malformed is malformed
    assert [c["function"]["name"] for c in parsed.tool_calls] == names
    if malformed:
        assert parsed.content == text and parsed.finish_reason is None
        return
    assert parsed.content == content
    assert [c["id"] for c in parsed.tool_calls] == [f"call_{i}" for i in range(len(names))]
    for call in parsed.tool_calls:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert parsed.finish_reason == ("tool_calls" if names else None)


def test_an_unknown_tool_parser_is_named():
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.tool_parser='xml'"):
        parse_tool_calls("x", "xml", iter(()))
