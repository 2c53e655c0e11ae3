"""``python -m recipe.tools.study.judge_agreement`` end to end on vLLM-CPU: responses made by
``python -m recipe.tools.study.lengths`` (the tiny model, the run's rollout worker, the rule
reward) judged by the tiny model as judge on the run's rollout worker class in the tool's own
process. The tiny model answers with numbers and is no grader, so this checks the mechanics:
every sampled response judged (a score or an error, never a silent 0), the figures'
fields, the engine's log, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.nightly]

REPO = Path(__file__).resolve().parents[2]
PROMPTS, N = 8, 2
FIGURES = (
    "n",
    "num_sampled",
    "num_errors",
    "agreement",
    "agreement_ci95",
    "kappa",
    "kappa_ci95",
    "auc",
    "auc_ci95",
    "confusion",
    "judge_mean_score_rule_correct",
    "judge_mean_score_rule_wrong",
    "judge_mean_score_gap",
    "errors",
    "judge_metrics",
)


def _tool(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECIPE_DEBUG": "0"}
    command = [sys.executable, "-m", f"recipe.tools.study.{module}", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_the_tiny_judge_scores_every_sampled_response_of_a_lengths_run(tmp_path, tiny_model_path):
    run = [f"model.path={tiny_model_path}", "data.num_train_prompts=32", "data.num_val_prompts=8"]
    made = tmp_path / "lengths"
    proc = _tool("lengths", *run, f"prompts={PROMPTS}", f"rollout.n={N}", f"out={made}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    responses = [json.loads(line) for line in (made / "responses.jsonl").read_text().splitlines()]
    assert len(responses) == PROMPTS * N

    out = tmp_path / "agreement"
    proc = _tool(
        "judge_agreement",
        f"responses={made / 'responses.jsonl'}",
        f"out={out}",
        "samples=200",  # more than the 16 responses: all of them
        "seed=0",
        "threshold=0.5",
        *run,
        f"reward.judge.model={tiny_model_path}",
        "reward.judge.score_max=1000",
        "reward.judge.max_tokens=8",
        "reward.judge.max_model_len=1024",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "agreement.json").read_text())
    judged = [json.loads(line) for line in (out / "judged.jsonl").read_text().splitlines()]
    assert (out / "engine.log").is_file()

    assert [k for k in FIGURES if k not in report] == []
    assert report["num_sampled"] == len(judged) == PROMPTS * N
    made_keys = {(r["prompt_uid"], r["sample_index"]): r["reward"] for r in responses}
    assert {(j["uid"], j["sample_index"]): j["rule_reward"] for j in judged} == made_keys
    for row in judged:  # a score in [0, 1] or the judge's error, never both, never neither
        assert (row["score"] is None) == (row["error"] is not None), row
        assert row["score"] is None or 0.0 <= row["score"] <= 1.0
    errors = [j for j in judged if j["score"] is None]
    assert report["num_errors"] == len(errors) == len(report["errors"])
    assert report["n"] == PROMPTS * N - len(errors) >= 1
    confusion = report["confusion"]
    assert sum(sum(row.values()) for row in confusion.values()) == report["n"]
    low, high = report["agreement_ci95"]
    assert low <= report["agreement"] <= high
    metrics = report["judge_metrics"]
    assert metrics["judge/calls"] >= PROMPTS * N
    assert 0 < metrics["judge/latency_p50_s"] <= metrics["judge/latency_p99_s"]
    assert report["judge"]["model"] == str(tiny_model_path) and report["threshold"] == 0.5
    assert f"judged {report['n']} of {PROMPTS * N}" in proc.stdout
