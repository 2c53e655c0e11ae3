"""``python -m recipe.tools.study.tool_use``: what counts as a call the python-tool agent would
run (and as a block the code-block agent would run), the first turns it samples, and its
command line's one-line errors. The measurement itself
needs a real model (docs/notes/study-where-fully-async-pays.md gives the figures)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from recipe.agent.examples import python_block_agent
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
        "```python\nprint(5)",  # cut before its fence closed: not run
        "```py\nprint(6)\n```",
    ]
    assert tool_use.count_tool_use(texts) == {
        "responses": 6,
        "parseable_python_call": 1,
        "tool_call_tag": 2,
        "python_block": 2,
        "runnable_python_block": 2,
        "boxed": 2,
    }
    assert set(tool_use.COUNTED) == set(tool_use.count_tool_use([])) - {"responses"}


def test_the_first_turn_is_the_agents_and_the_example_follows_its_system_message():
    row = [{"role": "user", "content": "2+2?"}]
    (agent,) = tool_use.conversations([row], "agent")
    assert agent == [{"role": "system", "content": SYSTEM_PROMPT}, *row]
    (example,) = tool_use.conversations([row], "example")
    assert example[0] == agent[0] and example[-1] == row[0]
    assert example[1:-1] == tool_use.EXAMPLE
    own = [{"role": "system", "content": "Be brief."}, *row]
    assert tool_use.conversations([own], "agent") == [own]  # a row's own system message stays
    (block,) = tool_use.conversations([row], "block")
    assert block == [{"role": "system", "content": python_block_agent.SYSTEM_PROMPT}, *row]
    assert tool_use.conversations([own], "block") == [own]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["data=x.jsonl"], "missing model="),
        (["model={dir}"], "missing data="),
        (["model={dir}/absent", "data=x.jsonl"], "not a folder"),
        (["model={dir}/rows", "data=x.jsonl"], "no config.json there"),
        (["model={dir}", "data=x.jsonl", "n=0"], "n=0: expected an integer >= 1"),
        (["model={dir}", "data=x.jsonl", "prompts=some"], "prompts='some': expected an integer"),
        (["model={dir}", "data=x.jsonl", "variant=few"], "expected one of agent, example, block"),
        (["model={dir}", "data=x.jsonl", "temperature=0"], "unknown key"),
    ],
)
def test_bad_keys_fail_with_one_line_naming_them(tmp_path, capsys, argv, words):
    (tmp_path / "config.json").write_text("{}")  # {dir} is a model folder, {dir}/rows is not
    (tmp_path / "rows").mkdir()
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        tool_use.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_a_missing_data_file_fails_with_one_line_before_any_engine_starts(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        tool_use.main([f"model={tmp_path}", f"data={tmp_path}/absent.jsonl"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent.jsonl" in err[0], err


def _fake_vllm(calls: list[dict]) -> types.ModuleType:
    """A ``vllm`` module whose ``LLM`` answers every conversation with one python block and a
    guessed answer; each ``chat`` call is appended to ``calls``."""

    class LLM:
        def __init__(self, **_: object) -> None:
            pass

        def chat(self, convs, params, tools=None, use_tqdm=True):
            calls.append({"convs": convs, "tools": tools})
            text = "```python\nprint(2 + 2)\n```\nIt prints \\boxed{4}."
            output = types.SimpleNamespace(outputs=[types.SimpleNamespace(text=text)])
            return [output for _ in convs]

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, dict  # type: ignore[attr-defined]
    return fake


def test_the_block_variant_samples_without_tools_and_counts_runnable_blocks(
    tmp_path, capsys, monkeypatch
):
    row = {"data_source": "math", "prompt": "2+2?", "reward_model": {"ground_truth": "4"}}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls))
    # measure() sets a default KV cache size for vLLM-CPU: undone after the test.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"))
    (tmp_path / "config.json").write_text("{}")
    argv = [f"model={tmp_path}", f"data={data}", "variant=block", f"out={tmp_path}/out"]
    assert tool_use.main(argv) == 0
    (call,) = calls
    assert call["tools"] is None
    assert call["convs"][0][0]["content"] == python_block_agent.SYSTEM_PROMPT
    found = json.loads((tmp_path / "out" / "tool_use.json").read_text())
    assert (found["runnable_python_block"], found["parseable_python_call"]) == (1, 0)
    assert "runnable_python_block     1 of 1" in capsys.readouterr().out
