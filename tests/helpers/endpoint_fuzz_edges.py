"""Hypothesis strategies of the endpoint fuzz tier at the request's edges
(tests/unit/test_endpoint_fuzz.py): the text a model writes (tool-call-like text, deep
brackets, special tokens) or its token ids, raw HTTP requests (methods, paths, keys,
content types and encodings, bodies that are not JSON) and bodies of every size (long
strings, many messages or tools, deep nesting, huge numbers, the body limit).
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

from hypothesis import strategies as st

from tests.helpers.endpoint_fuzz_bodies import (
    CHAT,
    COMPLETE,
    SPECIAL_TEXT,
    USER,
    json_values,
    name,
    text,
    valid_id,
    weighted,
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
