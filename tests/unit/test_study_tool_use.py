"""``python -m recipe.tools.study.tool_use``: what counts as a call the python-tool agent would
run, the first turns it samples, and its command line's one-line errors. The measurement itself
needs a real model (docs/notes/study-where-fully-async-pays.md gives the figures)."""

from __future__ import annotations

import json

import pytest

from recipe.agent.examples.python_tool_agent import SYSTEM_PROMPT
from recipe.tools.study import tool_use


def _call(arguments: object, name: str = "python") -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "runs"),
    [
        (_call({"code": "print(1)"}), True),
        ("Let me compute.\n" + _call({"code": "print(2)"}) + "\nthen", True),
        (_call({"code": 7}), False),  # not a program
        (_call({"program": "print(1)"}), False),  # the wrong argument
        (_call({"code": "print(1)"}, name="calculator"), False),  # another tool
        ('<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}\n</tool_call>', False),
        ("<tool_call>\n[1, 2]\n</tool_call>", False),  # JSON, not an object
        ("```python\nprint(1)\n```", False),  # code the model wrote, not a call
        ("<tool_response>\n84\n</tool_response>", False),  # an output it made up
    ],
)
def test_a_call_counts_only_when_the_agent_would_run_it(text, runs):
    assert tool_use.parseable_call(text) is runs


def test_each_response_is_counted_for_each_thing_it_does():
    texts = [
        _call({"code": "print(12 * 7)"}),
        "<tool_call>\n{broken\n</tool_call> so \\boxed{3}",
        "```python\nprint(3)\n```\nThe answer is \\boxed{3}.",
        "I think it is 4.",
    ]
    assert tool_use.count_tool_use(texts) == {
        "responses": 4,
        "parseable_python_call": 1,
        "tool_call_tag": 2,
        "python_block": 1,
        "boxed": 2,
    }


def test_the_first_turn_is_the_agents_and_the_example_follows_its_system_message():
    row = [{"role": "user", "content": "2+2?"}]
    (agent,) = tool_use.conversations([row], "agent")
    assert agent == [{"role": "system", "content": SYSTEM_PROMPT}, *row]
    (example,) = tool_use.conversations([row], "example")
    assert example[0] == agent[0] and example[-1] == row[0]
    assert example[1:-1] == tool_use.EXAMPLE
    own = [{"role": "system", "content": "Be brief."}, *row]
    assert tool_use.conversations([own], "agent") == [own]  # a row's own system message stays


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["data=x.jsonl"], "missing model="),
        (["model={dir}"], "missing data="),
        (["model={dir}/absent", "data=x.jsonl"], "not a folder"),
        (["model={dir}", "data=x.jsonl", "n=0"], "n=0: expected an integer >= 1"),
        (["model={dir}", "data=x.jsonl", "prompts=some"], "prompts='some': expected an integer"),
        (["model={dir}", "data=x.jsonl", "variant=few"], "expected one of agent, example"),
        (["model={dir}", "data=x.jsonl", "temperature=0"], "unknown key"),
    ],
)
def test_bad_keys_fail_with_one_line_naming_them(tmp_path, capsys, argv, words):
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        tool_use.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_a_missing_data_file_fails_with_one_line_before_any_engine_starts(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tool_use.main([f"model={tmp_path}", f"data={tmp_path}/absent.jsonl"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent.jsonl" in err[0], err
