"""The study's design and harness with a scripted run in place of ``python -m recipe``: the
order (warm-ups, then blocks that alternate the modes), a design that cannot change once
registered, targets fixed once from the warm-up, phases that start only when they fit before
the deadline, a study that continues where it stopped, failures that count nothing, runs
trained in segments that each resume the last."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

from recipe.tools.study import harness as harness_module
from recipe.tools.study.__main__ import main
from recipe.tools.study.analysis import analyse, print_results
from recipe.tools.study.design import DesignError, RunSpec, StudyDesign, register, registered
from recipe.tools.study.estimates import segment_estimate_s
from recipe.tools.study.harness import EXIT_MORE, RECORD_FILE, DeviceMismatch, Harness
from recipe.tools.study.telemetry import device_name

# A run: accuracy rises by a mode's rate per 100 samples; fully_async runs twice as fast.
FAKE_RUN = """
import json, sys, time
from pathlib import Path
run, mode, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
time.sleep(0.3)
(run / "snapshots").mkdir(parents=True, exist_ok=True)
(run / "config.yaml").write_text("mode: " + mode)
speed = 2.0 if mode == "fully_async" else 1.0
lines = [json.dumps({"samples": 100 * k, "step": k, "version": k, "clock_s": 10.0 * k / speed,
         "export_s": 0.0, "file": f"s{k}", "num_bytes": 1, "sha256": "x"}) for k in (1, 2, 3, 4)]
(run / "snapshots" / "index.jsonl").write_text("\\n".join(lines) + "\\n")
metrics = [{"step": k, "timing/step_s": 10.0 / speed, "throughput/samples": 100}
           for k in range(1, 5)]
(run / "metrics.jsonl").write_text("\\n".join(json.dumps(m) for m in metrics) + "\\n")
summary = {"throughput/samples_per_s": 10.0 * speed, "samples/trained": 400}
(run / "summary.json").write_text(json.dumps(summary))
"""
FAKE_EVAL = """
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
if Path(sys.argv[2]).exists():
    sys.exit(1)
index = [json.loads(l) for l in (run / "snapshots" / "index.jsonl").read_text().splitlines()]
points = [{"samples": 0, "step": 0, "clock_s": 0.0, "accuracy": 0.1}]
points += [{"samples": s["samples"], "step": s["step"], "clock_s": s["clock_s"],
            "accuracy": 0.1 + 0.05 * s["step"]} for s in index]
with open(run / "snapshots" / "eval.jsonl", "w") as out:
    for p in points:
        p.update(num_prompts=10, response_length_mean=5.0, clip_ratio=0.0, eval_s=0.1)
        out.write(json.dumps(p) + "\\n")
"""
# A segmented run: a checkpoint of the steps done so far; trains up to the steps its
# trainer.max_wall_s allows (a step takes 0.5 s of training, fully_async's 0.25 s).
FAKE_SEGMENT = """
import json, sys
from pathlib import Path
run, mode = Path(sys.argv[1]), sys.argv[2]
args = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
assert args["trainer.save_freq"] == "1000000000"
total, budget = int(args["trainer.total_training_steps"]), float(args["trainer.max_wall_s"])
run.mkdir(parents=True, exist_ok=True)
ckpt = run / "ckpt.json"
start = json.loads(ckpt.read_text())["steps"] if ckpt.exists() else 0
speed = 2.0 if mode == "fully_async" else 1.0
steps = min(total, int(budget * speed / 0.5))
(run / "snapshots").mkdir(exist_ok=True)
lines = [json.dumps({"samples": 100 * k, "step": k, "version": k, "clock_s": 0.5 * k / speed,
         "export_s": 0.0, "file": f"s{k}", "num_bytes": 1, "sha256": "x"})
         for k in range(1, steps + 1)]
(run / "snapshots" / "index.jsonl").write_text("\\n".join(lines) + "\\n")
(run / "config.yaml").write_text("mode: " + mode)
(run / "metrics.jsonl").write_text(json.dumps({"step": steps}) + "\\n")
ckpt.write_text(json.dumps({"steps": steps}))
with open(run / "calls.txt", "a") as calls:
    calls.write(f"{start}->{steps} within {budget:g} s\\n")
summary = {"steps": steps, "samples/trained": 100 * steps, "throughput/samples_per_s": 1.0}
(run / "summary.json").write_text(json.dumps(summary))
"""

# An evaluation that scores its points one by one, a second each while SLOW exists, and
# resumes: the points already in eval.jsonl are not scored again.
FAKE_RESUMING_EVAL = """
import json, sys, time
from pathlib import Path
run, slow = Path(sys.argv[1]), Path(sys.argv[2])
index = [json.loads(l) for l in (run / "snapshots" / "index.jsonl").read_text().splitlines()]
todo = [{"samples": 0, "step": 0, "clock_s": 0.0}]
todo += [{k: s[k] for k in ("samples", "step", "clock_s")} for s in index]
path = run / "snapshots" / "eval.jsonl"
done = {json.loads(l)["samples"] for l in path.read_text().splitlines()} if path.exists() else set()
for p in todo:
    if p["samples"] in done:
        continue
    time.sleep(1.0 if slow.exists() else 0.0)
    p.update(accuracy=0.1 + 0.05 * p["step"], num_prompts=10, response_length_mean=5.0,
             clip_ratio=0.0, eval_s=0.1)
    with open(path, "a") as out:
        out.write(json.dumps(p) + "\\n")
"""


def _design(**changes: object) -> StudyDesign:
    fields = {
        "name": "fake",
        "question": "q",
        "modes": ["sync", "fully_async"],
        "seeds": [0, 1, 2, 3],
        "warmup_seed": 100,
        "snapshot_samples": 100,
        "overrides": ["rollout.n=2"],
        "target_rule": "warmup_gain",
        "target_values": [0.5],
        "budget_fractions": [0.5, 1.0],
        "bootstrap_resamples": 200,
    }
    return StudyDesign(**(fields | changes))  # type: ignore[arg-type]


def _harness(
    tmp_path: Path, design: StudyDesign | None = None, device: str = "1 x NVIDIA H200"
) -> Harness:
    records = tmp_path / "records"
    if not (records / "design.json").is_file():
        register(design or _design(), records)
    harness = Harness(
        registered(records),
        records,
        tmp_path / "out",
        "",
        archive=tmp_path / "a.tgz",
        device=device,
    )

    def train(spec: RunSpec, segment: int = 0) -> list[str]:
        run = harness.out / spec.tag
        return [sys.executable, "-c", FAKE_RUN, str(run), spec.mode, str(spec.seed)]

    harness.train_command = train  # type: ignore[method-assign]
    fail = str(tmp_path / "fail_eval")
    harness.eval_command = lambda run: [sys.executable, "-c", FAKE_EVAL, str(run), fail]  # type: ignore[method-assign]
    return harness


def test_warmups_come_first_then_blocks_alternate_the_order_of_the_modes():
    tags = [spec.tag for spec in _design().runs()]
    assert tags == [
        "warmup-sync-seed100", "warmup-fully_async-seed100",
        "sync-seed0", "fully_async-seed0", "fully_async-seed1", "sync-seed1",
        "sync-seed2", "fully_async-seed2", "fully_async-seed3", "sync-seed3",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"modes": ["fully_async"]}, "sync (the baseline)"),
        ({"seeds": [0, 100]}, "warmup_seed not among them"),
        ({"overrides": ["trainer.seed=3"]}, "set by the study per run"),
        ({"target_values": [1.2]}, "strictly between 0 and 1"),
        ({"modes": ["sync", "async"]}, "unknown ['async']"),
    ],
)
def test_a_design_that_cannot_run_is_refused_naming_why(changes, words):
    with pytest.raises(DesignError, match=None) as err:
        _design(**changes)
    assert words in str(err.value)


def test_a_registered_design_cannot_change(tmp_path):
    register(_design(), tmp_path)
    register(_design(), tmp_path)  # the same again: nothing to do
    with pytest.raises(DesignError, match="another 'seeds'"):
        register(_design(seeds=[0, 1]), tmp_path)


def test_a_study_runs_in_order_fixes_targets_once_and_keeps_every_record(tmp_path, capsys):
    harness = _harness(tmp_path)
    assert harness.run_all(deadline_s=600) == 0
    records = tmp_path / "records"
    kept = sorted(p.parent.name for p in records.glob(f"runs/*/{RECORD_FILE}"))
    assert len(kept) == 10
    targets = json.loads((records / "targets.json").read_text())
    # warm-up sync: 0.1 -> 0.3; half its gain; budgets from its clock (40 s)
    assert targets["accuracies"] == [0.2] and targets["budgets_s"] == [20.0, 40.0]
    record = json.loads((records / "runs" / "fully_async-seed1" / RECORD_FILE).read_text())
    assert record["order"] == 4 and record["gpu"] == {"gpus": 0}
    assert record["gpu_memory_mib"] == {}  # no nvidia-smi here: nothing sampled, nothing guessed
    assert record["design_sha256"] == harness.design.sha256
    assert len(record["code_sha256"]) == 64 and "code_changed" in record
    res = analyse(records)
    print_results(res)
    printed = capsys.readouterr().out
    assert "fully_async / sync, time to 0.200: 0.50x" in printed
    assert "fully_async - sync, accuracy at 20 s of training clock: +" in printed
    assert "fully_async - sync, final accuracy: " in printed
    ratio = res["ratios"]["fully_async"]["targets"][0]["median_ratio"]
    assert ratio["estimate"] == pytest.approx(0.5) and ratio["high"] <= 0.5 + 1e-9
    assert res["modes"]["fully_async"]["steady_samples_per_s"] == pytest.approx(20.0)
    assert (records / "accuracy.png").is_file()
    with tarfile.open(tmp_path / "a.tgz") as tar:
        assert any(name.endswith("sync-seed3/record.json") for name in tar.getnames())


def test_a_phase_that_does_not_fit_stops_the_study_and_the_next_call_continues(tmp_path, capsys):
    harness = _harness(tmp_path, _design(run_timeout_s=1.0, eval_timeout_s=1.0))
    assert harness.run_all(deadline_s=0.5) == EXIT_MORE  # no training fits: none starts
    assert not list((tmp_path / "records").glob("runs/*"))
    assert "10 runs remain (about 20 s): call again" in capsys.readouterr().out
    assert harness.run_all(deadline_s=2.0) == EXIT_MORE  # each run takes over 0.3 s
    done = [spec for spec in harness.design.runs() if harness.done(spec)]
    assert 1 <= len(done) < 10 and done == harness.design.runs()[: len(done)]
    assert harness.run_all(deadline_s=600) == 0


def test_on_a_volatile_machine_a_run_starts_only_when_its_evaluation_fits_too(tmp_path, capsys):
    design = _design(run_timeout_s=1.0, eval_timeout_s=30.0)
    kept = _harness(tmp_path / "kept", design)
    assert kept.run_all(deadline_s=5.0) == EXIT_MORE  # trains; the evaluation does not fit
    first = kept.design.runs()[0]
    assert (kept.out / first.tag / "trained.json").is_file() and not kept.done(first)
    volatile = _harness(tmp_path / "volatile", design)
    volatile.volatile = True
    capsys.readouterr()
    assert volatile.run_all(deadline_s=5.0) == EXIT_MORE  # 1 + 30 s do not fit: none starts
    assert not (volatile.out / first.tag).exists()
    assert "training and evaluation may take 31 s" in capsys.readouterr().out
    assert volatile.run_all(deadline_s=600) == 0


def test_the_archive_after_the_warmup_holds_the_targets_it_fixed(tmp_path):
    harness = _harness(tmp_path, _design(run_timeout_s=1.0, eval_timeout_s=1.0))
    run_one = harness.run_one
    harness.run_one = lambda spec, end: (  # type: ignore[method-assign]
        harness_module.OUT_OF_TIME if spec.mode == "fully_async" else run_one(spec, end)
    )
    assert harness.run_all(deadline_s=600) == EXIT_MORE  # only the sync warm-up ran
    with tarfile.open(tmp_path / "a.tgz") as tar:
        names = tar.getnames()
    assert any(name.endswith("warmup-sync-seed100/record.json") for name in names)
    assert any(name.endswith("records/targets.json") for name in names)


def test_a_study_continued_on_other_cards_stops_before_any_run(tmp_path):
    harness = _harness(tmp_path, _design(run_timeout_s=1.0, eval_timeout_s=1.0))
    assert harness.run_all(deadline_s=2.0) == EXIT_MORE  # a run or two, on the H200
    kept = sorted((tmp_path / "records").glob(f"runs/*/{RECORD_FILE}"))
    assert kept and {json.loads(p.read_text())["device"] for p in kept} == {"1 x NVIDIA H200"}
    other = _harness(tmp_path, device="1 x NVIDIA H100 80GB HBM3")
    with pytest.raises(DeviceMismatch, match=r"ran on 1 x NVIDIA H200 .* has 1 x NVIDIA H100"):
        other.run_all(deadline_s=600)
    assert sorted((tmp_path / "records").glob(f"runs/*/{RECORD_FILE}")) == kept
    assert _harness(tmp_path).run_all(deadline_s=600) == 0  # back on the H200: it continues


def test_the_cards_are_named_by_nvidia_smi_and_counted(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\necho 'NVIDIA H200'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert device_name() == "2 x NVIDIA H200"
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert device_name() == "cpu"
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert device_name() == "cpu"


def test_a_failed_evaluation_counts_nothing_and_a_cut_off_run_starts_again(tmp_path):
    harness = _harness(tmp_path)
    first = harness.design.runs()[0]
    run_dir = harness.out / first.tag
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("cut off")  # a run killed before its summary
    (run_dir / "stale").write_text("from the cut-off run")
    (tmp_path / "fail_eval").write_text("")
    assert harness.run_all(deadline_s=600) == 1
    assert not harness.done(first) and not (run_dir / "stale").exists()
    assert (run_dir / "summary.json").is_file()  # trained again, from its start
    (tmp_path / "fail_eval").unlink()
    trained = (run_dir / "trained.json").read_text()
    assert harness.run_all(deadline_s=600) == 0
    assert (run_dir / "trained.json").read_text() == trained  # evaluated, not trained again


def test_the_command_line_refuses_bad_input_with_exit_code_2(tmp_path, capsys):
    assert main(["run", "records=" + str(tmp_path / "none")]) == 2
    assert "no design registered" in capsys.readouterr().err
    assert main(["register", str(tmp_path / "missing.yaml"), "records=x"]) == 2
    assert main(["table", "wrong=1"]) == 2
    records = tmp_path / "records"
    register(_design(), records)
    assert main(["run", f"records={records}", "volatile=yes"]) == 2
    assert "volatile=yes: true or false" in capsys.readouterr().err


def test_no_targets_are_fixed_from_a_warmup_whose_gain_is_within_the_noise(tmp_path):
    harness = _harness(tmp_path, _design(min_warmup_gain=0.5))  # the fake gains 0.2
    with pytest.raises(DesignError, match=r"min_warmup_gain=0\.5"):
        harness.run_all(deadline_s=600)
    assert not (tmp_path / "records" / "targets.json").exists()
    # Stopped right after the warm-up sync run: no GPU time spent on the other warm-up.
    kept = [p.parent.name for p in (tmp_path / "records").glob(f"runs/*/{RECORD_FILE}")]
    assert kept == ["warmup-sync-seed100"]


def test_on_n_gpus_sync_colocates_on_all_and_fully_async_splits_them():
    one = _design()
    assert one.gpu_overrides("sync") == one.gpu_overrides("fully_async") == []
    eight = _design(gpus=8)
    assert eight.gpu_overrides("sync") == ["actor.n_gpus_per_node=8", "rollout.n_gpus_per_node=8"]
    assert eight.gpu_overrides("fully_async") == [
        "actor.n_gpus_per_node=4",
        "rollout.n_gpus_per_node=4",
    ]
    spec = RunSpec("fully_async", 0, False, 2)
    assert "rollout.n_gpus_per_node=2" in _design(gpus=8, async_trainer_gpus=6).run_overrides(
        spec, ""
    )
    with pytest.raises(DesignError, match="async_trainer_gpus"):
        _design(gpus=2, async_trainer_gpus=2)


def _segmented(tmp_path: Path) -> Harness:
    design = _design(
        segment_s=1.0,
        run_timeout_s=30.0,
        overrides=["rollout.n=2", "trainer.total_training_steps=4"],
    )
    harness = _harness(tmp_path, design)

    def train(spec: RunSpec, segment: int = 0) -> list[str]:
        real = Harness.train_command(harness, spec, segment)[3:]  # after python -m recipe
        run = str(harness.out / spec.tag)
        return [sys.executable, "-c", FAKE_SEGMENT, run, spec.mode, *real]

    harness.train_command = train  # type: ignore[method-assign]
    return harness


def test_a_run_longer_than_a_segment_trains_in_segments_each_resuming_the_last(tmp_path):
    harness = _segmented(tmp_path)
    one_train = iter([True, False])  # this call has room for one training process
    harness.fits = lambda phase, spec, end, **_: next(one_train) if phase == "train" else True  # type: ignore[method-assign]
    assert harness.run_all(deadline_s=600) == EXIT_MORE
    sync_dir = harness.out / "warmup-sync-seed100"
    trained = json.loads((sync_dir / "trained.json").read_text())
    assert trained["complete"] is False and len(trained["segments_s"]) == 1
    assert (sync_dir / "summary-1.json").is_file() and not (sync_dir / "summary.json").exists()
    del harness.fits  # the next call: room for everything
    assert harness.run_all(deadline_s=600) == 0
    # sync trains 2 steps a segment: two processes, the second resuming the first's 2 steps
    calls = (sync_dir / "calls.txt").read_text().splitlines()
    assert calls == ["0->2 within 1 s", "2->4 within 2 s"]
    record = json.loads((tmp_path / "records/runs/warmup-sync-seed100" / RECORD_FILE).read_text())
    assert record["segments"] == 2 and record["resumed"] is True
    assert record["seconds"]["train"] >= record["seconds"]["train_process_max"] > 0
    # fully_async trains its 4 steps within the first segment: one process
    async_dir = harness.out / "fully_async-seed0"
    assert (async_dir / "calls.txt").read_text().splitlines() == ["0->4 within 1 s"]
    record = json.loads((tmp_path / "records/runs/fully_async-seed0" / RECORD_FILE).read_text())
    assert record["segments"] == 1 and record["resumed"] is False


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"segment_s": 600.0}, "between 0 and run_timeout_s=540.0"),
        ({"segment_s": 300.0}, "set trainer.total_training_steps"),
        (
            {"segment_s": 300.0, "overrides": ["trainer.total_training_steps=4",
                                               "trainer.save_freq=2"]},
            "['trainer.save_freq'] are set by the study per segment",
        ),
    ],
)  # fmt: skip
def test_a_segmented_design_that_cannot_resume_its_runs_is_refused(changes, words):
    with pytest.raises(DesignError) as err:
        _design(**changes)
    assert words in str(err.value)


def test_designs_registered_before_segments_keep_their_file():
    assert "segment_s" not in _design().to_json()
    assert _design(segment_s=1.0, run_timeout_s=2.0, overrides=[
        "trainer.total_training_steps=3"]).to_json()["segment_s"] == 1.0  # fmt: skip


def test_the_next_segment_is_estimated_from_the_last_ones_speed(tmp_path):
    # as on one H100: 28 of 32 steps in a first segment of 526 s, 100 s of it start-up
    (tmp_path / "summary-1.json").write_text(
        json.dumps({"steps": 28, "startup/to_first_step_s": 100.0})
    )
    first = {"segments_s": [526.0]}
    assert segment_estimate_s(tmp_path, first, 32) == pytest.approx(1.1 * (100 + 4 * 426 / 28))
    # far from its end, the next segment runs as long as the last one
    assert segment_estimate_s(tmp_path, first, 100) == pytest.approx(1.1 * 526)
    # a third segment: from the second's own steps and seconds
    (tmp_path / "summary-2.json").write_text(
        json.dumps({"steps": 40, "startup/to_first_step_s": 90.0})
    )
    second = {"segments_s": [526.0, 300.0]}
    assert segment_estimate_s(tmp_path, second, 44) == pytest.approx(1.1 * (90 + 4 * 210 / 12))
    # nothing measured yet, or records that do not say how far it got: the mode's estimate
    assert segment_estimate_s(tmp_path, {"segments_s": []}, 32) is None
    assert segment_estimate_s(tmp_path / "gone", first, 32) is None


def test_a_last_short_segment_starts_where_the_designs_limit_would_not_fit(tmp_path):
    harness = _segmented(tmp_path)  # run_timeout_s=30: a fresh run needs 30 s
    one_train = iter([True, False])
    harness.fits = lambda phase, spec, end, **_: next(one_train) if phase == "train" else True  # type: ignore[method-assign]
    assert harness.run_all(deadline_s=600) == EXIT_MORE  # the first segment only
    del harness.fits
    sync_dir = harness.out / "warmup-sync-seed100"
    assert harness.run_all(deadline_s=5.0) == EXIT_MORE  # its second segment, not a new run
    trained = json.loads((sync_dir / "trained.json").read_text())
    assert trained["complete"] is True and len(trained["segments_s"]) == 2
    assert not (harness.out / "warmup-fully_async-seed100").exists()


def test_an_evaluation_cut_at_the_deadline_keeps_its_points_and_the_next_call_goes_on(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(harness_module, "EVAL_MIN_S", 0.5)
    harness = _harness(tmp_path, _design(run_timeout_s=1.0, eval_timeout_s=30.0))
    slow = tmp_path / "slow"
    slow.write_text("")
    harness.eval_command = lambda run: [
        sys.executable,
        "-c",
        FAKE_RESUMING_EVAL,
        str(run),
        str(slow),
    ]  # type: ignore[method-assign]
    assert harness.run_all(deadline_s=4.0) == EXIT_MORE
    first = harness.design.runs()[0]
    run_dir = harness.out / first.tag
    scored = (run_dir / "snapshots" / "eval.jsonl").read_text().splitlines()
    assert 1 <= len(scored) < 5 and not harness.done(first)
    assert "evaluating for those" in capsys.readouterr().out
    slow.unlink()
    assert harness.run_all(deadline_s=600) == 0
    kept = (harness.record_dir(first) / "eval.jsonl").read_text().splitlines()
    assert kept[: len(scored)] == scored and len(kept) == 5  # scored once each, in order
    record = json.loads((harness.record_dir(first) / RECORD_FILE).read_text())
    calls_s = json.loads((run_dir / "evaluated.json").read_text())
    assert len(calls_s) == 2 and record["seconds"]["eval"] == pytest.approx(sum(calls_s))
