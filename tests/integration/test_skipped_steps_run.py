"""A diverging run stops on its own (nightly: one sync run of about a minute).

``actor.lr=1e8`` on the default model: Adam moves every weight by ~lr, the weights overflow
after a few steps, and every later step with a non-zero advantage has a NaN gradient norm.
Those steps are not applied, their prompts go to the ledger as skipped, the NaN norm is in
metrics.jsonl as ``"NaN"``, and ``actor.max_skipped_steps=2`` in a row end the run with one
line, exit code 1 and summary.json ``failed``. With the HF engine, whose sampler cannot draw
from non-finite probabilities, the run ends earlier, on the first batch sampled from the
overflowed weights, with one line that says the policy diverged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.checkpoint import read_ledger
from tests.helpers.runs import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.nightly]

REPO = Path(__file__).resolve().parents[2]


def _diverging_run(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recipe", "mode=sync", "actor.lr=1e8",
         "actor.max_skipped_steps=2", "rollout.total_rollout_steps=400",
         "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=4",
         "trainer.val_before_train=false", "trainer.test_freq=0", "logger.quiet=true",
         f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_a_diverging_run_skips_non_finite_steps_then_stops_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    done = _diverging_run(run_dir)
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "actor.max_skipped_steps=2: 2 trainer steps in a row" in errors[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    ledger = read_ledger(run_dir)
    skipped = [r for r in ledger if r.get("skipped")]
    assert len(skipped) >= 2 and all(r["trained"] == [] for r in skipped)
    assert ledger[-1]["skipped"] and ledger[-2]["skipped"]  # the two in a row that stopped it
    assert ledger[0]["trained"] and "skipped" not in ledger[0]  # the first step was applied
    by_step = {r["step"]: r for r in read_metrics(run_dir)}
    for record in skipped:
        metrics = by_step[record["step"]]
        assert metrics["actor/grad_norm"] == "NaN" and metrics["actor/skipped_steps"] == 1


def test_a_diverging_run_on_the_hf_engine_stops_with_one_line_naming_the_divergence(tmp_path):
    run_dir = tmp_path / "run"
    done = _diverging_run(run_dir, "rollout.backend=hf")
    assert done.returncode == 1, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1 and "non-finite next-token probabilities: training diverged" in (errors[0])
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "training diverged" in summary["error"]
