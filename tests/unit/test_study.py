"""The staleness study's grid, commands and aggregation, on run directories written here (the
runs themselves are real ``python -m recipe`` runs: ``python -m recipe.tools.study.staleness``)."""

from __future__ import annotations

import json
import math

import pytest

from recipe.tools.study.staleness import CORRECTIONS, main, parse
from recipe.tools.study.table import Cell, area, collect


def _write_run(out, cell, curve, samples_per_s=100.0, staleness=(0.5, 1), masked=0.01):
    run_dir = out / cell.name
    run_dir.mkdir(parents=True)
    steps = curve[-1][0]
    records = [
        {"step": s, "val/accuracy": a, "mismatch/masked_token_frac": masked} for s, a in curve
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    summary = {
        "steps": steps,
        "initial/val_accuracy": curve[0][1],
        "final/val_accuracy": curve[-1][1],
        "throughput/samples_per_s": samples_per_s,
        "staleness/mean": staleness[0],
        "staleness/max": staleness[1],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_the_grid_names_every_cell_and_each_command_sets_its_knobs(tmp_path, capsys):
    study, table_only = parse(
        [
            "thresholds=0,4",
            "corrections=bypass,icepop",
            "seeds=0,1",
            "max_staleness=none,1",
            f"out={tmp_path}",
            "actor.lr=1e-5",
        ]
    )
    cells = study.cells()
    assert len(cells) == 2 * 2 * 2 * 2 and not table_only
    assert len({c.name for c in cells}) == len(cells)
    command = study.command(Cell(4.0, "icepop", 1, 1))
    assert "async_training.staleness_threshold=4" in command
    assert "async_training.max_staleness=1" in command and "actor.lr=1e-5" in command
    assert "trainer.seed=1" in command and "rollout.seed=1" in command
    assert set(CORRECTIONS["icepop"]) <= set(command)
    assert f"hydra.run.dir={tmp_path / 's4-max1-icepop-seed1'}" in command
    with pytest.raises(SystemExit) as exit_info:
        parse(["corrections=tis"])
    assert exit_info.value.code == 2 and "unknown ['tis']" in capsys.readouterr().err


def test_the_table_averages_seeds_and_the_area_is_the_mean_accuracy_over_the_run(tmp_path):
    assert area([(0, 0.0), (10, 1.0)]) == 0.5 and area([(0, 0.4)]) is None
    cells = [Cell(0.5, "bypass", s) for s in (0, 1, 2)] + [Cell(4.0, "bypass", 0)]
    for seed, final in zip((0, 1, 2), (0.5, 0.6, 0.7), strict=True):
        _write_run(tmp_path, cells[seed], [(0, 0.3), (10, 0.4), (20, final)])
    rows = collect(tmp_path / "records", tmp_path, cells)
    first, second = rows
    assert first["seeds"] == 3 and first["final_acc"] == pytest.approx(0.6)
    assert first["final_acc_std"] == pytest.approx(0.1)
    assert first["final_acc_se"] == pytest.approx(0.1 / math.sqrt(3))
    assert first["auc"] == pytest.approx((0.35 * 10 + (0.4 + 0.6) / 2 * 10) / 20)
    assert first["masked_token_frac"] == pytest.approx(0.01) and first["staleness_max"] == 1
    assert second["seeds"] == 0 and second["final_acc"] is None  # not run yet
    assert len(list((tmp_path / "records").glob("*.json"))) == 3
    (tmp_path / cells[0].name / "summary.json").unlink()  # the record stands for the run
    assert collect(tmp_path / "records", tmp_path, cells)[0]["seeds"] == 3


def test_table_only_aggregates_what_is_there_and_writes_results_and_a_plot(tmp_path, capsys):
    _write_run(tmp_path, Cell(0.0, "decoupled", 0), [(0, 0.3), (20, 0.5)])
    args = ["thresholds=0,2", "corrections=decoupled", "seeds=0", f"out={tmp_path}"]
    args.append(f"records={tmp_path / 'records'}")
    assert main([*args, "table_only=true"]) == 0
    printed = capsys.readouterr().out
    assert "0.500 +- 0.000" in printed and "decoupled" in printed
    results = json.loads((tmp_path / "records" / "results.json").read_text())
    assert [(r["threshold"], r["seeds"]) for r in results] == [(0.0, 1)]  # none at 2 yet
    assert "readmitted" in printed
    assert (tmp_path / "records" / "staleness.png").stat().st_size > 0


def test_a_failed_run_is_no_seed_and_runs_again(tmp_path, capsys, monkeypatch):
    cells = [Cell(0.5, "bypass", s) for s in (0, 1)]
    _write_run(tmp_path, cells[0], [(0, 0.3), (20, 0.5)])
    _write_run(tmp_path, cells[1], [(0, 0.3), (20, 0.6)])
    failed = tmp_path / cells[1].name / "summary.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "failed"}))
    [row] = collect(tmp_path / "records", tmp_path, cells)
    assert row["seeds"] == 1 and row["final_acc"] == 0.5
    ran = []
    monkeypatch.setattr(
        "recipe.tools.study.staleness.run_logged",
        lambda cmd, run_dir, timeout_s: ran.append(run_dir) or ("exit code 1", 1.0),
    )
    args = ["thresholds=0.5", "corrections=bypass", "seeds=0,1", f"out={tmp_path}"]
    assert main([*args, f"records={tmp_path / 'records'}"]) == 0
    assert ran == [tmp_path / cells[1].name]  # the failed seed only, not the recorded one
    assert "averages 1 of 2 seeds" in capsys.readouterr().out
