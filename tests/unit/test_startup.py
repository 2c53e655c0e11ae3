"""Start-up accounting: ``StartupTimes`` (recipe/run/startup.py), what ``TrainingRun`` records
of it (initial validation, first step, first push, ``startup/*`` in summary.json), and
``wait_started`` (recipe/workers/cluster.py) raising a failed role at once."""

from __future__ import annotations

import json
import time

import pytest
from omegaconf import OmegaConf

from recipe.config import load_config
from recipe.protocol import PromptRecord
from recipe.run.startup import StartupTimes
from recipe.run.training_run import TrainingRun

PROMPTS = [PromptRecord(f"train:p{i}", "1+1=", "2", "arithmetic") for i in range(8)]
TRAINED = {"actor/grad_norm": 1.0, "actor/optimizer_steps": 1.0, "actor/skipped_steps": 0.0}


def test_side_by_side_phases_count_once_and_the_rest_is_other():
    times = StartupTimes(process_start=1000.0)
    times.add("inputs_s", 2.0)
    times.add("ray_s", 3.0)
    times.add("trainer_init_s", 10.0)  # beside the engines: only the longer counts
    times.add("engines_s", 20.0)
    times.add("initial_val_s", 5.0)
    times.first_step(now=1040.0)
    times.add("first_push_s", 4.0)  # after the first step: not part of the total
    metrics = times.metrics()
    assert metrics["startup/to_first_step_s"] == 40.0
    assert times.accounted_s() == 2.0 + 3.0 + 20.0 + 5.0
    assert metrics["startup/other_s"] == pytest.approx(10.0)
    assert metrics["startup/engines_s"] == 20.0 and metrics["startup/first_push_s"] == 4.0


def test_the_first_step_is_marked_once_and_phases_add_up():
    times = StartupTimes(process_start=0.0)
    assert "startup/to_first_step_s" not in times.metrics()  # no step yet: no total
    times.first_step(now=7.0)
    times.first_step(now=9.0)
    with times.phase("ray_s"):
        time.sleep(0.01)
    times.add("ray_s", 1.0)
    assert times.metrics()["startup/to_first_step_s"] == 7.0
    assert 1.01 <= times.metrics()["startup/ray_s"] < 2.0
    with pytest.raises(ValueError, match="'ray'"):
        times.add("ray", 1.0)


def test_the_process_start_is_the_os_record_not_the_object_creation():
    assert StartupTimes().process_start < time.time() - 0.01  # this test process began earlier


def test_a_run_records_validation_first_step_and_first_push_into_its_summary(tmp_path):
    cfg = OmegaConf.create({"mode": "sync", "logger": {"backends": ["jsonl"]}})
    run = TrainingRun(load_config(cfg), tmp_path, train=PROMPTS, val=[])
    run.startup.add("engines_s", 1.5)

    def validate():
        time.sleep(0.02)
        return {"val/accuracy": 0.5}

    run.initial_validation(validate)
    marked = run.startup.first_step_at
    assert marked is not None and marked <= time.time()
    run.end_step(1, 0, dict(TRAINED), ["train:p0"], sources=[])  # no push in step 1
    run.end_step(2, 1, dict(TRAINED) | {"sync/total_s": 0.75}, ["train:p1"], sources=[])
    run.end_step(3, 2, dict(TRAINED) | {"sync/total_s": 9.0}, ["train:p2"], sources=[])
    run.finish(step=3, version=2, final_val={}, wall_s=1.0, extra={})
    run.close([])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["startup/first_push_s"] == 0.75  # the first push, not the last
    assert summary["startup/engines_s"] == 1.5
    assert summary["startup/initial_val_s"] >= 0.02
    assert summary["startup/to_first_step_s"] >= summary["startup/initial_val_s"] + 1.5
