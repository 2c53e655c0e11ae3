"""``python -m recipe.tools.prepare math``: MATH's published rows -> parquet rows that our loader
reads and ``math_score`` scores, each with its level and subject; rows without an answer are
skipped and said, level 0.0 rows kept and named, ``--levels`` keeps some levels only,
``--holdout`` moves drawn train rows to a heldout split, bad input exits 2 with one line.
The last test runs on the real files when they are present."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from recipe.data.loaders import load_records
from recipe.reward import get_scorer
from recipe.tools.prepare import PrepareError, prepare
from recipe.tools.prepare import __main__ as prepare_cli
from recipe.tools.prepare.math import INSTRUCTION
from tests.helpers.shared_data import shared_data

REPO = Path(__file__).resolve().parents[2]
REAL_MATH = shared_data("math")

# Written for these tests, in the published shape (problem, answer, difficulty, type).
TRAIN_ROWS: list[dict[str, Any]] = [
    {"problem": "What is $1+1$?", "answer": "2", "difficulty": 1.0, "type": "Prealgebra"},
    {"problem": "Simplify $\\frac{2}{4}$.", "answer": "\\frac{1}{2}", "difficulty": 3.0,
     "type": "Algebra"},
    {"problem": "No box in its solution.", "answer": None, "difficulty": 2.0, "type": "Geometry"},
    {"problem": "An empty box.", "answer": "", "difficulty": 5.0, "type": "Number Theory"},
    {"problem": "Level unknown: $3 \\cdot 3$?", "answer": "9", "difficulty": 0.0,
     "type": "Counting & Probability"},
    {"problem": "Where is $(1,2)$?", "answer": "(1, 2)", "difficulty": 5.0,
     "type": "Precalculus"},
]  # fmt: skip
TEST_ROWS: list[dict[str, Any]] = [
    {"problem": "What is $2+2$?", "answer": "4", "difficulty": 1.0,
     "unique_id": "test/prealgebra/12.json"},
    {"problem": "Solve $x^2=9$, $x>0$.", "answer": "3", "difficulty": 4.0,
     "unique_id": "test/intermediate_algebra/7.json"},
]  # fmt: skip


def write_source(folder: Path, train: list[dict] = TRAIN_ROWS, test: list[dict] = TEST_ROWS):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.json").write_text(json.dumps(train, indent=2))
    (folder / "test.json").write_text(json.dumps(test, indent=2))
    return folder


def test_rows_carry_level_subject_and_the_boxed_instruction(tmp_path, caplog):
    src, out = write_source(tmp_path / "src"), tmp_path / "out"
    with caplog.at_level(logging.INFO):
        written = prepare("math", src, out)
    assert written == {out / "train.parquet": 4, out / "test.parquet": 2}
    train = load_records([str(out / "train.parquet")], split="train")
    assert [r.ground_truth for r in train] == ["2", "\\frac{1}{2}", "9", "(1, 2)"]
    assert [r.extra_info["level"] for r in train] == [1, 3, 0, 5]
    assert [r.extra_info["index"] for r in train] == [0, 1, 4, 5]  # source rows
    assert train[1].extra_info["subject"] == "Algebra"
    assert train[0].prompt == [{"role": "user", "content": f"What is $1+1$? {INSTRUCTION}"}]
    assert "\\boxed{}" in INSTRUCTION
    test = load_records([str(out / "test.parquet")], split="test")
    assert [r.extra_info["subject"] for r in test] == ["Prealgebra", "Intermediate Algebra"]
    assert test[1].extra_info["unique_id"] == "test/intermediate_algebra/7.json"
    assert train[0].extra_info["unique_id"] is None
    for record in train + test:
        score = get_scorer(record.data_source)
        boxed = f"so the answer is $\\boxed{{{record.ground_truth}}}$."
        assert score(record.data_source, boxed, record.ground_truth) == 1.0, record.uid
        assert score(record.data_source, "the answer is 17", record.ground_truth) == 0.0
    assert {r.data_source for r in train} == {"lighteval/MATH"}
    assert {r.data_source for r in test} == {"HuggingFaceH4/MATH-500"}
    said = caplog.text
    assert "1 rows skipped, their answer is null (rows 2)" in said
    assert "1 rows skipped, their answer is empty (rows 3)" in said
    assert "1 rows have difficulty 0.0" in said and "kept as level 0 (rows 4)" in said
    assert "4 rows kept, per level 0: 1, 1: 1, 3: 1, 5: 1" in said


def test_levels_keep_only_those_levels_in_every_split(tmp_path, capsys, caplog):
    src, out = write_source(tmp_path / "src"), tmp_path / "out"
    with caplog.at_level(logging.INFO):
        prepare_cli.main(["math", str(src), str(out), "--levels", "1,5"])
    train = load_records([str(out / "train.parquet")], split="train")
    test = load_records([str(out / "test.parquet")], split="test")
    assert [r.extra_info["level"] for r in train] == [1, 5]
    assert [r.extra_info["level"] for r in test] == [1]
    assert "--levels [1, 5]: 2 of 4 train rows kept" in caplog.text
    assert f"wrote 2 rows to {out / 'train.parquet'}" in capsys.readouterr().out


def test_holdout_moves_drawn_train_rows_to_a_heldout_split_after_the_levels(tmp_path):
    src = write_source(tmp_path / "src")
    out = tmp_path / "out"
    prepare_cli.main(["math", str(src), str(out), "--levels", "0,1,3,5", "--holdout", "2"])
    train = load_records([str(out / "train.parquet")], split="train")
    heldout = load_records([str(out / "heldout.parquet")], split="test")
    assert len(train) == 2 and len(heldout) == 2
    by_index = sorted(r.extra_info["index"] for r in train + heldout)
    assert by_index == [0, 1, 4, 5]  # every kept row once, none lost, none twice
    for rows in (train, heldout):  # the source's order within each split
        assert [r.extra_info["index"] for r in rows] == sorted(r.extra_info["index"] for r in rows)
    # The same seed draws the same rows; the draws of other seeds differ.
    again = prepare("math", src, tmp_path / "again", holdout=2)
    assert again[tmp_path / "again" / "heldout.parquet"] == 2
    redrawn = load_records([str(tmp_path / "again" / "heldout.parquet")], split="test")
    assert [r.uid for r in redrawn] == [r.uid for r in heldout]
    draws = set()
    for seed in range(8):
        prepare("math", src, tmp_path / f"s{seed}", holdout=2, holdout_seed=seed)
        rows = load_records([str(tmp_path / f"s{seed}" / "heldout.parquet")], split="test")
        draws.add(tuple(r.extra_info["index"] for r in rows))
    assert len(draws) > 1


@pytest.mark.parametrize("count", [-1, 4, 9])
def test_a_holdout_that_leaves_no_train_row_is_refused(tmp_path, count):
    src = write_source(tmp_path / "src")
    with pytest.raises(PrepareError, match=rf"--holdout {count}: expected 1 to 3"):
        prepare("math", src, tmp_path / "out", holdout=count)
    assert not (tmp_path / "out").exists()


def test_jsonl_output_loads_as_the_same_records_as_parquet(tmp_path):
    src = write_source(tmp_path / "src")
    prepare_cli.main(["math", str(src), str(tmp_path / "pq")])
    prepare_cli.main(["math", str(src), str(tmp_path / "js"), "--format", "jsonl"])
    for split in ("train", "test"):
        parquet = load_records([str(tmp_path / "pq" / f"{split}.parquet")], split=split)
        jsonl = load_records([str(tmp_path / "js" / f"{split}.jsonl")], split=split)
        assert [(r.prompt, r.ground_truth, r.extra_info) for r in jsonl] == [
            (r.prompt, r.ground_truth, r.extra_info) for r in parquet
        ]


def test_levels_that_leave_a_split_empty_or_rows_without_levels_are_refused(tmp_path):
    src = write_source(tmp_path / "src")
    with pytest.raises(PrepareError, match=r"--levels \[3\]: no test row of 'math' is left"):
        prepare("math", src, tmp_path / "out", levels={3})
    assert not (tmp_path / "out").exists()  # nothing written
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    row = json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
    for split in ("train", "test"):
        (gsm8k / f"{split}.jsonl").write_text(row)
    with pytest.raises(PrepareError, match="the rows of 'gsm8k' carry no level"):
        prepare("gsm8k", gsm8k, tmp_path / "out", levels={1})


@pytest.mark.parametrize(
    ("train", "test", "message"),
    [
        ([{**TRAIN_ROWS[0], "difficulty": 2.5}], TEST_ROWS, "train.json: row 0: 'difficulty'"),
        ([{**TRAIN_ROWS[0], "difficulty": 6.0}], TEST_ROWS, "whole number in 0..5, got 6.0"),
        ([{**TRAIN_ROWS[0], "type": "Topology"}], TEST_ROWS, "'type' must be one of"),
        ([{**TRAIN_ROWS[0], "problem": " "}], TEST_ROWS, "'problem' must be a non-empty"),
        ([{**TRAIN_ROWS[0], "answer": 2}], TEST_ROWS, "'answer' must be a string or null"),
        (TRAIN_ROWS, [{**TEST_ROWS[0], "unique_id": "x.json"}], "test.json: row 0: 'unique_id'"),
        (TRAIN_ROWS, [["not", "an", "object"]], "test.json: row 0: expected an object"),
        (TRAIN_ROWS, [], "test.json: expected a non-empty JSON array"),
    ],
)
def test_a_malformed_row_names_file_and_row(tmp_path, train, test, message):
    src = write_source(tmp_path / "src", train, test)
    with pytest.raises(PrepareError, match=message.replace("(", r"\(").replace(".", r"\.")):
        prepare("math", src, tmp_path / "out")


def test_a_bad_source_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.json").write_text("{not json")
    for src, line in (
        (tmp_path / "nope", f"error: {tmp_path / 'nope'}: source folder not found"),
        (tmp_path / "src", f"error: {tmp_path / 'src' / 'train.json'}: cannot read a JSON array"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "recipe.tools.prepare", "math", str(src), str(tmp_path / "o")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert proc.returncode == 2
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(line)


def test_real_math_keeps_its_published_counts_per_level(tmp_path, caplog):
    if not REAL_MATH.is_dir():
        pytest.skip(f"no real MATH copy at {REAL_MATH} (RECIPE_SHARED_DATA)")
    with caplog.at_level(logging.WARNING):
        written = prepare("math", REAL_MATH, tmp_path)
    # The README's counts per level, less the two null and two empty answers (level 3: 2,
    # level 5: 2), with the two "Level ?" rows as level 0.
    expected = {
        "train": {0: 2, 1: 564, 2: 1345, 3: 1582, 4: 1681, 5: 2296},
        "test": {1: 43, 2: 90, 3: 105, 4: 128, 5: 134},
    }
    for split, per_level in expected.items():
        records = load_records([str(tmp_path / f"{split}.parquet")], split=split)
        assert written[tmp_path / f"{split}.parquet"] == len(records)
        assert dict(Counter(r.extra_info["level"] for r in records)) == per_level
        assert len({r.extra_info["subject"] for r in records}) == 7
    assert "2 rows skipped, their answer is null (rows 886, 1009)" in caplog.text
    assert "2 rows skipped, their answer is empty (rows 5328, 5330)" in caplog.text
    assert "kept as level 0 (rows 2764, 2823)" in caplog.text
