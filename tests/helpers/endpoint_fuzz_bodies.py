"""Hypothesis strategies of the endpoint fuzz tier (tests/unit/test_endpoint_fuzz.py): JSON of
every type, request bodies with fields replaced, message lists, token-id prompts, tool
schemas, the text a model may write, oversized bodies and raw HTTP requests.

Each strategy mixes the valid with the malformed, so that cases reach the chat template, the
tokenizer, the tool parsers and the engine as well as the field checks in front of them.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

from hypothesis import strategies as st

VOCAB_SIZE = 258
"""The tiny tokenizer's: 256 byte tokens, EOS and pad (the test's fixture checks it)."""
CHAT, COMPLETE = "/chat/completions", "/completions"
USER = {"role": "user", "content": "What is 2 + 3?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]
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
prompts = st.one_of(
    valid_ids,
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


# ---- what a model writes -----------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


call_arguments = st.one_of(
    st.dictionaries(text, json_values, max_size=3).map(json.dumps),
    st.dictionaries(text, json_values, max_size=3).map(lambda d: json.dumps(json.dumps(d))),
    st.sampled_from([100, 999, 1000, 1001, 1500]).map(lambda d: '{"a": ' + _nested(d) + "}"),
    st.sampled_from(['{"a": 1', "{a: 1}", "[1, 2]", '"x"', "null", "{}", '{"a": NaN}']),
    text,
)


@st.composite
def hermes_calls(draw: Any) -> str:
    name_json = json.dumps(draw(name), ensure_ascii=draw(st.booleans()))
    body = f'{{"name": {name_json}, "arguments": {draw(call_arguments)}}}'
    close = draw(st.sampled_from(["</tool_call>", "</tool_call>", "", "<tool_call>"]))
    return f"{draw(text)}<tool_call>{body}{close}{draw(text)}"


@st.composite
def pythonic_calls(draw: Any) -> str:
    args = ", ".join(
        f"{key}={value!r}"
        for key, value in draw(
            st.dictionaries(st.sampled_from("abc"), json_values, max_size=3)
        ).items()
    )
    callee = draw(weighted(st.sampled_from(["add", "get_weather"]), name))
    depth = draw(st.sampled_from([0, 0, 50, 200, 1000]))
    inner = f"{callee}({args})" if not depth else f"{callee}(a={_nested(depth)})"
    return draw(st.sampled_from(["[{}]", "[{0}, {0}]", "{}", "[{}"])).format(inner)


model_texts = st.one_of(
    text,
    hermes_calls(),
    st.lists(hermes_calls(), min_size=2, max_size=3).map("".join),
    pythonic_calls(),
    st.sampled_from([100, 1000, 1500]).map(lambda d: "<tool_call>" + _nested(d) + "</tool_call>"),
    st.just("<tool_call><tool_call>{}</tool_call></tool_call>"),
    st.dictionaries(text, json_values, max_size=3).map(
        lambda d: json.dumps({"name": "add", "parameters": d})
    ),
    st.lists(st.sampled_from(SPECIAL_TEXT) | text, max_size=8).map("".join),
)
model_ids = st.lists(valid_id, max_size=300)
model_outputs = st.one_of(model_texts, model_ids)


# ---- raw HTTP ----------------------------------------------------------------------------------

METHODS = ["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
PATHS = [
    CHAT, COMPLETE, "/models", "/chat/completions/", "/embeddings", "/responses", "",
    "/../v1/models", "/chat//completions", "/Chat/Completions", "/chat/completions?x=1",
    "/completions%00", "/chat/completions#f",
]  # fmt: skip
URL_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789/._-%?=&+"
CONTENT_TYPES = [
    None, "application/json", "text/plain", "multipart/form-data; boundary=x",
    "application/x-www-form-urlencoded", "application/json; charset=latin-1", "*/*", "",
]  # fmt: skip


@st.composite
def raw_bodies(draw: Any) -> bytes | None:
    valid = json.dumps({"model": "m", "messages": [USER]}).encode()
    kind = draw(st.sampled_from(["valid", "binary", "bad_utf8", "empty", "none", "truncated"]))
    if kind == "valid":
        return valid
    if kind == "binary":
        return draw(st.binary(max_size=200))
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(valid)))
        return (
            valid[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]))
            + valid[at:]
        )
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    return b"" if kind == "empty" else None


KEY = "<key>"
"""Where ``raw_requests`` puts the episode's API key (the case knows it, the strategy not)."""
AUTHORIZATIONS = [
    f"Bearer {KEY}", f"Bearer {KEY}", f"Bearer {KEY}", None, f"bearer {KEY}", f"Bearer  {KEY} ",
    "Bearer wrong", f"Basic {KEY}", KEY, "Bearer", "", f"Bearer {KEY}x",
]  # fmt: skip


@st.composite
def raw_requests(draw: Any) -> tuple[str, str, bytes | None, dict[str, str]]:
    """(method, path, body, headers), the episode's API key written ``KEY``."""
    if draw(st.booleans()):  # to an endpoint's path: the body and headers vary
        method, path = "POST", draw(st.sampled_from([CHAT, COMPLETE]))
    else:
        method = draw(st.sampled_from(METHODS))
        path = draw(st.sampled_from([*PATHS, "random"]))
        if path == "random":
            path = "/" + draw(st.text(URL_CHARS, max_size=20))
    headers: dict[str, str] = {}
    auth = draw(st.sampled_from(AUTHORIZATIONS))
    if auth is not None:
        headers["Authorization"] = auth
    if (content_type := draw(st.sampled_from(CONTENT_TYPES))) is not None:
        headers["Content-Type"] = content_type
    data = draw(raw_bodies())
    encoding = draw(st.sampled_from([None, None, "gzip", "deflate", "br", "zstd", "identity", "x"]))
    if encoding is not None:
        headers["Content-Encoding"] = encoding
        if data is not None and draw(st.booleans()):  # the body really encoded so
            data = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    return method, path, data, headers


# ---- sizes ----------------------------------------------------------------------------------


def _deep(depth: int, kind: str) -> str:
    if kind == "list":
        return _nested(depth)
    return '{"a": ' * depth + "1" + "}" * depth


def _with(value: str, where: str) -> bytes:
    """A valid chat body with ``value`` (JSON text) at ``where``."""
    user = json.dumps(USER)
    bodies = {
        "body": value,
        "unknown": f'{{"model": "m", "messages": [{user}], "extra": {value}}}',
        "content": f'{{"messages": [{{"role": "user", "content": {value}}}]}}',
        "messages": f'{{"messages": {value}}}',
        "parameters": (
            f'{{"messages": [{user}], "tools": [{{"type": "function", '
            f'"function": {{"name": "f", "parameters": {{"a": {value}}}}}}}]}}'
        ),
        "arguments": (
            f'{{"messages": [{user}, {{"role": "assistant", "tool_calls": [{{"id": "c", '
            f'"function": {{"name": "f", "arguments": {{"a": {value}}}}}}}]}}]}}'
        ),
        "max_tokens": f'{{"messages": [{user}], "max_tokens": {value}}}',
    }
    return bodies[where].encode()


@st.composite
def sized_requests(draw: Any, limit: int) -> tuple[str, bytes]:
    """(path, body): long strings, many messages or tools, deep nesting, huge numbers, and
    bodies near the body ``limit`` (bytes)."""
    kind = draw(st.sampled_from(["long", "many", "deep", "near_limit", "number", "ids"]))
    if kind == "long":
        char = draw(st.sampled_from(["x", "é", "\U0001f642", " ", "<|endoftext|>", "\ud800", "\n"]))
        size = draw(st.sampled_from([5_000, 50_000, 400_000]))
        return CHAT, _with(json.dumps(char * size), draw(st.sampled_from(["content", "unknown"])))
    if kind == "many":
        count = draw(st.sampled_from([100, 1_000, 5_000]))
        if draw(st.booleans()):
            tools = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(count)]
            return CHAT, json.dumps({"messages": [USER], "tools": tools}).encode()
        roles = ["user", "assistant"]
        many = [{"role": roles[i % 2], "content": f"m{i}"} for i in range(count)]
        return CHAT, json.dumps({"messages": many}).encode()
    if kind == "deep":
        depth = draw(st.sampled_from([100, 500, 900, 999, 1_000, 1_001, 5_000, 10_000, 100_000]))
        value = _deep(depth, draw(st.sampled_from(["list", "dict"])))
        where = draw(
            st.sampled_from(["body", "unknown", "content", "messages", "parameters", "arguments"])
        )
        return CHAT, _with(value, where)
    if kind == "near_limit":
        path = draw(st.sampled_from([CHAT, COMPLETE]))
        base = {"messages": [USER]} if path == CHAT else {"prompt": "2 + 3 ="}
        empty = len(json.dumps(base | {"pad": ""}).encode())
        size = limit + draw(st.sampled_from([-4096, -1, 0, 1, 4096]))
        return path, json.dumps(base | {"pad": "x" * (size - empty)}).encode()
    if kind == "number":
        value = draw(
            st.sampled_from(["9" * 5_000, "1e400", "-1e400", "1" + "0" * 400, "2.5", "-0"])
        )
        return CHAT, _with(value, draw(st.sampled_from(["max_tokens", "unknown", "content"])))
    ids = draw(st.sampled_from([5_000, 100_000]))
    return COMPLETE, json.dumps({"prompt": [65] * ids}).encode()
