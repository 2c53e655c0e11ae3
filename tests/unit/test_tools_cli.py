"""The tools' ``key=value`` command line (recipe/tools/cli.py): the parser's cases, and every
``key=value`` tool's ``--help`` (usage, exit 0) and malformed argument (one ``error:`` line,
exit 2, no traceback)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.tools.cli import exit_on_help, keys_and_overrides, parse_key_values, parse_pairs

DOC = """``python -m tool [key=value ...]``: a tool.

    key=1   what it does
"""
REPO = Path(__file__).resolve().parents[2]


def test_key_values_become_a_dict_and_a_value_may_hold_equals_or_be_empty():
    assert parse_key_values(["a=1", "b=x=y", "c="], DOC) == {"a": "1", "b": "x=y", "c": ""}
    assert parse_key_values([], DOC) == {}
    assert parse_key_values(["a=1", "a=2"], DOC) == {"a": "2"}


def test_pairs_keep_their_order_and_the_positional_arguments_come_first():
    positional, pairs = parse_pairs(["run_dir", "b=2", "a=1", "b=3"], DOC, num_positional=1)
    assert positional == ["run_dir"]
    assert pairs == [("b", "2"), ("a", "1"), ("b", "3")]


def test_a_tools_own_keys_are_taken_out_and_the_rest_stay_overrides_in_order():
    argv = ["b=x", "seed=3", "a=1", "b=y"]
    keys, overrides = keys_and_overrides(argv, DOC, {"seed": "0", "out": "o"})
    assert keys == {"seed": "3", "out": "o"}
    assert overrides == ["b=x", "a=1", "b=y"]


@pytest.mark.parametrize("arg", ["steps", "=5", "", "run_dir"])
def test_a_malformed_argument_is_one_error_line_and_exit_2(capsys, arg):
    with pytest.raises(SystemExit) as exit_info:
        parse_pairs(["a=1", arg], DOC)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {arg!r}: expected key=value\n" and captured.out == ""


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_anywhere_prints_the_docstring_and_exits_0(capsys, flag):
    with pytest.raises(SystemExit) as exit_info:
        parse_pairs(["run_dir", "a=1", flag, "malformed"], DOC, num_positional=1)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == DOC.strip() + "\n"


def test_help_after_a_double_dash_belongs_to_the_command_it_runs():
    exit_on_help(["out.csv", "--", "python", "--help"], DOC)  # no exit


# (module, a malformed command line, whether its import is slow: main is called in-process)
TOOLS = [
    ("recipe.tools.bench.e2e", ["steps"], True),
    ("recipe.tools.bench.endpoint", ["groups=2", "n"], False),
    ("recipe.tools.bench.peers", ["bogus"], False),
    ("recipe.tools.study", ["table", "records"], False),
    ("recipe.tools.study.modes", ["modes"], False),
    ("recipe.tools.study.staleness", ["seeds"], False),
    ("recipe.tools.study.evaluate", ["outputs/none", "keep"], True),
    ("recipe.tools.study.gpu_memory", ["out.csv"], False),
    ("recipe.tools.study.lengths", ["oops"], True),
    ("recipe.tools.study.judge_agreement", ["oops"], True),
    ("recipe.tools.study.zigzag", ["=5"], False),
    ("recipe.tools.study.pair", ["a", "b", "=5"], False),
    ("recipe.tools.study.tool_use", ["oops"], True),
]


def _run(module: str, argv: list[str], in_process: bool, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``python -m module *argv``."""
    if not in_process:
        proc = subprocess.run(
            [sys.executable, "-m", module, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return proc.returncode, proc.stdout, proc.stderr
    try:
        code = importlib.import_module(module).main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return int(code or 0), captured.out, captured.err


def _doc(module: str) -> str:
    mod = importlib.import_module(module)
    if getattr(mod, "main", None) is None:  # a package run through its __main__
        mod = importlib.import_module(f"{module}.__main__")
    return str(mod.__doc__).strip()


@pytest.mark.parametrize(("module", "bad", "in_process"), TOOLS, ids=[t[0] for t in TOOLS])
def test_every_key_value_tool_prints_its_usage_on_help(capsys, module, bad, in_process):
    code, out, err = _run(module, ["--help"], in_process, capsys)
    assert (code, err) == (0, ""), err
    assert out.strip() == _doc(module)


@pytest.mark.parametrize(("module", "bad", "in_process"), TOOLS, ids=[t[0] for t in TOOLS])
def test_every_key_value_tool_rejects_a_malformed_argument_with_one_line(
    capsys, module, bad, in_process
):
    code, _, err = _run(module, bad, in_process, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
