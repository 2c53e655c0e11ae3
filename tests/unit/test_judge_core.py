"""The LLM judge's core (recipe/reward/judge/): its config checks, templates, verdict rules and
the ``Judge`` over an in-process backend that answers from what the prompt shows (the HTTP
backend against a real server: test_judge_endpoint.py)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward.judge import Judge, JudgeCall, JudgeConfig, JudgeError, JudgeReply
from recipe.reward.judge.judge import stable_seed
from recipe.reward.judge.prompts import (
    PAIRWISE_TEMPLATE,
    POINTWISE_TEMPLATE,
    correction,
    format_number,
    render_pairwise,
    render_pointwise,
    template_problem,
)
from recipe.reward.judge.verdicts import parse_score, parse_winner
from recipe.utils.config_check import ConfigError

SLOW = "slow"
"""A scripted answer: the fake sleeps past any deadline."""


def _template(tmp_path: Path, text: str) -> str:
    path = tmp_path / "template.txt"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"model": "m", "base_url": "http://h/v1", "endpoint_model": "m"}, "base_url"),
        ({"base_url": "http://h/v1"}, "endpoint_model"),
        ({"mode": "listwise"}, "mode"),
        ({"score_min": 5.0, "score_max": 5.0}, "score_min"),
        ({"retries": -1}, "retries"),
        ({"retry_temperature": -0.1}, "retry_temperature"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"replicas": 0}, "replicas"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.0}, "gpu_memory_utilization"),
        ({"template": "no/such/template.txt"}, "template"),
    ],
)
def test_bad_judge_value_fails_naming_the_key(kwargs, key):
    with pytest.raises(ConfigError) as info:
        JudgeConfig(**kwargs)
    message = str(info.value)
    assert message.startswith(f"reward.judge.{key}=") and "is invalid: allowed" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("mode", "text", "named"),
    [
        ("pointwise", "Grade {prompt}", "{response}"),
        ("pairwise", "{response_a} vs ?", "{response_b}"),
        ("pointwise", "{response} {answer}", "{answer}"),
        ("pointwise", "{response_a} {response}", "{response_a}"),
        ("pointwise", "{response!r}", "{response!r}"),
        ("pointwise", "{response} {", "brace"),
        ("pointwise", "{response} }", "brace"),
    ],
)
def test_template_with_wrong_placeholders_fails_naming_them(tmp_path, mode, text, named):
    with pytest.raises(ConfigError) as info:
        JudgeConfig(mode=mode, template=_template(tmp_path, text))
    assert str(info.value).startswith("reward.judge.template=") and named in str(info.value)


def test_template_that_is_no_text_file_fails(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe{response}")
    for path in (tmp_path, tmp_path / "bad.txt"):  # a directory, then not UTF-8
        with pytest.raises(ConfigError, match=r"^reward.judge.template=.*readable"):
            JudgeConfig(template=str(path))


def test_template_is_read_once_and_travels_with_the_config(tmp_path):
    import pickle

    path = Path(_template(tmp_path, "{prompt} -> {response} {{literal}}"))
    cfg = JudgeConfig(base_url="http://h/v1", endpoint_model="m", template=str(path))
    path.unlink()  # another node has no such file
    assert pickle.loads(pickle.dumps(cfg)).template_text == "{prompt} -> {response} {{literal}}"
    assert cfg.enabled and not JudgeConfig().enabled
    assert JudgeConfig(mode="pairwise").template_text == PAIRWISE_TEMPLATE


def test_builtin_templates_ask_for_the_verdicts_the_parsers_read():
    assert template_problem(POINTWISE_TEMPLATE, "pointwise") is None
    assert template_problem(PAIRWISE_TEMPLATE, "pairwise") is None
    text = render_pointwise(POINTWISE_TEMPLATE, "2+2?", "4", "4", 0.0, 10.0)
    assert text.rstrip().endswith("Score: N\nwhere N is a number from 0 (worst) to 10 (best).")
    assert PAIRWISE_TEMPLATE.rstrip().endswith("Winner: A\nor\nWinner: B")


def test_braces_in_a_response_are_shown_verbatim_never_expanded():
    response = "def f(): return {'a': 1} {ground_truth} {0} {response} }{"
    text = render_pointwise(
        "Q: {prompt}\nR: {response}\nT: {ground_truth}", "q", response, "42", 0, 1
    )
    assert text == f"Q: q\nR: {response}\nT: 42"
    pair = render_pairwise("{response_a}|{response_b}|{{x}}", "q", "{response_b}", "}", "", 0, 1)
    assert pair == "{response_b}|}|{x}"


def test_chat_prompt_is_rendered_as_role_lines():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert render_pointwise("{prompt}", chat, "", "", 0, 1) == "system: Be brief.\nuser: 2+2?"


SCORE_TABLE = [
    ("The answer is right.\n\nScore: 7", 0.7),
    ("Reasoning is sound; score = 7.5", 0.75),
    ("**Score:** 8/10", 0.8),
    ("score 3 at first... on reflection, Final Score: 9", 0.9),
    ("I would score it highly.\n\n6", 0.6),  # no number after "score": the last number
    ("Score: 11", None),  # outside [0, 10]
    ("Score: -1", None),
    ("No verdict, sorry.", None),
    ("", None),
    ("SCORE:10", 1.0),
    ("Score: 0", 0.0),
]


@pytest.mark.parametrize(("text", "expected"), SCORE_TABLE)
def test_parse_score_table(text, expected):
    assert parse_score(text, 0.0, 10.0) == expected


WINNER_TABLE = [
    ("Both are fine, but A is clearer.\nWinner: A", "A"),
    ("**Winner:** B", "B"),
    ("winner = response a", "A"),
    ("The winner is Response B.", "B"),
    ("Winner: a tie", "tie"),
    ("Winner: Tie", "tie"),
    ("Winner: A\n...wait, I was wrong.\nWinner: B", "B"),
    ("Response B is correct.\n\n[[B]]", "B"),
    ("Final:\n**A**", "A"),
    ("Winner: Alice", None),
    ("I cannot decide.", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), WINNER_TABLE)
def test_parse_winner_table(text, expected):
    assert parse_winner(text) == expected


@given(st.text())
def test_parsers_never_raise(text):
    score = parse_score(text, -5.0, 5.0)
    assert score is None or 0.0 <= score <= 1.0
    assert parse_winner(text) in (None, "A", "B", "tie")


@given(
    st.text(),
    st.integers(-2000, 2000),
    st.booleans(),
    st.sampled_from(["Score: {}", "**Score:** {}/20", "score = {}"]),
)
def test_rendered_score_round_trips(reasoning, cents, whole, form):
    shown = str(cents // 100) if whole else f"{cents / 100:.2f}"
    text = f"{reasoning}\n{form.format(shown)}"
    assert parse_score(text, -20.0, 20.0) == pytest.approx((float(shown) + 20) / 40)


@given(
    st.text(), st.sampled_from(["A", "B", "tie"]), st.sampled_from(["Winner: {}", "**Winner:** {}"])
)
def test_rendered_winner_round_trips(reasoning, winner, form):
    assert parse_winner(f"{reasoning}\n{form.format(winner)}") == winner


class ScriptedJudge:
    """A judge backend in this process: ``answer`` maps each call to its reply text, or
    raises; a scripted ``SLOW`` first sleeps past any deadline. Counts calls in flight."""

    def __init__(
        self, answer: Callable[[JudgeCall], str], delay_s: float = 0.0, constrains: bool = True
    ) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.constrains = constrains
        self.calls: list[JudgeCall] = []
        self.in_flight = self.max_in_flight = 0

    async def complete(self, call: JudgeCall) -> JudgeReply:
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            text = self.answer(call)
            if text == SLOW:
                await asyncio.sleep(5)
            return JudgeReply(text=text, prompt_tokens=10, completion_tokens=3)
        finally:
            self.in_flight -= 1


def _script(*answers: str | Exception) -> Callable[[JudgeCall], str]:
    pending = list(answers)

    def answer(call: JudgeCall) -> str:
        item = pending.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return answer


def _group(*responses: str, uid: str = "train-7") -> tuple[PromptRecord, list[Trajectory]]:
    record = PromptRecord(uid=uid, prompt="q", ground_truth="4", data_source="judged")
    trajs = [
        Trajectory(uid, i, [1], [], [], [], finish_reason="stop", response_text=r)
        for i, r in enumerate(responses)
    ]
    return record, trajs


def _value_of(call: JudgeCall, name: str) -> int:
    return int(re.search(rf"{name}=(-?\d+)", call.messages[0]["content"]).group(1))


def _judge(tmp_path, backend, **kwargs) -> Judge:
    mode = kwargs.get("mode", "pointwise")
    text = "R={response}" if mode == "pointwise" else "A={response_a} B={response_b}"
    cfg = JudgeConfig(
        base_url="http://h/v1", endpoint_model="m", template=_template(tmp_path, text), **kwargs
    )
    return Judge(cfg, backend, backoff_s=0.01)


def test_pointwise_scores_each_response_in_order(tmp_path):
    backend = ScriptedJudge(lambda call: f"Fine.\nScore: {_value_of(call, 'R')}")
    judge = _judge(tmp_path, backend)
    assert asyncio.run(judge.score_group(*_group("3", "10", "0"))) == [0.3, 1.0, 0.0]
    assert [c.messages[0]["content"] for c in backend.calls] == ["R=3", "R=10", "R=0"]
    assert asyncio.run(judge.score_one("q", "5", "4")) == 0.5


def test_pairwise_scores_are_win_fractions_with_ties_as_halves(tmp_path):
    def better(call: JudgeCall) -> str:  # compares the tens: 20 and 21 tie
        a, b = _value_of(call, "A") // 10, _value_of(call, "B") // 10
        return "Winner: tie" if a == b else f"Winner: {'A' if a > b else 'B'}"

    backend = ScriptedJudge(better)
    judge = _judge(tmp_path, backend, mode="pairwise")
    values = [10, 30, 20, 21]
    scores = asyncio.run(judge.score_group(*_group(*map(str, values))))
    assert scores == [0.0, 1.0, 0.5, 0.5]
    shown = [
        (values.index(_value_of(c, "A")), values.index(_value_of(c, "B"))) for c in backend.calls
    ]
    # every unordered pair once, the lower index shown first in pairs 0, 2, 4
    assert shown == [(0, 1), (2, 0), (0, 3), (2, 1), (1, 3), (3, 2)]


def test_a_judge_that_always_says_a_gives_every_response_one_half(tmp_path):
    judge = _judge(tmp_path, ScriptedJudge(lambda call: "Winner: A"), mode="pairwise")
    for n in (3, 5, 7):
        assert asyncio.run(judge.score_group(*_group(*map(str, range(n))))) == [0.5] * n
    # An even group cannot be shown first in exactly half its pairs: off by 1 / (2 (n - 1)).
    assert asyncio.run(judge.score_group(*_group("0", "1", "2", "3"))) == [2 / 3, 1 / 3] * 2


def test_both_orders_removes_the_position_bias_for_even_groups_at_twice_the_calls(tmp_path):
    backend = ScriptedJudge(lambda call: "Winner: A")
    judge = _judge(tmp_path, backend, mode="pairwise", both_orders=True)
    assert asyncio.run(judge.score_group(*_group("0", "1", "2", "3"))) == [0.5] * 4
    assert len(backend.calls) == 12  # 6 pairs, each in both orders

    def larger(call: JudgeCall) -> str:
        return "Winner: A" if _value_of(call, "A") > _value_of(call, "B") else "Winner: B"

    backend = ScriptedJudge(larger)
    judge = _judge(tmp_path, backend, mode="pairwise", both_orders=True)
    scores = asyncio.run(judge.score_group(*_group("10", "30", "20", "0")))
    assert scores == pytest.approx([1 / 3, 1.0, 2 / 3, 0.0])  # a consistent judge: unchanged
    seeds = {call.seed for call in backend.calls}
    assert len(seeds) == 12  # each order its own question and seed


def test_pairwise_needs_two_responses(tmp_path):
    judge = _judge(tmp_path, ScriptedJudge(lambda call: "Winner: A"), mode="pairwise")
    with pytest.raises(JudgeError, match=r"rollout.n >= 2: prompt train-7"):
        asyncio.run(judge.score_group(*_group("only")))


def test_score_one_is_pointwise_in_either_mode(tmp_path):
    backend = ScriptedJudge(lambda call: "Score: 4")
    judge = _judge(tmp_path, backend, mode="pairwise")
    assert asyncio.run(judge.score_one([{"role": "user", "content": "2+2?"}], "4", "4")) == 0.4
    assert "[Response]\n4" in backend.calls[0].messages[0]["content"]  # the built-in rubric


def test_engine_knobs_warn_with_an_endpoint(caplog):
    with caplog.at_level("WARNING"):
        JudgeConfig(base_url="http://h/v1", endpoint_model="m", replicas=2)
    assert "reward.judge.replicas has no effect with reward.judge.base_url" in caplog.text


@pytest.mark.parametrize(
    ("first", "counter"),
    [
        (SLOW, "judge/failures"),
        (RuntimeError("HTTP 500"), "judge/failures"),
        ("Hmm.", "judge/parse_failures"),
    ],
)
def test_a_failed_call_is_retried_then_scores(tmp_path, first, counter):
    backend = ScriptedJudge(_script(first, "Score: 8"))
    judge = _judge(tmp_path, backend, timeout_s=0.2, temperature=0.7)
    assert asyncio.run(judge.score_group(*_group("x"))) == [0.8]
    metrics = judge.drain_metrics()
    assert metrics["judge/retries"] == 1 and metrics[counter] == 1 and metrics["judge/calls"] == 2
    seeds = [call.seed for call in backend.calls]
    assert seeds[1] == seeds[0] + 1 == stable_seed("train-7", "0") + 1  # a retry samples anew


def test_judge_error_after_the_last_retry_names_prompt_response_and_reply(tmp_path):
    backend = ScriptedJudge(_script("Score: 3", "no idea", "no idea", "still no idea"))
    judge = _judge(tmp_path, backend, retries=2, retry_temperature=0.0)
    with pytest.raises(JudgeError) as info:
        asyncio.run(judge.score_group(*_group("good", "bad", uid="val-3")))
    message = str(info.value)
    assert "prompt val-3 (response 1)" in message and "3 attempts" in message
    assert "'still no idea'" in message
    assert {call.seed for call in backend.calls[1:]} == {stable_seed("val-3", "1")}  # greedy
    assert {call.temperature for call in backend.calls} == {0.0}


def test_a_greedy_judge_retries_an_unreadable_verdict_sampled_and_an_error_greedily(tmp_path):
    # Greedy, the same question gets the same unreadable reply: the retry samples instead.
    def greedy_rambles(call: JudgeCall) -> str:
        return "Score: 96" if call.temperature == 0 else "Score: 6"

    backend = ScriptedJudge(greedy_rambles)
    judge = _judge(tmp_path, backend)  # temperature 0, retry_temperature 0.7
    assert asyncio.run(judge.score_group(*_group("x"))) == [0.6]
    assert [(c.temperature, c.seed) for c in backend.calls] == [
        (0.0, stable_seed("train-7", "0")),
        (0.7, stable_seed("train-7", "0") + 1),
    ]
    backend = ScriptedJudge(_script(RuntimeError("HTTP 503"), "Score: 2"))
    judge = _judge(tmp_path, backend)
    assert asyncio.run(judge.score_group(*_group("x"))) == [0.2]
    assert [c.temperature for c in backend.calls] == [0.0, 0.0]  # an error is not the reply's


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_a_retry_after_an_unreadable_verdict_shows_the_reply_and_says_what_to_fix(tmp_path, mode):
    # A judge on the wrong scale until told the form and the scale (what a 0.5B judge did on
    # GSM8K: "Score: 97" of 10, repeated even when sampled).
    def stubborn(call: JudgeCall) -> str:
        told = call.messages[-1]["content"]
        if len(call.messages) == 1:
            return "Score: 97" if mode == "pointwise" else "Both are fine."
        return "Score: 7" if "from 0 to 10" in told else "Winner: B"

    backend = ScriptedJudge(stubborn)
    judge = _judge(tmp_path, backend, mode=mode)
    expected = [0.7] if mode == "pointwise" else [0.0, 1.0]
    responses = ("x",) if mode == "pointwise" else ("x", "y")
    assert asyncio.run(judge.score_group(*_group(*responses))) == expected
    first, retry = backend.calls
    assert [m["role"] for m in retry.messages] == ["user", "assistant", "user"]
    assert retry.messages[0] == first.messages[0]
    assert retry.messages[1]["content"] == stubborn(first)
    # Only the correction is constrained, to the verdicts the parser reads.
    scores = tuple(f"Score: {n}" for n in range(11))
    assert first.choices is None
    assert retry.choices == (scores if mode == "pointwise" else ("Winner: A", "Winner: B"))
    assert all(parse_score(c, 0, 10) is not None or parse_winner(c) for c in retry.choices)
    # An error is not the reply's fault: its retry repeats the last request as it was.
    backend = ScriptedJudge(_script("Score: 97", RuntimeError("HTTP 503"), "Score: 4"))
    judge = _judge(tmp_path, backend)
    assert asyncio.run(judge.score_group(*_group("x"))) == [0.4]
    assert backend.calls[2].messages == backend.calls[1].messages != backend.calls[0].messages


@pytest.mark.parametrize(
    ("constrains", "bounds"), [(False, (0, 10)), (True, (0.25, 0.75)), (True, (0, 1000))]
)
def test_without_a_constraint_an_unreadable_verdict_is_asked_again_as_it_was(
    tmp_path, constrains, bounds
):
    # Told its scale but free to answer, a 0.5B judge repeated its out-of-scale score more
    # often than when asked again: without the constraint, the question is asked again.
    backend = ScriptedJudge(_script("Score: 9999", "Score: 0.5"), constrains=constrains)
    judge = _judge(tmp_path, backend, score_min=bounds[0], score_max=bounds[1])
    [score] = asyncio.run(judge.score_group(*_group("x")))
    assert score == pytest.approx((0.5 - bounds[0]) / (bounds[1] - bounds[0]))
    first, retry = backend.calls
    assert retry.messages == first.messages and retry.choices is None
    assert (first.temperature, retry.temperature) == (0.0, 0.7)


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        ((0, 10), ["Score: 0", "Score: 10"]),
        ((-2, 2), ["Score: -2", "Score: 2"]),
        ((1, 100), ["Score: 1", "Score: 100"]),
        ((0, 1000), None),  # too many to choose among: told, not constrained
        ((0.25, 0.75), None),  # a fractional scale: told, not constrained
    ],
)
def test_a_pointwise_correction_is_constrained_to_whole_scores_on_a_whole_scale(bounds, expected):
    fix = correction("pointwise", *bounds)
    assert f"from {format_number(bounds[0])} to {format_number(bounds[1])}" in fix.text
    if expected is None:
        assert fix.choices is None
    else:
        assert [fix.choices[0], fix.choices[-1]] == expected
        assert len(fix.choices) == bounds[1] - bounds[0] + 1


def test_seeds_are_stable_across_processes():
    # Python's hash() of a str differs per process; this value may never change.
    assert stable_seed("train-7", "0") == 2100139536


def test_calls_in_flight_stay_within_max_concurrency(tmp_path):
    backend = ScriptedJudge(lambda call: "Score: 5", delay_s=0.02)
    judge = _judge(tmp_path, backend, max_concurrency=2)
    assert asyncio.run(judge.score_group(*_group(*"abcdef"))) == [0.5] * 6
    assert backend.max_in_flight == 2
    assert judge.drain_metrics()["judge/queue_depth_max"] == 4


def test_metrics_are_drained_and_reset(tmp_path):
    judge = _judge(tmp_path, ScriptedJudge(lambda call: "Score: 5"))
    assert judge.drain_metrics() == {}
    asyncio.run(judge.score_group(*_group("a", "b", "c")))
    metrics = judge.drain_metrics()
    assert metrics["judge/calls"] == 3 and metrics["judge/prompt_tokens"] == 30
    assert metrics["judge/completion_tokens"] == 9 and metrics["judge/failures"] == 0
    assert 0 <= metrics["judge/latency_p50_s"] <= metrics["judge/latency_p99_s"]
    assert judge.drain_metrics() == {}
