"""The calculator task: its tool, problems, reference episodes, environment and scorer."""

from __future__ import annotations

import asyncio

import pytest

from recipe.agent.builtin import Calculator
from recipe.agent.loading import environment_class
from recipe.data.arithmetic import split_of
from recipe.data.calculator import (
    calculator_step,
    make_calculator_records,
    operands_of,
    transcript,
)
from recipe.data.config import DataConfig
from recipe.data.dataset import build_datasets
from recipe.protocol import PromptRecord
from recipe.reward.registry import get_scorer
from recipe.utils.config_check import ConfigError


def _record(prompt: str, truth: str) -> PromptRecord:
    return PromptRecord(uid="u", prompt=prompt, ground_truth=truth, data_source="calculator")


@pytest.mark.parametrize(
    ("action", "answer", "observation", "error"),
    [
        ("12+34", None, "=46\n", False),
        (" 46-5 ", None, "=41\n", False),
        ("7-9", None, "=-2\n", False),
        ("41", 41, None, False),
        ("0041", 41, None, False),
        ("12+34-5", None, "=error\n", True),
        ("12*3", None, "=error\n", True),
        ("", None, "=error\n", True),
        ("-4", None, "=error\n", True),
        ("forty", None, "=error\n", True),
    ],
)
def test_calculator_step(action, answer, observation, error):
    step = calculator_step(action)
    assert (step.answer, step.observation, step.error) == (answer, observation, error)


def test_records_are_deterministic_disjoint_and_right():
    train = make_calculator_records(300, difficulty=2, num_operands=3, seed=4, split="train")
    again = make_calculator_records(100, difficulty=2, num_operands=3, seed=4, split="train")
    assert [r.prompt for r in train[:100]] == [r.prompt for r in again]
    val = make_calculator_records(100, difficulty=2, num_operands=3, seed=4, split="val")
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    for record in train + val:
        assert split_of(str(record.prompt)) == record.uid.split("-")[0]
        values, ops = operands_of(str(record.prompt))
        assert len(values) == 3 and all(0 <= v < 100 for v in values)
        running = values[0]
        for op, value in zip(ops, values[1:], strict=True):
            running = running + value if op == "+" else running - value
            assert running >= 0
        assert record.ground_truth == str(running)
    assert len({r.uid for r in train}) == 300


def test_records_other_operand_counts_and_too_many():
    five = make_calculator_records(20, difficulty=1, num_operands=5, seed=0, split="val")
    assert all(str(r.prompt).count("+") + str(r.prompt).count("-") == 4 for r in five)
    with pytest.raises(ValueError, match=r"data\.num_train_prompts=5000 is too large"):
        make_calculator_records(5000, difficulty=1, num_operands=2, seed=0, split="train")
    with pytest.raises(ValueError, match=r"data\.num_operands=9"):
        make_calculator_records(5, difficulty=1, num_operands=9, seed=0, split="train")


def test_transcript_replays_through_the_tool():
    segments = transcript(_record("12+34-5=", "41"))
    assert segments == [
        ("12+34-5=", False),
        ("12+34", True),
        ("=46\n", False),
        ("46-5", True),
        ("=41\n", False),
        ("41", True),
    ]


def _play(env: Calculator, record: PromptRecord, actions: list[str]):
    async def go():
        await env.reset(record)
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def test_environment_rewards_and_tool_errors():
    env = environment_class("calculator")()
    record = _record("12+34-5=", "41")
    calls, bad, answer = _play(env, record, ["12+34", "12+34-5", "41"])
    assert (calls.observation, calls.reward, calls.done) == ("=46\n", 0.0, False)
    assert bad.tool_error and bad.observation == "=error\n" and not bad.done
    assert answer.done and answer.reward == 1.0
    assert answer.info == {"calls": 2.0, "correct": 1.0}
    (wrong,) = _play(env, record, ["40"])
    assert wrong.done and wrong.reward == 0.0


def test_scorer_reads_the_last_answer():
    score = get_scorer("calculator")
    assert score("calculator", "41", "41") == 1.0
    assert score("calculator", "12+34=46\n46-5=41\n41", "41") == 1.0
    assert score("calculator", "12+34", "46") == 0.0
    assert score("calculator", "41 apples", "41") == 0.0
    assert score("calculator", "=41\n", "41") == 0.0


def test_dataset_config_builds_the_task():
    cfg = DataConfig(task="calculator", num_train_prompts=50, num_val_prompts=10, num_operands=4)
    train, val = build_datasets(cfg)
    assert len(train) == 50 and len(val) == 10
    assert all(r.data_source == "calculator" for r in train + val)
    assert all(str(r.prompt).count("+") + str(r.prompt).count("-") == 3 for r in train)
    with pytest.raises(ConfigError, match=r"data\.num_operands"):
        DataConfig(task="calculator", num_operands=1)
