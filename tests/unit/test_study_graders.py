"""``python -m recipe.tools.study.graders``: our MATH grader against math-verify. The table and the
rewrites are checked with graders written here; the command itself on responses and on
reference answers with math-verify (an optional extra: those tests skip without it), and on
the real MATH-500 answers when ../shared/data/math is present."""

from __future__ import annotations

import json
import sys

import pytest

from recipe.tools.prepare import prepare
from recipe.tools.study import graders
from recipe.tools.study.graders import Case, compare, rewrites
from tests.helpers.shared_data import shared_data

REAL_MATH = shared_data("math")
ROW = {"data_source": "math", "prompt": "p", "reward_model": {"style": "rule"}}


def test_the_table_counts_each_pair_of_verdicts_and_lists_the_disagreements():
    cases = [Case(str(i), r, t, {"level": i}) for i, (r, t) in enumerate(
        [("1", "1"), ("2", "1"), ("3", "3"), ("x", "y"), ("5", "6")])]  # fmt: skip
    mine = {"0": True, "1": True, "2": False, "3": False, "4": False}
    theirs = {"0": True, "1": False, "2": True, "3": False, "4": False}
    result = compare(
        cases, lambda r, t: theirs[_key(cases, r)], mine=lambda r, t: mine[_key(cases, r)]
    )
    assert result.table == {"both": 1, "ours_only": 1, "theirs_only": 1, "neither": 2}
    assert result.agreement == pytest.approx(3 / 5)
    assert [(d["key"], d["ours"], d["math_verify"], d["level"]) for d in result.disagreements] == [
        ("1", True, False, 1), ("2", False, True, 2)
    ]  # fmt: skip
    summary = result.to_json()
    assert summary["ours_accepts"] == pytest.approx(2 / 5)
    assert summary["math_verify_accepts"] == pytest.approx(2 / 5)


def _key(cases: list[Case], response: str) -> str:
    return next(c.key for c in cases if c.response == response)


def test_rewrites_keep_only_changes_and_never_split_thousands():
    assert rewrites("7") == {
        "sentence": "So the final answer is $\\boxed{7}$.",
        "boxed": "\\boxed{7}",
    }
    frac = rewrites("\\dfrac{1}{2}, 3")
    assert frac["dfrac_to_frac"] == "\\boxed{\\frac{1}{2}, 3}"
    assert frac["no_spaces"] == "\\boxed{\\dfrac{1}{2},3}"
    assert "frac_to_dfrac" not in frac and "space_after_comma" not in frac  # unchanged
    assert rewrites("(3,-1)")["space_after_comma"] == "\\boxed{(3, -1)}"
    for thousands in ("58,500", "10,\\!080", "1{,}008"):
        assert "space_after_comma" not in rewrites(thousands)


def test_without_math_verify_the_command_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails as if not installed
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"text": "\\boxed{1}", "ground_truth": "1"}) + "\n")
    assert graders.main([str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: math-verify is not installed: pip install 'math-verify>=0.7' (the study extra)"
    ]


def test_a_row_without_text_is_named(tmp_path, capsys):
    pytest.importorskip("math_verify")
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"ground_truth": "1"}) + "\n")
    assert graders.main([str(path)]) == 2
    assert f"{path}: line 1: needs string 'text'" in capsys.readouterr().err


def test_responses_are_graded_by_both_and_the_report_lies_beside_them(tmp_path):
    pytest.importorskip("math_verify")
    rows = [
        ("so $\\boxed{\\dfrac12}$", "\\frac{1}{2}", 1.0),  # both accept
        ("so $\\boxed{0.5}$", "\\frac{1}{2}", 1.0),  # both accept
        ("the answer is 3", "3", 0.0),  # no box: ours rejects, math-verify reads the 3
        ("$\\boxed{4}$", "3", 1.0),  # wrong; the recorded reward says 1: counted
    ]
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(
        json.dumps({"prompt_uid": f"u{i}", "sample_index": 0, "text": text, "ground_truth": truth,
                    "reward": reward, "level": 1}) + "\n"
        for i, (text, truth, reward) in enumerate(rows)
    ))  # fmt: skip
    assert graders.main([str(path)]) == 0
    report = json.loads((tmp_path / "responses.jsonl.graders.json").read_text())
    assert report["table"] == {"both": 2, "ours_only": 0, "theirs_only": 1, "neither": 1}
    assert report["agreement"] == 0.75
    (disagreement,) = report["disagreements"]
    assert disagreement["key"] == "u2#0" and disagreement["has_box"] is False
    assert report["reward_differs_from_ours"] == 1


def test_reference_answers_are_accepted_by_both_in_every_rewrite(tmp_path, capsys):
    pytest.importorskip("math_verify")
    path = tmp_path / "refs.jsonl"
    truths = ["\\frac{1}{2}", "(3, -1)", "[0,3)", "2 \\text{ euros}", "\\$42409", "x^2 + 1"]
    path.write_text("".join(
        json.dumps({**ROW, "reward_model": {"style": "rule", "ground_truth": t}}) + "\n"
        for t in truths
    ))  # fmt: skip
    assert graders.main([str(path), "--references"]) == 0
    report = json.loads((tmp_path / "refs.jsonl.graders.json").read_text())
    assert report["mode"] == "references"
    assert report["num_cases"] == sum(len(rewrites(t)) for t in truths)
    assert report["table"]["both"] == report["num_cases"], report["disagreements"]
    assert report["by_rewrite"]["boxed"]["num_cases"] == len(truths)
    assert "agreement 1.0000" in capsys.readouterr().out


def test_real_math500_answers_boxed_are_accepted_by_both(tmp_path):
    theirs = pytest.importorskip("math_verify") and graders.math_verify_grader()
    if not REAL_MATH.is_dir():
        pytest.skip(f"no real MATH copy at {REAL_MATH} (RECIPE_SHARED_DATA)")
    prepare("math", REAL_MATH, tmp_path)
    cases = graders.load_cases(tmp_path / "test.parquet", references=True)
    boxed = [c for c in cases if c.info["rewrite"] == "boxed"]
    result = compare(boxed, theirs)
    assert result.num_cases == 500
    assert result.table["both"] == 500, result.disagreements
