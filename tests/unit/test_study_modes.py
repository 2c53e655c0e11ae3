"""The modes study's records and table (``recipe.tools.study.accuracy``), on run directories written
here: validation points land at the samples and seconds of the version they measured, blocking
validations are taken out of the clock, and the time to sync's final accuracy is a ratio to
sync's own (the runs themselves are real: ``python -m recipe.tools.study.modes``)."""

from __future__ import annotations

import json
import math

import pytest

from recipe.tools.study.accuracy import RunRecord, read_run, table
from recipe.tools.study.modes import main, parse


def _write_run(path, mode, steps, *, step_s, val_s, versions_per_step, vals):
    """``vals``: {version: accuracy}; each step trains 10 samples and takes ``step_s``."""
    path.mkdir(parents=True)
    records = [{"step": 0, "param_version": 0, "val/accuracy": vals[0], "timing/val_s": val_s,
                "val/num_prompts": 100.0}]  # fmt: skip
    for step in range(1, steps + 1):
        version = int(step * versions_per_step)
        record = {"step": step, "param_version": version, "throughput/samples": 10.0,
                  "timing/step_s": step_s, "reward/mean": step / 10}  # fmt: skip
        if version in vals and version and (mode == "sync" or step == steps):
            record |= {"val/accuracy": vals[version], "timing/val_s": val_s}
            if mode == "fully_async":
                record["val/param_version"] = float(version)
        records.append(record)
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    final = vals[max(vals)]
    summary = {"mode": mode, "steps": steps, "param_version": int(steps * versions_per_step),
               "final/val_accuracy": final, "wall_s": steps * step_s,
               "throughput/samples_per_s": 10.0 / step_s}  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_the_clock_leaves_out_blocking_validations_and_samples_follow_versions(tmp_path):
    sync = read_run(
        _write_run(
            tmp_path / "s",
            "sync",
            4,
            step_s=1.0,
            val_s=0.5,
            versions_per_step=1,
            vals={0: 0.1, 2: 0.3, 4: 0.5},
        ),
        seed=0,
    )
    # No trace: a step ends at the sum of step times; every validation up to it (0.5 s each,
    # the initial one included) is taken out: step 2 at 2.0 - 1.0 s, step 4 at 4.0 - 1.5 s.
    assert [(p.version, p.samples, p.train_s, p.accuracy) for p in sync.curve] == [
        (0, 0, 0.0, 0.1), (2, 20, 1.0, 0.3), (4, 40, 2.5, 0.5)
    ]  # fmt: skip
    assert sync.val_prompts == 100 and sync.samples == 40
    assert [(p.step, p.samples, p.reward) for p in sync.train] == [
        (1, 10, 0.1), (2, 20, 0.2), (3, 30, 0.3), (4, 40, 0.4)
    ]  # fmt: skip
    assert RunRecord.from_json(sync.to_json()) == sync
    older = sync.to_json()
    del older["train"]  # records written before the training reward was kept
    assert RunRecord.from_json(older).train == []


def test_the_table_gives_each_mode_its_time_to_syncs_final_accuracy(tmp_path):
    sync = read_run(
        _write_run(
            tmp_path / "s",
            "sync",
            4,
            step_s=1.0,
            val_s=0.0,
            versions_per_step=1,
            vals={0: 0.1, 2: 0.5, 4: 0.5},
        ),
        seed=0,
    )
    fast = read_run(
        _write_run(
            tmp_path / "f",
            "fully_async",
            4,
            step_s=0.5,
            val_s=0.0,
            versions_per_step=0.5,
            vals={0: 0.1, 2: 0.6},
        ),
        seed=0,
    )
    slow = read_run(
        _write_run(
            tmp_path / "o",
            "one_step_off",
            4,
            step_s=0.5,
            val_s=0.0,
            versions_per_step=1,
            vals={0: 0.1, 4: 0.4},
        ),
        seed=0,
    )
    rows = {r["mode"]: r for r in table([fast, slow, sync])}
    assert rows["sync"]["time_to_target_s"] == 2.0 and rows["sync"]["time_ratio"] == 1.0
    assert rows["fully_async"]["time_to_target_s"] == 2.0  # version 2 exists after step 4
    assert rows["one_step_off"]["time_to_target_s"] is None  # never reached 0.5
    # one seed: the binomial error of a 100-prompt validation set
    assert rows["sync"]["final_accuracy_se"] == pytest.approx(math.sqrt(0.25 / 100), abs=1e-4)


def test_seeds_are_averaged_per_version_so_sync_always_reaches_its_own_mean(tmp_path):
    def run(name, mode, vals, *, step_s=1.0, versions_per_step=1.0):
        path = _write_run(tmp_path / name, mode, 4, step_s=step_s, val_s=0.0,
                          versions_per_step=versions_per_step, vals=vals)  # fmt: skip
        return read_run(path, seed=0)

    # Sync's seeds end at 0.5 and 0.4: the one ending at 0.4 never reaches their mean 0.45,
    # their averaged curve (0.1, 0.35, 0.45) does, at version 4 (4 steps of 1 s).
    syncs = [
        run("s0", "sync", {0: 0.1, 2: 0.3, 4: 0.5}),
        run("s1", "sync", {0: 0.1, 2: 0.4, 4: 0.4}),
    ]
    # fully_async's seeds average 0.45 at version 2 (0.6 and 0.3): 4 steps of 0.5 s.
    fast = [run(f"f{i}", "fully_async", {0: 0.1, 2: acc}, step_s=0.5, versions_per_step=0.5)
            for i, acc in enumerate((0.6, 0.3))]  # fmt: skip
    rows = {r["mode"]: r for r in table(syncs + fast)}
    assert rows["sync"]["target"] == 0.45 and rows["sync"]["time_to_target_s"] == 4.0
    assert rows["fully_async"]["time_to_target_s"] == 2.0
    assert rows["fully_async"]["time_ratio"] == 0.5
    assert rows["sync"]["final_accuracy_se"] == pytest.approx(0.05)  # between seeds


def test_the_study_needs_sync_and_keeps_its_own_keys(capsys):
    for argv, message in ((["modes=fully_async"], "must include sync"),
                          (["trainer.seed=3"], "set by the study")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            parse(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    study, _ = parse(["modes=fully_async,sync", "seeds=0,1", "actor.lr=1e-5"])
    assert study.modes == ("sync", "fully_async") and "actor.lr=1e-5" in study.command("sync", 1)


def test_records_trained_with_other_overrides_are_never_mixed_in(tmp_path, capsys):
    records = tmp_path / "records"
    records.mkdir()
    kept = ["data.train_files=[/a/train.jsonl]", "actor.lr=3e-5", "actor.lora.rank=32"]
    (records / "results.json").write_text(json.dumps({"overrides": kept, "rows": []}))
    base = [f"records={records}", f"out={tmp_path / 'out'}", "table_only=true"]
    # Another learning rate: refused before any run, the key named with both values.
    with pytest.raises(SystemExit) as exit_info:
        main([*base, "data.train_files=[/a/train.jsonl]", "actor.lr=1e-4", "actor.lora.rank=32"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "actor.lr 3e-5 there, 1e-4 here" in err and "rank" not in err
    # A key set on one side only is a difference too.
    with pytest.raises(SystemExit):
        main([*base, "data.train_files=[/a/train.jsonl]", "actor.lr=3e-5"])
    assert "actor.lora.rank 32 there, (unset) here" in capsys.readouterr().err
    # Only where this machine keeps the data differs: the study goes on (no sync record yet).
    assert main([*base, "data.train_files=[/b/train.jsonl]", "actor.lora.rank=32",
                 "actor.lr=3e-5"]) == 1  # fmt: skip
    assert "no finished sync run" in capsys.readouterr().out
