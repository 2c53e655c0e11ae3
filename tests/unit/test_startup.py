"""Start-up accounting: ``StartupTimes`` (recipe/run/startup.py), what ``TrainingRun`` records
of it (initial validation, first step, first push, ``startup/*`` in summary.json), and
``wait_started`` (recipe/workers/cluster.py) raising a failed role at once, and the input
checks (model, agents, prompts) run beside Ray's start (``run_beside``)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from omegaconf import OmegaConf

from recipe.config import load_config
from recipe.data.loaders import DataError
from recipe.model import ModelPathError
from recipe.protocol import PromptRecord
from recipe.run import inputs as inputs_module
from recipe.run.inputs import RunInputs, run_beside
from recipe.run.startup import StartupTimes, engine_log_phases, engine_phases
from recipe.run.training_run import TrainingRun
from recipe.workers.rollout.engine_log import write_start_line

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


# vLLM's own lines (vllm/v1/worker/gpu_model_runner.py, compilation/monitor.py,
# v1/engine/core.py), as an engine log holds them with VLLM_LOGGING_LEVEL=INFO.
ENGINE_LOG = """\
(EngineCore pid=1) INFO 12-05 05:00:01 [default_loader.py:291] Loading weights took 0.41 seconds
(EngineCore pid=1) INFO 12-05 05:00:01 [gpu_model_runner.py:5150] Model loading took 0.93 GiB \
memory and 1.250000 seconds
(EngineCore pid=1) INFO 12-05 05:00:09 [monitor.py:34] torch.compile took 7.62 s in total
(EngineCore pid=1) INFO 12-05 05:00:14 [gpu_model_runner.py:6582] Graph capturing finished in \
5 secs, took 0.41 GiB
(EngineCore pid=1) INFO 12-05 05:00:14 [core.py:403] init engine (profile, create kv cache, \
warmup model) took 13.10 s (compilation: 7.62 s)
"""


def test_engine_load_compile_and_graph_capture_are_read_off_each_engine_log(tmp_path):
    (tmp_path / "replica_0.log").write_text(ENGINE_LOG)
    slower = ENGINE_LOG.replace("took 7.62 s in total", "takes 9.50 s in total")  # older vLLM
    (tmp_path / "replica_1.log").write_text(slower)
    phases = engine_log_phases([tmp_path / "replica_0.log", tmp_path / "replica_1.log"])
    assert phases == {
        "engine_load_s": 1.25,
        "engine_compile_s": 9.5,  # the slower engine
        "engine_graph_capture_s": 5.0,
        "engine_init_s": 13.1,
    }
    assert engine_log_phases([tmp_path / "missing.log"]) == {}
    # WARNING-level logs (the default) hold none of them: nothing is made up.
    assert engine_phases(["WARNING ... Enforce eager set, disabling torch.compile"]) == {}


def test_the_workers_own_start_line_splits_engines_s_into_process_import_and_build(tmp_path):
    # The seconds no vLLM line accounts for: Ray's start of the worker, imports, spawns.
    for replica, build_s in ((0, 20.25), (1, 31.0)):
        path = tmp_path / f"replica_{replica}.log"
        path.write_text(ENGINE_LOG)
        write_start_line(path, process_s=9.84, import_s=5.06, build_s=build_s)
    phases = engine_log_phases(sorted(tmp_path.glob("*.log")))
    assert phases["engine_process_s"] == 9.8 and phases["engine_import_s"] == 5.1
    assert phases["engine_build_s"] == 31.0  # the slower engine
    assert phases["engine_load_s"] == 1.25  # vLLM's own lines still read
    write_start_line(None, 1.0, 2.0, 3.0)  # no log file: nothing written, nothing raised
    write_start_line(tmp_path / "gone" / "replica_9.log", 1.0, 2.0, 3.0)  # unwritable: logged


def test_the_engines_own_split_is_part_of_engines_s_not_added_to_it():
    times = StartupTimes(process_start=0.0)
    times.add("engines_s", 20.0)
    times.add("engine_compile_s", 8.0)
    times.add("engine_graph_capture_s", 5.0)
    times.add("engine_build_s", 18.0)
    times.first_step(now=25.0)
    assert times.accounted_s() == 20.0 and times.metrics()["startup/other_s"] == 5.0


def test_a_phase_run_inside_another_is_reported_but_not_counted_twice():
    times = StartupTimes(process_start=0.0)
    times.add("inputs_s", 9.0)
    times.add_within("ray_s", 6.0)  # fully_async: Ray starts inside the input checks
    times.add("engines_s", 50.0)
    times.first_step(now=65.0)
    metrics = times.metrics()
    assert metrics["startup/ray_s"] == 6.0
    assert times.accounted_s() == 59.0 and metrics["startup/other_s"] == pytest.approx(6.0)


def test_work_beside_runs_in_another_thread_at_the_same_time():
    started = threading.Event()
    threads = {}

    def work() -> str:
        threads["work"] = threading.get_ident()
        started.set()
        return "ids"

    def beside() -> None:
        threads["beside"] = threading.get_ident()
        assert started.wait(timeout=10), "the work did not run while beside() ran"

    assert run_beside(work, beside) == "ids"
    assert threads["beside"] == threading.get_ident() != threads["work"]
    assert run_beside(work, None) == "ids"


def test_both_sides_end_before_an_error_and_the_works_error_wins():
    ended = []

    def failing_work() -> None:
        time.sleep(0.2)
        ended.append("work")
        raise DataError("prompt u has 9 tokens > data.max_prompt_length=2")

    def beside() -> None:
        ended.append("beside")

    with pytest.raises(DataError, match="max_prompt_length=2"):
        run_beside(failing_work, beside)
    assert sorted(ended) == ["beside", "work"]

    def failing_beside() -> None:
        raise RuntimeError("ray did not start")

    ended.clear()
    with pytest.raises(DataError):  # both failed: the input's error is the one to show
        run_beside(failing_work, failing_beside)
    assert ended == ["work"]
    with pytest.raises(RuntimeError, match="ray did not start"):
        run_beside(lambda: "ids", failing_beside)


def test_the_model_and_prompts_are_checked_while_ray_starts(monkeypatch):
    """RunInputs.load runs ``beside`` (the fully async driver's Ray start) while the model's
    config and tokenizer are read, the slowest check, not after them."""
    starting = threading.Event()
    original = inputs_module.HFModelConfig.from_config
    seen = []

    def reading(cfg):
        seen.append(starting.wait(timeout=5))
        return original(cfg)

    monkeypatch.setattr(inputs_module.HFModelConfig, "from_config", reading)
    loaded = RunInputs.load(load_config({}), beside=starting.set)
    assert seen == [True], "the model was read before beside() ran, not beside it"
    assert loaded.model is not None and len(loaded.prompt_ids) > 0


def test_a_bad_model_fails_the_load_after_beside_ended(monkeypatch):
    def bad_model(cfg):
        raise ModelPathError("model.path='nowhere': no such directory")

    monkeypatch.setattr(inputs_module.HFModelConfig, "from_config", bad_model)
    ended = []
    with pytest.raises(ModelPathError, match="nowhere"):
        RunInputs.load(load_config({}), beside=lambda: ended.append("beside"))
    assert ended == ["beside"]
