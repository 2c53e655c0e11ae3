"""The run's books balance when a wall budget stops it: every admitted prompt is trained,
skipped or in flight, in summary.json as in the ledger (the HF backend: a run in seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.checkpoint import read_ledger

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.nightly  # one more CLI run with engines
def test_a_one_step_off_run_stopped_by_its_wall_budget_counts_the_pending_batch(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "recipe", "mode=one_step_off", "rollout.backend=hf",
         "rollout.n=2", "rollout.response_length=8", "data.train_batch_size=4",
         "actor.ppo_mini_batch_size=4", "trainer.test_freq=0",
         "trainer.val_before_train=false", "trainer.max_wall_s=0.001", "trainer.save_freq=0",
         "logger.quiet=true", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 1
    # the next batch was generated before the stop: admitted, not trained, not lost
    assert summary["prompts/admitted"] == 8 and summary["prompts/in_flight"] == 4
    trained = [uid for record in read_ledger(run_dir) for uid in record["trained"]]
    assert summary["prompts/trained"] == len(trained) == 4
    assert summary["prompts/skipped"] == 0
