"""Unit tests of ``python -m recipe.tools.prepare``: GSM8K's published files -> parquet rows
in verl's schema that our loader reads and the GSM8K scorer scores; bad input exits 2 with
one line and leaves no file behind."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from recipe.data.loaders import load_records
from recipe.reward import get_scorer
from recipe.tools.prepare import __main__ as prepare_cli
from recipe.tools.prepare import common, gsm8k
from tests.helpers.shared_data import shared_data

REPO = Path(__file__).resolve().parents[2]
REAL_GSM8K = shared_data("gsm8k")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

# Written for these tests (not GSM8K's rows), in GSM8K's published shape.
TRAIN_ROWS = [
    {
        "question": "A jar holds 3 red and 4 blue beads. How many beads are in the jar?",
        "answer": "3 + 4 = <<3+4=7>>7 beads.\n#### 7",
    },
    {
        "question": "A farm sells 250 eggs a day for 5 days. How many eggs is that?",
        "answer": "250 * 5 = <<250*5=1250>>1250 eggs.\n#### 1,250",
    },
]
TEST_ROWS = [
    {
        "question": "Tom had 10 pencils and lost 12. What is his balance?",
        "answer": "10 - 12 = <<10-12=-2>>-2\n#### -2",
    }
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", TRAIN_ROWS)
    write_jsonl(folder / "test.jsonl", TEST_ROWS)
    return folder


def run_cli(*args: str | Path) -> None:
    prepare_cli.main([str(a) for a in args])


def expected_row(source: dict[str, str], split: str, index: int, truth: str) -> dict[str, Any]:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{source['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": source["answer"],
            "question": source["question"],
        },
    }


def test_gsm8k_rows_are_verls_rows_and_the_counts_are_printed(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "nested"
    run_cli("gsm8k", src, out)
    assert capsys.readouterr().out.splitlines() == [
        f"wrote 2 rows to {out / 'train.parquet'}",
        f"wrote 1 rows to {out / 'test.parquet'}",
    ]
    assert pq.read_table(out / "train.parquet").to_pylist() == [
        expected_row(TRAIN_ROWS[0], "train", 0, "7"),
        expected_row(TRAIN_ROWS[1], "train", 1, "1250"),  # thousands comma removed
    ]
    assert pq.read_table(out / "test.parquet").to_pylist() == [
        expected_row(TEST_ROWS[0], "test", 0, "-2")
    ]
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]


def test_prepared_files_load_and_the_gsm8k_scorer_scores_them(src: Path, tmp_path: Path) -> None:
    run_cli("gsm8k", src, tmp_path / "out")
    files = [str(tmp_path / "out" / "train.parquet"), str(tmp_path / "out" / "test.parquet")]
    records = load_records(files, split="train")
    assert [r.uid for r in records] == [
        "train:train.parquet:0",
        "train:train.parquet:1",
        "train:test.parquet:0",
    ]
    assert [r.ground_truth for r in records] == ["7", "1250", "-2"]
    assert records[1].prompt[0]["content"].endswith(INSTRUCTION)
    score = get_scorer(records[1].data_source)
    r = records[1]
    assert score(r.data_source, "250 * 5 = 1250\n#### 1250", r.ground_truth, r.extra_info) == 1.0
    assert score(r.data_source, "250 * 5 = 1200\n#### 1200", r.ground_truth, r.extra_info) == 0.0
    assert score(r.data_source, "The answer is 1250.", r.ground_truth, r.extra_info) == 0.0


# Each damages the source (or the output path) and returns the OUT_DIR to pass.
@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("so 7\n#### 7", "7"),
        ("#### 1,250", "1250"),
        ("#### -2", "-2"),
        ("#### 3.5", "3.5"),
        ("#### 4\n#### 5", "4"),  # verl takes the first
        ("####7", None),  # verl's pattern needs the space
        ("#### .", None),  # verl would write "." as the ground truth
        ("7", None),
    ],
)
def test_final_answer_is_verls_number_after_the_marker(answer: str, truth: str | None) -> None:
    assert gsm8k.final_answer(answer) == truth


def _moved_src(folder: Path, tmp_path: Path) -> Path:
    folder.rename(tmp_path / "elsewhere")
    return tmp_path / "out"


def _no_test_file(folder: Path, tmp_path: Path) -> Path:
    (folder / "test.jsonl").unlink()
    return tmp_path / "out"


def _row_without_marker(folder: Path, tmp_path: Path) -> Path:
    write_jsonl(folder / "test.jsonl", [TEST_ROWS[0], {"question": "q?", "answer": "just 5"}])
    return tmp_path / "out"


def _out_is_a_file(folder: Path, tmp_path: Path) -> Path:
    (tmp_path / "out").write_text("not a folder")
    return tmp_path / "out"


def _as_given(folder: Path, tmp_path: Path) -> Path:
    return tmp_path / "out"


BAD_INPUTS = [
    ("gsm8k", _moved_src, "gsm8k: source folder not found"),
    ("gsm8k", _no_test_file, "test.jsonl: source file not found"),
    ("gsm8k", _row_without_marker, "test.jsonl: line 2: the answer has no '#### <number>' line"),
    ("gsm8k", _out_is_a_file, "out: the output folder is a file"),
    ("gsm9k", _as_given, "unknown dataset 'gsm9k'; known: gsm8k"),
]


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    BAD_INPUTS,
    ids=["no_src_dir", "no_test_file", "no_marker", "out_is_file", "unknown_name"],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    src: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    damage: Callable[[Path, Path], Path],
    message: str,
) -> None:
    out = damage(src, tmp_path)
    with pytest.raises(SystemExit) as info:
        run_cli(name, src, out)
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    # Every row is checked before the first write: not even train.parquet exists.
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    run_cli("gsm8k", src, out)
    old_bytes = (out / "train.parquet").read_bytes()

    def write_half_then_fail(table: Any, where: Any) -> None:
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("No space left on device")

    monkeypatch.setattr(pq, "write_table", write_half_then_fail)
    with pytest.raises(common.PrepareError, match=r"train.parquet: cannot write the file: No"):
        common.write_parquet_atomic([], out / "train.parquet", schema=None)
    assert (out / "train.parquet").read_bytes() == old_bytes
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]


def test_module_entry_point_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recipe.tools.prepare", "nope", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["error: unknown dataset 'nope'; known: gsm8k, math"]


def test_real_gsm8k_has_its_published_row_counts_and_numeric_answers(tmp_path: Path) -> None:
    if not REAL_GSM8K.is_dir():
        pytest.skip(f"no real GSM8K copy at {REAL_GSM8K} (RECIPE_SHARED_DATA)")
    run_cli("gsm8k", REAL_GSM8K, tmp_path)
    score = get_scorer("openai/gsm8k")
    for split, num_rows in (("train", 7473), ("test", 1319)):
        records = load_records([str(tmp_path / f"{split}.parquet")], split=split)
        assert len(records) == num_rows
        for r in records:
            Fraction(r.ground_truth)  # a plain number: raises otherwise
            # The published worked answer, as a response, scores 1 against the ground truth.
            assert score(r.data_source, r.extra_info["answer"], r.ground_truth) == 1.0, r.uid
