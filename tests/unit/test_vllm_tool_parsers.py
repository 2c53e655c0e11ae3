"""vLLM's tool parsers behind ``make_tool_parser`` (recipe/agent/vllm_tool_parsers.py), on the
tiny byte-level tokenizer: text formats on it as is, formats whose markers are special tokens
on a copy with those tokens added. vLLM is imported inside the tests, never at collection."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipe.agent.tool_parsers import check_tool_parser, make_tool_parser
from recipe.tiny import build_tokenizer

pytestmark = pytest.mark.model  # imports vLLM, builds transformers tokenizers

REPO = Path(__file__).resolve().parents[2]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
MARKERS = ["<|python_tag|>", "<tool_call>", "</tool_call>"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)


@pytest.fixture(scope="module")
def marked_tokenizer(tmp_path_factory):
    """The tiny tokenizer with the formats' markers as special tokens (as Llama 3 / Qwen)."""
    tok = build_tokenizer(tmp_path_factory.mktemp("tok_marked"), model_max_length=4096)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    return tok


def _ids():
    return (f"call_{i}" for i in itertools.count())


def _arguments(parsed) -> list[dict]:
    return [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls]


def test_hermes_never_imports_vllm():
    code = (
        "import sys\n"
        "from recipe.agent.tool_parsers import check_tool_parser, make_tool_parser\n"
        "check_tool_parser('hermes')\n"
        "p = make_tool_parser('hermes', None)\n"
        't = p.parse(\'<tool_call>{"name": "a", "arguments": {}}</tool_call>\', iter([\'c\']))\n'
        "assert t.tool_calls[0]['id'] == 'c', t\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_an_unknown_parser_name_lists_ours_and_vllms(tokenizer):
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.tool_parser='xml'") as err:
        make_tool_parser("xml", tokenizer)
    message = str(err.value)
    assert "\n" not in message
    assert message.count("'hermes'") == 1  # ours; vLLM's own hermes is not listed twice
    for name in ("llama3_json", "pythonic", "mistral", "qwen3_coder"):
        assert f"'{name}'" in message
    with pytest.raises(ValueError, match="allowed one of"):
        check_tool_parser("xml")


def test_a_parser_that_cannot_use_the_tokenizer_says_why(tokenizer):
    check_tool_parser("llama3_json")  # the name alone is known
    with pytest.raises(ValueError) as err:
        check_tool_parser("llama3_json", tokenizer)
    message = str(err.value)
    assert "\n" not in message
    assert "tool_parser='llama3_json'" in message and "Llama3JsonToolParser" in message
    assert "<|python_tag|>" in message


def test_llama3_json_calls_take_ids_from_call_ids(marked_tokenizer):
    parser = make_tool_parser("llama3_json", marked_tokenizer)
    text = (
        '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; '
        '{"name": "add", "arguments": {"a": 4, "b": 5}}'
    )
    parsed = parser.parse(text, _ids(), TOOLS)
    assert not parsed.malformed and parsed.content is None
    assert [c["id"] for c in parsed.tool_calls] == ["call_0", "call_1"]
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["add", "add"]
    assert _arguments(parsed) == [{"a": 2, "b": 3}, {"a": 4, "b": 5}]
    assert parsed.finish_reason == "tool_calls"
    assert parser.parse(text, _ids(), TOOLS) == parsed  # vLLM's random ids are not used


def test_a_turn_without_calls_is_content(marked_tokenizer):
    parsed = make_tool_parser("llama3_json", marked_tokenizer).parse("It is 5.", _ids(), TOOLS)
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == ("It is 5.", [], False)
    assert parsed.finish_reason is None


def test_pythonic_calls_parse(tokenizer):
    parser = make_tool_parser("pythonic", tokenizer)
    parsed = parser.parse("[add(a=2, b=3), add(a=1, b=0)]", _ids(), TOOLS)
    assert not parsed.malformed
    assert [c["id"] for c in parsed.tool_calls] == ["call_0", "call_1"]
    assert _arguments(parsed) == [{"a": 2, "b": 3}, {"a": 1, "b": 0}]


def test_vllms_hermes_parses_on_a_tokenizer_with_tool_call_tokens(marked_tokenizer):
    from recipe.agent.vllm_tool_parsers import VllmTurnParser  # "hermes" by name is ours

    parser = VllmTurnParser("hermes", marked_tokenizer)
    assert parser.skip_special_tokens is False  # its markers may be special tokens
    text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    parsed = parser.parse(text, _ids(), TOOLS)
    assert (parsed.content, parsed.malformed) == ("Let me add.", False)
    assert [c["id"] for c in parsed.tool_calls] == ["call_0"]
    assert _arguments(parsed) == [{"a": 2, "b": 3}]
    assert make_tool_parser("hermes", marked_tokenizer).skip_special_tokens is True


def test_the_request_tools_reach_the_parser(tokenizer):
    # qwen3_coder types each parameter by the tool's schema: an integer only with the tools.
    parser = make_tool_parser("qwen3_coder", tokenizer)
    text = "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>"
    assert _arguments(parser.parse(text, _ids(), TOOLS)) == [{"a": 2}]
    assert _arguments(parser.parse(text, _ids(), None)) == [{"a": "2"}]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("vllm_hermes", '<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>'),
        ("llama3_json", '{"name": "add", "parameters": [1, 2]}'),
        ("llama3_json", '{"name": "add", "parameters": {"a": 2'),
        ("pythonic", "[add(a=2, b=x)]"),
    ],
)
def test_a_malformed_call_comes_back_as_the_whole_text(marked_tokenizer, name, text):
    from recipe.agent.vllm_tool_parsers import VllmTurnParser, parser_class

    vllm_name = name.removeprefix("vllm_")
    parser = VllmTurnParser(vllm_name, marked_tokenizer)
    ids = _ids()
    parsed = parser.parse(text, ids, TOOLS)
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == (text, [], True)
    assert next(ids) == "call_0"  # a turn that is not parsed takes no id
    assert logging.getLogger(parser_class(vllm_name).__module__).filters == []


def _fake_parser(result):
    """A vLLM ``ToolParser`` whose ``extract_tool_calls`` returns (or raises) ``result``."""
    from vllm.tool_parsers import ToolParser

    class FakeParser(ToolParser):
        def extract_tool_calls(self, model_output, request):
            if isinstance(result, Exception):
                raise result
            return result

    return FakeParser


def _result(name: str, arguments: str) -> SimpleNamespace:
    function = SimpleNamespace(name=name, arguments=arguments)
    return SimpleNamespace(
        tools_called=True, tool_calls=[SimpleNamespace(function=function)], content=None
    )


@pytest.mark.parametrize(
    "result",
    [
        RuntimeError("parser bug"),
        _result("add", '{"a": 2'),
        _result("add", "[1]"),
        _result("", "{}"),
    ],
    ids=["raises", "bad_json", "not_an_object", "no_name"],
)
def test_a_parser_failure_or_a_bad_call_comes_back_as_text(monkeypatch, tokenizer, result):
    from vllm.tool_parsers import ToolParserManager

    monkeypatch.setitem(ToolParserManager.tool_parsers, "fake", _fake_parser(result))
    parsed = make_tool_parser("fake", tokenizer).parse("the turn", _ids(), TOOLS)
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == ("the turn", [], True)


def test_a_fake_parser_result_passes_when_well_formed(monkeypatch, tokenizer):
    # The test above fails for its reason only: the same fake with a good call parses.
    from vllm.tool_parsers import ToolParserManager

    good = _fake_parser(_result("add", '{"a": 2}'))
    monkeypatch.setitem(ToolParserManager.tool_parsers, "fake", good)
    parsed = make_tool_parser("fake", tokenizer).parse("the turn", _ids(), TOOLS)
    assert not parsed.malformed and parsed.content is None
    assert parsed.tool_calls == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    ]


def test_a_parse_failure_anywhere_is_a_malformed_call_never_an_exception(monkeypatch, tokenizer):
    # Arguments nested past the JSON decoder's recursion limit, and request tools that vLLM's
    # request model rejects: the turn comes back as text, the request goes on.
    from vllm.tool_parsers import ToolParserManager

    deep = "[" * 5000 + "]" * 5000
    nested = _fake_parser(_result("add", '{"a": ' + deep + "}"))
    monkeypatch.setitem(ToolParserManager.tool_parsers, "fake", nested)
    parsed = make_tool_parser("fake", tokenizer).parse("the turn", _ids(), TOOLS)
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == ("the turn", [], True)
    good = _fake_parser(_result("add", '{"a": 2}'))
    monkeypatch.setitem(ToolParserManager.tool_parsers, "fake", good)
    bad_tools = [{"type": "function", "function": {"name": ["add"]}}]
    ids = _ids()
    parsed = make_tool_parser("fake", tokenizer).parse("the turn", ids, bad_tools)
    assert (parsed.content, parsed.tool_calls, parsed.malformed) == ("the turn", [], True)
    assert next(ids) == "call_0"
