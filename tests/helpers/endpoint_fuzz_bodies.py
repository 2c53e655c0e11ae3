"""Hypothesis strategies of the endpoint fuzz tier (tests/unit/test_endpoint_fuzz.py): JSON of
every type, request bodies with fields replaced, message lists, token-id prompts and tool
schemas (what a model writes, sizes and raw HTTP: ``endpoint_fuzz_edges``).

Each strategy mixes the valid with the malformed, so that cases reach the chat template, the
tokenizer, the tool parsers and the engine as well as the field checks in front of them.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.helpers.chat_templates import TOOLS

VOCAB_SIZE = 258
"""The tiny tokenizer's: 256 byte tokens, EOS and pad (the test's fixture checks it)."""
CHAT, COMPLETE = "/chat/completions", "/completions"
USER = {"role": "user", "content": "What is 2 + 3?"}
SPECIAL_TEXT = [
    "<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
    "<tools>", "<tool_response>", "<|python_tag|>", "{{ raise_exception('boom') }}",
    "{% for x in y %}", "{{", "}}", "\x00", "\u2028", "\ud800", "\udfff", "\U0001f642", "é",
    "\ufb00", "\r\n", '"', "\\", "\\u0000",
]  # fmt: skip
"""Text a template, a tokenizer or a parser may treat specially: special tokens, markers,
Jinja syntax, control and lone surrogate characters, decompositions (NFC), escapes."""

text = st.one_of(
    st.text(max_size=24),
    st.sampled_from(SPECIAL_TEXT),
    st.lists(st.sampled_from(SPECIAL_TEXT) | st.text(max_size=4), max_size=5).map("".join),
)
integers = st.integers() | st.sampled_from([0, 1, -1, 2**31, 2**63, -(2**63), 10**12, 10**30])
scalars = st.none() | st.booleans() | integers | st.floats() | text
"""JSON scalars, NaN and infinities included (Python's json writes and reads them)."""
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=8,
)


def weighted(valid: st.SearchStrategy[Any], *others: st.SearchStrategy[Any]) -> Any:
    """``valid`` three times in four, else one of ``others`` (or any JSON): a list of a few
    such values is still often valid as a whole, so cases get past the field checks."""
    return st.one_of(valid, valid, valid, st.one_of(*(others or (json_values,))))


# ---- fields ------------------------------------------------------------------------------------

CHECKED_FIELDS = [
    "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "n", "stream",
    "model", "prompt",
]  # fmt: skip
"""Fields the endpoint reads."""
IGNORED_FIELDS = [
    "temperature", "top_p", "seed", "stop", "logprobs", "top_logprobs", "frequency_penalty",
    "presence_penalty", "logit_bias", "response_format", "user", "stream_options",
    "parallel_tool_calls", "echo", "suffix", "best_of", "metadata",
]  # fmt: skip
"""Fields the run decides (sampling) or the endpoint does not serve: any value is taken."""
ODD_VALUES = [None, 0, 1, -1, 1.0, "1", [1], {"n": 1}, True, False, 2**63, float("nan"), ""]


@st.composite
def field_requests(draw: Any) -> tuple[str, dict[str, Any]]:
    """A valid chat or completions body with some fields replaced by any JSON, or dropped."""
    path = draw(st.sampled_from([CHAT, COMPLETE]))
    body: dict[str, Any] = {"model": "m"}
    if path == CHAT:
        body["messages"] = [USER]
        if draw(st.booleans()):
            body["tools"] = TOOLS
    else:
        body["prompt"] = "2 + 3 ="
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["checked", "checked", "checked", "ignored", "unknown"]))
        if kind == "unknown":
            key = draw(text)
        else:
            key = draw(st.sampled_from(CHECKED_FIELDS if kind == "checked" else IGNORED_FIELDS))
        if draw(st.integers(0, 5)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(st.sampled_from(ODD_VALUES) | json_values)
    return path, body


# ---- messages ----------------------------------------------------------------------------------

ROLES = ["system", "user", "assistant", "tool", "developer", "function"]
role = weighted(st.sampled_from(ROLES), text, json_values)
text_part = st.fixed_dictionaries({"type": st.just("text"), "text": text})
other_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["image_url", "input_audio", "refusal", "text"])},
    optional={"image_url": json_values, "text": json_values},
)
content = weighted(text | st.none(), st.lists(text_part | other_part, max_size=3), json_values)
arguments = weighted(
    st.dictionaries(text, json_values, max_size=3).map(json.dumps),
    text,
    st.dictionaries(text, json_values, max_size=3),
    json_values,
)
function = st.fixed_dictionaries({"name": weighted(text, json_values), "arguments": arguments})
valid_call = st.fixed_dictionaries(
    {
        "id": text,
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": text.filter(bool),
                "arguments": st.dictionaries(text, json_values).map(json.dumps),
            }
        ),
    }
)
tool_call = weighted(
    st.fixed_dictionaries(
        {"id": weighted(text, json_values), "type": st.just("function"), "function": function}
    ),
    st.fixed_dictionaries({}, optional={"id": json_values, "function": json_values}),
    json_values,
)
plain_content = st.none() | text | st.lists(text_part, max_size=3)
valid_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from([*ROLES, "narrator"]), "content": plain_content}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": plain_content,
            "tool_calls": st.lists(valid_call, max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "tool_call_id": text, "content": plain_content}
    ),
)
"""Messages the field checks let through: to the chat template, in any order."""
message = weighted(
    valid_message,
    st.fixed_dictionaries(
        {"role": role},
        optional={
            "content": content,
            "tool_calls": weighted(st.lists(tool_call, max_size=3), json_values),
            "tool_call_id": weighted(text, json_values),
            "name": weighted(text, json_values),
            "refusal": json_values,
        },
    ),
    json_values,
)
messages = st.lists(message, max_size=6)


# ---- token ids -----------------------------------------------------------------------------

valid_id = st.integers(0, VOCAB_SIZE - 1)
odd_id = st.one_of(
    st.sampled_from([-1, VOCAB_SIZE, VOCAB_SIZE + 1, 10**12, 2**63, -(2**63), True, False]),
    st.floats(),
    st.lists(valid_id, max_size=3),
    text,
    st.none(),
)
valid_ids = st.lists(valid_id, min_size=1, max_size=64)


@st.composite
def one_bad_id(draw: Any) -> list[Any]:
    """Valid ids but one: the mistake a client makes (an id of another vocabulary, a float)."""
    ids = draw(valid_ids)
    bad = draw(st.sampled_from([VOCAB_SIZE, VOCAB_SIZE + 1, 2 * VOCAB_SIZE, -1, 10**12, 1.0]))
    ids.insert(draw(st.integers(0, len(ids))), bad)
    return ids


prompts = st.one_of(
    valid_ids,
    one_bad_id(),
    valid_ids.map(lambda ids: [ids]),  # a batch of one
    st.lists(weighted(valid_id, odd_id), max_size=12),
    st.lists(st.lists(weighted(valid_id, odd_id), max_size=4), max_size=3),
    st.lists(text, min_size=1, max_size=3).map("".join),
    st.sampled_from(["", [], [[]], [""], ["a", "b"]]),
    json_values,
)


# ---- tool schemas ------------------------------------------------------------------------------

NAMES = ["add", "a" * 300, "get-weather", "na me", "{{x}}", '"q"', "ünï", "a.b", "0add", ""]
name = weighted(st.sampled_from(NAMES), text)
schema_type = st.sampled_from(["object", "string", "integer", "number", "boolean", "array"])
schema = weighted(
    st.fixed_dictionaries(
        {
            "type": st.just("object"),
            "properties": st.dictionaries(
                name, weighted(st.fixed_dictionaries({"type": schema_type})), max_size=3
            ),
        },
        optional={
            "required": weighted(st.lists(name, max_size=2)),
            "additionalProperties": st.booleans(),
        },
    ),
    st.dictionaries(text, json_values, max_size=3),
    json_values,
)
tool = weighted(
    st.fixed_dictionaries(
        {
            "type": weighted(st.just("function")),
            "function": weighted(
                st.fixed_dictionaries(
                    {"name": name},
                    optional={
                        "description": weighted(text),
                        "parameters": schema,
                        "strict": json_values,
                    },
                )
            ),
        }
    ),
    json_values,
)
tool_lists = weighted(st.lists(tool, min_size=1, max_size=4), json_values)
tool_choice = st.one_of(
    st.none(),
    st.sampled_from(["none", "auto", "required"]),
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": name})}
    ),
    json_values,
)
