"""The judge-agreement study's statistics (``recipe.tools.study.agreement``) against values
computed by hand, its command line's bad input (one ``error:`` line, exit 2), its sampling and
judging of responses over an in-process backend, and the judge prompt's encoding shared with
``JudgeServer``. The end-to-end run on a real engine is
tests/integration/test_study_judge_agreement.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from recipe.protocol import PromptRecord
from recipe.reward.judge import Judge, JudgeCall, JudgeConfig, JudgeReply
from recipe.tools.study.agreement import (
    JudgedResponse,
    auc,
    bootstrap_auc,
    bootstrap_kappa,
    cohens_kappa,
    confusion,
    format_table,
    summarize,
    wilson_interval,
)
from recipe.tools.study.judge_agreement import judge_all, main, sample_responses
from recipe.workers.judge_server import JudgePromptTooLong, encode_call


def _labels(both: int, rule_only: int, judge_only: int, neither: int) -> tuple[list, list]:
    rule = [True] * (both + rule_only) + [False] * (judge_only + neither)
    judge = [True] * both + [False] * rule_only + [True] * judge_only + [False] * neither
    return rule, judge


# ---- statistics --------------------------------------------------------------------------------


def test_kappa_of_a_known_table():
    # 20 both yes, 5 rule only, 10 judge only, 15 both no (n = 50): observed 35/50 = 0.7;
    # chance = (25*30 + 25*20) / 50^2 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4.
    table = confusion(*_labels(20, 5, 10, 15))
    assert (table.both_correct, table.rule_only, table.judge_only, table.both_wrong) == (
        20,
        5,
        10,
        15,
    )
    assert cohens_kappa(table) == pytest.approx(0.4)
    # Agreement no better than chance is 0, systematic disagreement negative, all agree 1.
    assert cohens_kappa(confusion(*_labels(10, 10, 10, 10))) == pytest.approx(0.0)
    assert cohens_kappa(confusion(*_labels(0, 5, 5, 0))) == pytest.approx(-1.0)
    assert cohens_kappa(confusion(*_labels(3, 0, 0, 7))) == pytest.approx(1.0)


def test_kappa_is_undefined_when_both_labelings_are_one_class():
    assert cohens_kappa(confusion([True] * 4, [True] * 4)) is None
    assert cohens_kappa(confusion([], [])) is None
    # One labeling constant, the other not: chance < 1, kappa is 0.
    assert cohens_kappa(confusion([True] * 4, [True, True, False, False])) == pytest.approx(0.0)


def test_wilson_bounds_match_the_hand_computed_interval():
    # 8 of 10, z = 1.95996: center (0.8 + z^2/20) / (1 + z^2/10) = 0.71676,
    # half z * sqrt(0.016 + z^2/400) / (1 + z^2/10) = 0.22653.
    low, high = wilson_interval(8, 10)
    assert (low, high) == (pytest.approx(0.49016, abs=1e-4), pytest.approx(0.94331, abs=1e-4))
    # 0 of 10: the lower bound is 0 and the upper z^2 / (n + z^2) = 0.27754.
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.27754, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.72246, abs=1e-4), 1.0)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(3, 2)


def test_the_bootstrap_is_seeded_and_covers_the_point_estimate():
    rule, judge = _labels(20, 5, 10, 15)
    first = bootstrap_kappa(rule, judge, seed=0)
    assert first == bootstrap_kappa(rule, judge, seed=0)
    assert first != bootstrap_kappa(rule, judge, seed=1)
    low, high, undefined = first
    assert low is not None and high is not None and undefined == 0
    assert low < 0.4 < high
    # About 0.4 +- 1.96 * 0.13 (kappa's large-sample standard error on this table).
    assert 0.05 < low < 0.25 and 0.55 < high < 0.75


def test_the_bootstrap_counts_resamples_where_kappa_is_undefined():
    low, high, undefined = bootstrap_kappa([True] * 5, [True] * 5, seed=0, resamples=50)
    assert (low, high, undefined) == (None, None, 50)
    # One response in 20 of the other class: most resamples still see both classes.
    rule, judge = _labels(1, 0, 0, 19)
    low, high, undefined = bootstrap_kappa(rule, judge, seed=0, resamples=200)
    assert 0 < undefined < 200 and low is not None


def test_auc_counts_ordered_pairs_and_ties_as_halves():
    # 3 x 2 pairs: 0.9 beats both, 0.5 ties one and beats one, 0.2 loses both -> 3.5 / 6.
    assert auc([0.9, 0.5, 0.2], [0.5, 0.3]) == pytest.approx(3.5 / 6)
    assert auc([1.0, 0.8], [0.1, 0.0]) == 1.0 and auc([0.1], [0.9]) == 0.0
    assert auc([0.7] * 4, [0.7] * 9) == 0.5  # one score for all: no discrimination
    assert auc([], [0.3]) is None and auc([0.3], []) is None


def test_the_auc_bootstrap_is_seeded_covers_the_estimate_and_counts_one_class_resamples():
    correct = [True] * 30 + [False] * 70
    scores = [0.8 + 0.005 * i for i in range(30)] + [0.55 + 0.005 * i for i in range(70)]
    point = auc(scores[:30], scores[30:])
    low, high, undefined = bootstrap_auc(correct, scores, seed=0)
    assert (low, high, undefined) == bootstrap_auc(correct, scores, seed=0)
    assert low is not None and high is not None and low < point < high and undefined == 0
    assert bootstrap_auc([True] * 5, [0.5] * 5, seed=0, resamples=20) == (None, None, 20)


def test_summary_counts_an_unscored_response_without_scoring_it():
    judged = [
        JudgedResponse("a", 0, 1.0, 0.9),  # rule right, judge passes
        JudgedResponse("a", 1, 1.0, 0.5),  # at the threshold: passes
        JudgedResponse("b", 0, 0.0, 0.2),  # both wrong
        JudgedResponse("b", 1, 0.5, 0.7),  # half credit is not correct: the judge disagrees
        JudgedResponse("c", 0, 0.8, 0.1),  # a shaped right answer: the judge disagrees
        JudgedResponse("c", 1, 0.0, None, "JudgeError: no verdict"),
    ]
    summary = summarize(judged, 0.5, seed=0, resamples=100)
    assert (summary["num_sampled"], summary["n"], summary["num_errors"]) == (6, 5, 1)
    assert summary["errors"] == [{"uid": "c", "sample_index": 1, "error": "JudgeError: no verdict"}]
    assert summary["confusion"] == {
        "rule_correct": {"judge_pass": 2, "judge_fail": 1},
        "rule_wrong": {"judge_pass": 1, "judge_fail": 1},
    }
    assert summary["agreement"] == pytest.approx(3 / 5)
    assert summary["agreement_ci95"] == pytest.approx(list(wilson_interval(3, 5)))
    # rule yes 3/5, judge yes 3/5: chance 0.52, kappa (0.6 - 0.52) / 0.48 = 1/6
    assert summary["kappa"] == pytest.approx(1 / 6)
    assert summary["judge_mean_score_rule_correct"] == pytest.approx((0.9 + 0.5 + 0.1) / 3)
    assert summary["judge_mean_score_rule_wrong"] == pytest.approx((0.2 + 0.7) / 2)
    assert summary["judge_mean_score_gap"] == pytest.approx(0.5 - 0.45)
    assert summary["rule_correct_share"] == pytest.approx(3 / 5)
    table = format_table(summary)
    assert "judged 5 of 6 (1 errors)" in table and "kappa      0.167" in table


def test_a_summary_without_any_scored_response_has_no_figures():
    summary = summarize([JudgedResponse("a", 0, 1.0, None, "late")], 0.5, seed=0, resamples=10)
    assert (summary["n"], summary["num_errors"], summary["agreement"]) == (0, 1, None)
    assert summary["kappa"] is None and summary["kappa_ci95"] is None
    assert summary["judge_mean_score_gap"] is None
    format_table(summary)  # prints dashes, does not raise


# ---- sampling and judging ----------------------------------------------------------------------


def _records() -> list[PromptRecord]:
    return [PromptRecord(f"train-{i}", f"{i}+{i}", str(2 * i), "arithmetic") for i in range(4)]


def _rows() -> list[dict]:
    return [
        {"prompt_uid": f"train-{i}", "sample_index": s, "reward": float(s), "text": f"r{i}{s}"}
        for i in range(4)
        for s in range(2)
    ]


def test_the_sample_is_seeded_in_file_order_and_all_rows_when_fewer():
    rows = _rows()
    picked = sample_responses(rows, _records(), 3, seed=0)
    assert [s.row for s in picked] == sorted(s.row for s in picked) and len(picked) == 3
    assert [s.row for s in sample_responses(rows, _records(), 3, seed=0)] == [s.row for s in picked]
    assert [s.row for s in sample_responses(rows, _records(), 99, seed=0)] == list(range(8))
    first = picked[0]
    assert (
        first.record.uid == rows[first.row]["prompt_uid"] and first.text == rows[first.row]["text"]
    )


def test_a_row_whose_prompt_the_data_lacks_is_bad_input():
    rows = [*_rows(), {"prompt_uid": "val-9", "sample_index": 0, "reward": 0.0, "text": "x"}]
    with pytest.raises(ValueError, match="row 9: the config's data has no prompt uid 'val-9'"):
        sample_responses(rows, _records(), 99, seed=0)
    rows[0]["ground_truth"] = "77"
    with pytest.raises(ValueError, match=r"row 1: .* another ground truth for uid 'train-0'"):
        sample_responses(rows, _records(), 99, seed=0)


class ScriptedBackend:
    """Answers ``Score: 8`` unless the response under judgement is ``unreadable``."""

    constrains = False

    def __init__(self) -> None:
        self.calls: list[JudgeCall] = []

    async def complete(self, call: JudgeCall) -> JudgeReply:
        self.calls.append(call)
        text = "I cannot tell" if "unreadable" in call.messages[0]["content"] else "Score: 8"
        return JudgeReply(text, 10, 3)


def test_every_sampled_response_is_judged_and_an_unscorable_one_is_an_error():
    rows = _rows()
    rows[3]["text"] = "unreadable"
    sampled = sample_responses(rows, _records(), 99, seed=0)
    judge = Judge(JudgeConfig(base_url="http://judge.invalid/v1", endpoint_model="m", retries=1),
                  ScriptedBackend(), backoff_s=0.0)  # fmt: skip
    judged = asyncio.run(judge_all(judge, sampled))
    assert [(j.uid, j.sample_index) for j in judged] == [
        (s.record.uid, s.sample_index) for s in sampled
    ]
    assert [j.score for j in judged] == [0.8] * 3 + [None] + [0.8] * 4
    assert "could not score" in (judged[3].error or "")
    metrics = judge.drain_metrics()
    assert (metrics["judge/calls"], metrics["judge/parse_failures"]) == (9, 2)
    assert metrics["judge/retries"] == 1


# ---- the command line: bad input is one line and exit code 2 -----------------------------------


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _main(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


JUDGE = "reward.judge.base_url=http://judge.invalid/v1"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "error: missing responses=: the responses.jsonl of study.lengths"),
        (
            ["responses=r.jsonl", "threshold=1.5"],
            "error: threshold='1.5': expected a number in [0, 1]",
        ),
        (["responses=r.jsonl", "samples=0"], "error: samples=0: expected an integer >= 1"),
        (["responses=r.jsonl", "seed=x"], "error: samples='200', seed='x': expected integers"),
    ],
)
def test_bad_study_keys_are_one_line_and_exit_2(capsys, argv, expected):
    assert _main(capsys, *argv) == (2, expected + "\n")


def test_a_missing_responses_file_is_one_line_and_exit_2(capsys, tmp_path):
    code, err = _main(capsys, f"responses={tmp_path}/nope.jsonl", JUDGE)
    assert (code, err) == (
        2,
        f"error: responses='{tmp_path}/nope.jsonl': No such file or directory\n",
    )


def test_a_responses_file_without_the_fields_is_one_line_and_exit_2(capsys, tmp_path):
    path = _write_rows(tmp_path / "r.jsonl", [_rows()[0], {"prompt_uid": "train-1", "text": "x"}])
    code, err = _main(capsys, f"responses={path}", JUDGE)
    assert code == 2
    assert err == f"error: {path}:2: no sample_index, reward (a responses.jsonl of python -m " \
        "recipe.tools.study.lengths holds them)\n"  # fmt: skip
    typo = _write_rows(tmp_path / "t.jsonl", [{**_rows()[0], "reward": "1.0"}])
    assert _main(capsys, f"responses={typo}", JUDGE) == (
        2,
        f"error: {typo}:1: expected a numeric reward, an integer sample_index and a string text\n",
    )
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    assert _main(capsys, f"responses={tmp_path}/bad.jsonl", JUDGE) == (
        2,
        f"error: {tmp_path}/bad.jsonl:1: not a JSON object\n",
    )


def test_an_unknown_key_is_one_line_and_exit_2(capsys, tmp_path):
    path = _write_rows(tmp_path / "r.jsonl", _rows())
    code, err = _main(capsys, f"responses={path}", JUDGE, "reward.judge.no_such_knob=1")
    assert code == 2 and err.startswith("error: ") and "no_such_knob" in err
    assert len(err.splitlines()) == 1


def test_no_judge_configured_is_one_line_and_exit_2(capsys, tmp_path):
    path = _write_rows(tmp_path / "r.jsonl", _rows())
    code, err = _main(capsys, f"responses={path}")
    assert (code, err) == (2, "error: no judge: set reward.judge.model or reward.judge.base_url\n")


def test_a_judge_model_that_is_no_model_is_one_line_and_exit_2(capsys, tmp_path):
    path = _write_rows(tmp_path / "r.jsonl", _rows())
    code, err = _main(capsys, f"responses={path}", f"reward.judge.model={tmp_path}/none")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: reward.judge.model='{tmp_path}/none': ")


def test_help_prints_the_usage_and_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "responses=" in capsys.readouterr().out


# ---- the judge prompt's encoding (shared with JudgeServer) --------------------------------------


class CharTokenizer:
    """One token per character; no chat template (messages are joined as they are)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False  # the template wrote every special token
        return [ord(c) for c in text]


def _call(text: str, max_tokens: int = 8) -> JudgeCall:
    return JudgeCall([{"role": "user", "content": text}], 0.0, 1.0, max_tokens, None)


def test_a_judge_prompt_is_encoded_within_the_context_or_refused():
    tokenizer = CharTokenizer()
    # room = max_model_len - max_tokens - PROMPT_MARGIN (16) = 40 - 8 - 16 = 16 tokens
    assert encode_call(tokenizer, _call("x" * 16), 40) == [ord("x")] * 16
    with pytest.raises(JudgePromptTooLong, match=r"17 tokens does not fit .*max_model_len=40"):
        encode_call(tokenizer, _call("x" * 17), 40)
