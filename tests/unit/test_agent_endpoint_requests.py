"""Whose failure a request is (recipe/agent/endpoint/chat.py): whatever a request carries, or
a model turn holds, that the endpoint cannot serve is answered 4xx and counted, the episode
unchanged and the run going on; only the engine's generate failing is the run's. Raw bodies
through the real HTTP server (tests/helpers/agent_endpoint.py), as a buggy agent sends them."""

from __future__ import annotations

import pytest

from recipe.agent.metrics import agent_metrics
from recipe.tiny import build_tokenizer
from tests.helpers.agent_endpoint import (
    RAW,
    RAW_AGENT,
    ScriptedEngine,
    ids_of,
    make_endpoint,
    run_episode,
)
from tests.helpers.chat_templates import TOOLS, TOOLS_TEMPLATE

pytestmark = pytest.mark.model  # builds a transformers tokenizer

CHAT, COMPLETE = "/chat/completions", "/completions"
USER = {"role": "user", "content": "What is 2 + 3?"}
# As Llama 3 and Mistral templates do: raise_exception on roles that do not alternate.
ALTERNATING_TEMPLATE = (
    "{% for m in messages %}{% if loop.index0 > 0 and "
    "m['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/...') }}"
    "{% endif %}{% endfor %}" + TOOLS_TEMPLATE
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def strict_tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("strict"), model_max_length=4096)
    tok.chat_template = ALTERNATING_TEMPLATE
    return tok


def _raw_episode(tokenizer, script, replies, **kwargs):
    RAW.reset(script)
    engine = ScriptedEngine(tokenizer, replies)
    episode = run_episode(make_endpoint(tokenizer, RAW_AGENT), engine, **kwargs)
    return episode, engine, RAW.answers


def _reply(answers):
    """The last answer's assistant message, as a client echoes it."""
    return answers[-1].body["choices"][0]["message"]


def test_tool_calls_that_are_not_objects_are_refused_and_the_episode_goes_on(tokenizer):
    bad = {"role": "assistant", "content": "Five.", "tool_calls": ["x"]}
    script = [
        (CHAT, {"messages": [USER]}),
        (CHAT, {"messages": [USER, bad, {"role": "user", "content": "Sure?"}]}),
        lambda a: (CHAT, {"messages": [USER, _reply(a[:1]), {"role": "user", "content": "Sure?"}]}),
    ]
    episode, engine, answers = _raw_episode(tokenizer, script, ["Five.", "Yes."])
    assert [a.status for a in answers] == [200, 400, 200]
    assert "messages[1].tool_calls[0] must be an object" in answers[1].message
    assert episode.finish_reason == "stop", episode.error
    # The refused request changed nothing: the third one extends the first's segment.
    assert (episode.num_turns, episode.num_segments, len(engine.calls)) == (2, 1, 2)
    metrics = agent_metrics([episode.to_trajectory("p", 0)])
    assert metrics["agent/request_errors"] == 1.0


def test_messages_the_chat_template_rejects_are_answered_400_and_change_nothing(
    strict_tokenizer,
):
    tok = strict_tokenizer
    again = {"role": "user", "content": "Sure?"}
    script = [
        (CHAT, {"messages": [USER]}),
        # A delta the template rejects (two user turns in a row), then a new segment.
        lambda a: (CHAT, {"messages": [USER, _reply(a), again, again]}),
        (CHAT, {"messages": [USER, USER]}),
        lambda a: (CHAT, {"messages": [USER, _reply(a[:1]), again]}),
    ]
    episode, engine, answers = _raw_episode(tok, script, ["Five.", "Yes."])
    assert [a.status for a in answers] == [200, 400, 400, 200], answers
    for answer in answers[1:3]:
        assert "TemplateError: Conversation roles must alternate" in answer.message
        assert answer.body["error"]["type"] == "invalid_request_error"
    assert episode.finish_reason == "stop" and episode.num_segments == 1, episode.error
    assert episode.num_request_errors == 2 and len(engine.calls) == 2
    whole = [USER, {"role": "assistant", "content": "Five."}, again]
    text = tok.apply_chat_template(whole, add_generation_prompt=True, tokenize=False)
    context = episode.tokens.prompt_ids + episode.tokens.response_ids
    assert context[: len(ids_of(tok, text))] == ids_of(tok, text)  # nothing left behind


def test_a_token_id_outside_the_vocabulary_is_refused_naming_it(tokenizer):
    script = [
        (COMPLETE, {"prompt": [1, 10**12]}),
        (COMPLETE, {"prompt": [[5, -1]]}),
        (COMPLETE, {"prompt": "2 + 3 ="}),
    ]
    episode, engine, answers = _raw_episode(tokenizer, script, [" 5"])
    assert [a.status for a in answers] == [400, 400, 200]
    last = len(tokenizer) - 1
    assert f"prompt[1]=1000000000000 is not a token id of this model (0..{last})" in (
        answers[0].message
    )
    assert "prompt[1]=-1 is not a token id" in answers[1].message
    assert episode.finish_reason == "stop" and len(engine.calls) == 1
    assert episode.num_request_errors == 2


def test_a_tool_call_nested_past_the_json_decoder_is_a_malformed_call(tokenizer):
    depth = 1500  # past the decoder's recursion limit (1000)
    text = '<tool_call>{"name": "add", "arguments": {"a": ' + "[" * depth + "]" * depth
    text += "}}</tool_call>"
    script = [(CHAT, {"messages": [USER], "tools": TOOLS})]
    episode, _, answers = _raw_episode(tokenizer, script, [text], budget=4 * depth)
    assert answers[0].status == 200, answers[0]
    choice = answers[0].body["choices"][0]
    assert choice["message"]["content"] == text and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    assert episode.finish_reason == "stop" and episode.num_tool_parse_errors == 1
    assert episode.num_request_errors == 0


BAD_BODIES = [
    (CHAT, b"not json", "the request body is not JSON"),
    (CHAT, b"[" * 100_000, "the request body is not JSON"),
    (CHAT, [USER], "the request body must be a JSON object"),
    (CHAT, {"messages": "hi"}, "'messages' must be a non-empty list"),
    (CHAT, {"messages": []}, "'messages' must be a non-empty list"),
    (CHAT, {"messages": ["hi"]}, "messages[0] must be an object, not str"),
    (CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role must be a non-empty string"),
    (CHAT, {"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0] must be a text part",
    ),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        "messages[0].content[0].text must be a string",
    ),
    (CHAT, {"messages": [{"role": "tool", "content": "5", "tool_call_id": 7}]}, "tool_call_id"),
    (
        CHAT,
        {"messages": [USER, {"role": "assistant", "tool_calls": {"id": "c"}}]},
        "messages[1].tool_calls must be a list",
    ),
    (
        CHAT,
        {"messages": [USER, {"role": "assistant", "tool_calls": [{"function": "f"}]}]},
        "messages[1].tool_calls[0].function must be an object",
    ),
    (
        CHAT,
        {
            "messages": [
                USER,
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
            ]
        },
        "messages[1].tool_calls[0].function.arguments must be a JSON string",
    ),
    (CHAT, {"messages": [USER], "tools": "add"}, "'tools' must be a list"),
    (CHAT, {"messages": [USER], "tools": ["add"]}, "tools[0] must be an object, not str"),
    (
        CHAT,
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": ""}}]},
        "tools[0].function.name must be a non-empty string",
    ),
    (
        CHAT,
        {"messages": [USER], "tools": [{"function": {"name": "f", "parameters": "x"}}]},
        "tools[0].function.parameters must be an object",
    ),
    (CHAT, {"messages": [USER], "max_tokens": 0}, "'max_tokens' must be a positive integer"),
    (CHAT, {"messages": [USER], "max_tokens": "5"}, "'max_tokens' must be a positive integer"),
    (CHAT, {"messages": [USER], "n": 2}, "only n=1 is served"),
    (CHAT, {"messages": [USER], "stream": "yes"}, "'stream' must be true or false"),
    (COMPLETE, {"prompt": 5}, "'prompt' must be one string or one list of token ids"),
    (COMPLETE, {"prompt": ""}, "'prompt' is empty"),
    (COMPLETE, {"prompt": [1.5]}, "prompt[0] must be a token id (an integer), not float"),
    (COMPLETE, {"prompt": [True]}, "prompt[0] must be a token id (an integer), not bool"),
    (COMPLETE, {"prompt": [[1], [2]]}, "prompt[0] must be a token id (an integer), not list"),
]


def test_malformed_fields_are_refused_400_naming_them_and_never_reach_the_engine(tokenizer):
    script = [(path, body) for path, body, _ in BAD_BODIES] + [(CHAT, {"messages": [USER]})]
    episode, engine, answers = _raw_episode(tokenizer, script, ["Five."])
    for (path, body, expected), answer in zip(BAD_BODIES, answers, strict=False):
        assert (answer.status, expected in answer.message) == (400, True), (path, body, answer)
    assert answers[-1].status == 200 and len(engine.calls) == 1
    assert episode.finish_reason == "stop", episode.error
    assert episode.num_request_errors == len(BAD_BODIES)


def test_tools_that_change_mid_episode_start_a_segment_rendered_with_them(tokenizer):
    more = {"role": "user", "content": "Use a tool."}
    script = [
        (CHAT, {"messages": [USER]}),
        # The same conversation, extended, with tools added: a new segment shows them.
        lambda a: (CHAT, {"messages": [USER, _reply(a), more], "tools": TOOLS}),
        # Extended again with the same tools: that segment goes on.
        lambda a: (
            CHAT,
            {"messages": [USER, _reply(a[:1]), more, _reply(a), more], "tools": TOOLS},
        ),
    ]
    episode, engine, answers = _raw_episode(tokenizer, script, ["Five.", "Six.", "Seven."])
    assert [a.status for a in answers] == [200, 200, 200]
    assert episode.finish_reason == "stop" and episode.num_segments == 2, episode.error
    five = {"role": "assistant", "content": "Five."}
    prompt = tokenizer.apply_chat_template(
        [USER, five, more], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert episode.tokens.prompt_ids == ids_of(tokenizer, prompt)  # the tools, rendered first
    assert engine.calls[1]["context"] == ids_of(tokenizer, prompt)
    assert episode.num_turns == 3 and len(episode.segments) == 1
    metrics = agent_metrics([episode.to_trajectory("p", 0)])
    assert metrics["agent/segments_mean"] == 2.0
