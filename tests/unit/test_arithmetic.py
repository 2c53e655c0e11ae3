"""The synthetic arithmetic task: deterministic, disjoint splits, correct answers."""

from __future__ import annotations

import re

import pytest

from recipe.data.arithmetic import (
    SPLITS,
    make_arithmetic_records,
    problem_space_size,
    sft_text,
    split_of,
)

_PROBLEM = re.compile(r"^(\d+)([+-])(\d+)=$")


def _operands(prompt: str) -> tuple[int, str, int]:
    match = _PROBLEM.match(prompt)
    assert match is not None, prompt
    return int(match.group(1)), match.group(2), int(match.group(3))


def test_records_are_deterministic_for_the_same_arguments() -> None:
    first = make_arithmetic_records(300, difficulty=2, seed=7, split="train")
    again = make_arithmetic_records(300, difficulty=2, seed=7, split="train")
    assert first == again


def test_seed_changes_the_draw_and_a_shorter_list_is_a_prefix() -> None:
    seed1 = make_arithmetic_records(200, difficulty=3, seed=1, split="train")
    seed2 = make_arithmetic_records(200, difficulty=3, seed=2, split="train")
    assert [r.prompt for r in seed1] != [r.prompt for r in seed2]
    assert make_arithmetic_records(50, difficulty=3, seed=1, split="train") == seed1[:50]


def test_splits_are_disjoint_across_seeds() -> None:
    prompts = {
        split: {
            r.prompt
            for seed in (1, 2)
            for r in make_arithmetic_records(500, difficulty=2, seed=seed, split=split)
        }
        for split in SPLITS
    }
    assert not prompts["train"] & prompts["val"]
    assert not prompts["train"] & prompts["sft"]
    assert not prompts["val"] & prompts["sft"]
    for split, texts in prompts.items():
        assert all(split_of(text) == split for text in texts)


def test_prompts_are_distinct_within_a_split() -> None:
    records = make_arithmetic_records(2000, difficulty=2, seed=1, split="train")
    assert len({r.prompt for r in records}) == len(records)
    assert len({r.uid for r in records}) == len(records)


@pytest.mark.parametrize("difficulty", [1, 2, 4])
def test_answers_are_correct_and_non_negative(difficulty: int) -> None:
    records = make_arithmetic_records(100, difficulty=difficulty, seed=1, split="train")
    ops = set()
    for record in records:
        a, op, b = _operands(str(record.prompt))
        ops.add(op)
        expected = a + b if op == "+" else a - b
        assert record.ground_truth == str(expected)
        assert expected >= 0
    assert ops == {"+", "-"}


def test_records_carry_uid_source_and_extra_info() -> None:
    record = make_arithmetic_records(3, difficulty=2, seed=5, split="val")[2]
    assert record.uid == "val-000002"
    assert record.data_source == "arithmetic"
    assert record.extra_info == {"difficulty": 2, "seed": 5, "split": "val"}


def test_difficulty_sets_the_operand_digits() -> None:
    for difficulty in (1, 3, 5):
        records = make_arithmetic_records(100, difficulty=difficulty, seed=1, split="train")
        operands = [x for r in records for x in _operands(str(r.prompt))[::2]]
        assert max(len(str(x)) for x in operands) == difficulty
        # Uniform draws from [0, 10**d): most operands have all d digits.
        share_full = sum(len(str(x)) == difficulty for x in operands) / len(operands)
        assert share_full > 0.8


def test_sft_text_is_prompt_then_answer() -> None:
    record = make_arithmetic_records(1, difficulty=2, seed=1, split="sft")[0]
    assert sft_text(record) == f"{record.prompt}{record.ground_truth}"


def test_too_many_prompts_for_the_problem_space_names_the_key() -> None:
    assert problem_space_size(1) == 155
    with pytest.raises(ValueError, match=r"data\.num_train_prompts=200.*data\.difficulty=1"):
        make_arithmetic_records(200, difficulty=1, seed=1, split="train")
    with pytest.raises(ValueError, match=r"data\.num_val_prompts=256"):
        make_arithmetic_records(256, difficulty=1, seed=1, split="val")


def test_a_split_can_be_drawn_to_exhaustion() -> None:
    with pytest.raises(ValueError) as info:
        make_arithmetic_records(10**6, difficulty=1, seed=1, split="train")
    capacity = int(re.search(r"has (\d+) usable", str(info.value)).group(1))
    records = make_arithmetic_records(capacity, difficulty=1, seed=1, split="train")
    assert len({r.prompt for r in records}) == capacity


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"difficulty": 0, "split": "train"}, "data.difficulty"),
        ({"difficulty": 7, "split": "train"}, "data.difficulty"),
        ({"difficulty": 2, "split": "test"}, "split"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        make_arithmetic_records(10, seed=1, **kwargs)
