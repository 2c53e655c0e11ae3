"""``RewardFunction`` with ``reward.judge``: the judge scores every data source, a custom
function that takes ``judge`` combines it with a rule, a pairwise judge scores a lone response
pointwise, and a verdict that never parses stops scoring with a ``RewardError`` naming the
prompt (never a silent 0). The backend is an in-process fake of the endpoint."""

from __future__ import annotations

import re

import pytest

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward import RewardConfig, RewardError, RewardFunction
from recipe.reward.judge import JudgeCall, JudgeConfig, JudgeReply
from recipe.run.metrics import judge_metrics

RECORD = PromptRecord("train-000007", "What is 2+3?", "5", "no-scorer-for-this")


class RuleJudge:
    """The built-in templates' reader: pointwise "Score: 10" when the response section holds
    the answer 5, else "Score: 0"; pairwise, the response holding 5 wins. Records the calls."""

    constrains = False  # it stands for an endpoint

    def __init__(self, cfg: JudgeConfig) -> None:
        self.calls: list[JudgeCall] = []

    async def complete(self, call: JudgeCall) -> JudgeReply:
        self.calls.append(call)
        text = call.messages[-1]["content"]
        if "[Response A]" in text:
            a = text.split("[Response A]")[1].split("[Response B]")[0]
            return JudgeReply(f"Winner: {'A' if '5' in a else 'B'}", 10, 2)
        response = text.split("[Response]")[1].split("Grade the")[0]
        return JudgeReply("Score: 10" if "5" in response else "Score: 0", 10, 2)


class MuteJudge(RuleJudge):
    async def complete(self, call: JudgeCall) -> JudgeReply:
        self.calls.append(call)
        return JudgeReply("I cannot say.", 10, 3)


def _reward_fn(monkeypatch, backend_cls, **judge) -> RewardFunction:
    monkeypatch.setattr("recipe.reward.judged.EndpointBackend", backend_cls)
    cfg = JudgeConfig(base_url="http://judge.invalid/v1", endpoint_model="m", retries=1, **judge)
    return RewardFunction(RewardConfig(judge=cfg))


def _group(*responses: str) -> list[Trajectory]:
    return [
        Trajectory(RECORD.uid, i, [1], [], [], [], finish_reason="stop", response_text=r)
        for i, r in enumerate(responses)
    ]


def test_the_judge_scores_every_data_source_and_reports_its_calls(monkeypatch):
    reward_fn = _reward_fn(monkeypatch, RuleJudge, template=None)
    reward_fn.check_data_sources({"no-scorer-for-this"})  # the judge scores them all
    group = _group("The answer: 5", "The answer: 7")
    reward_fn.score_groups([RECORD], [group])
    assert [t.reward for t in group] == [1.0, 0.0]
    metrics = judge_metrics(reward_fn, {"timing/reward_s": 0.5, "timing/step_s": 2.0})
    assert metrics["judge/calls"] == 2 and metrics["judge/trainer_wait_share"] == 0.25
    assert reward_fn.drain_metrics() == {}  # drained


def test_a_pairwise_judge_scores_a_lone_answer_pointwise(monkeypatch):
    reward_fn = _reward_fn(monkeypatch, RuleJudge, mode="pairwise")
    lone = _group("The answer: 5")  # a validation's one greedy answer
    reward_fn.score_group(RECORD, lone)
    assert lone[0].reward == 1.0
    assert "Score" in reward_fn._judge.backend.calls[-1].messages[-1]["content"]


def test_a_verdict_that_never_parses_stops_scoring_naming_the_prompt(monkeypatch):
    reward_fn = _reward_fn(monkeypatch, MuteJudge)
    group = _group("5", "6")
    with pytest.raises(RewardError, match=re.escape("train-000007")) as err:
        reward_fn.score_groups([RECORD], [group])
    assert str(err.value).startswith("reward.judge:")
    assert len(reward_fn._judge.backend.calls) == 4  # two responses, each tried twice


def test_a_custom_function_gets_the_judge_beside_its_rule(monkeypatch, tmp_path):
    path = tmp_path / "fn.py"
    path.write_text(
        "async def fn(data_source, solution_str, ground_truth, extra_info=None, *, judge):\n"
        "    return {'score': float(solution_str.endswith(ground_truth)),\n"
        "            'judge': await judge(solution_str)}\n"
    )
    monkeypatch.setattr("recipe.reward.judged.EndpointBackend", RuleJudge)
    judge = JudgeConfig(base_url="http://judge.invalid/v1", endpoint_model="m")
    reward_fn = RewardFunction(RewardConfig(custom_fn=f"{path}:fn", judge=judge))
    group = _group("The answer: 5", "The answer: 7")
    reward_fn.score_groups([RECORD], [group])
    assert [(t.reward, t.reward_extras["judge"]) for t in group] == [(1.0, 1.0), (0.0, 0.0)]


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        (JudgeConfig(), "takes a `judge` argument but reward.judge has no model or base_url"),
        (
            JudgeConfig(base_url="http://j/v1", endpoint_model="m", mode="pairwise"),
            "needs reward.judge.mode=pointwise",
        ),
    ],
)
def test_a_custom_function_that_takes_the_judge_needs_a_pointwise_one(tmp_path, judge, message):
    path = tmp_path / "fn.py"
    path.write_text("async def fn(data_source, solution_str, ground_truth, judge):\n    return 1\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        RewardFunction(RewardConfig(custom_fn=f"{path}:fn", judge=judge))
