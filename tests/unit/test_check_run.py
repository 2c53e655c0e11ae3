"""``ci/check_run.py``: thresholds derived from measured runs, checked on the mean of seeds."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _check_run():
    spec = importlib.util.spec_from_file_location("check_run", ROOT / "ci" / "check_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path: Path, initial: float, vals: list[float], wall_s: float = 300.0) -> Path:
    """A finished run: validated at step 0 (``initial``), then every 10 steps (``vals``)."""
    path.mkdir(parents=True)
    summary = {"initial/val_accuracy": initial, "final/val_accuracy": vals[-1], "wall_s": wall_s}
    (path / "summary.json").write_text(json.dumps(summary))
    records = [{"step": 0, "val/accuracy": initial}]
    for i, acc in enumerate(vals):
        records += [{"step": 10 * i + 5}, {"step": 10 * i + 10, "val/accuracy": acc}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _runs(measured: list[tuple[float, float]]) -> list[dict[str, float]]:
    return [{"late_val_gain": g, "final_val_gain": g, "wall_s": w} for g, w in measured]


def test_the_figure_is_the_mean_of_the_last_validations_over_the_start(tmp_path):
    """The final validation alone is one noisy evaluation: the late gain averages the last
    five, and the initial validation (step 0) is never one of them."""
    check_run = _check_run()
    run = _run(tmp_path / "r", 0.3, [0.9, 0.4, 0.5, 0.4, 0.5, 0.4, 0.3], wall_s=12.0)
    found = check_run.figures(run)
    assert found["late_val_gain"] == pytest.approx(0.42 - 0.3)
    assert found["final_val_gain"] == pytest.approx(0.0)
    assert found["wall_s"] == 12.0
    short = check_run.figures(_run(tmp_path / "s", 0.3, [0.5, 0.4]))
    assert short["late_val_gain"] == pytest.approx(0.15)


def test_a_derived_threshold_fails_a_20_percent_regression_and_passes_the_measured_runs():
    check_run = _check_run()
    measured = _runs([(0.15, 300), (0.12, 330), (0.18, 290)])
    entry = check_run.derive(measured, command="python -m recipe mode=sync")
    assert entry["min_late_val_gain"] == pytest.approx(0.8 * 0.15, abs=1e-3)
    assert entry["max_wall_s"] == round(1.2 * statistics.mean([300, 330, 290]))
    assert entry["measured"]["late_val_gain"] == [0.15, 0.12, 0.18]
    # sd 0.03, mean 0.15: (1.645 * 0.03 / 0.03) ** 2 = 2.7 -> 3 seeds.
    assert entry["seeds"] == 3
    assert all(ok for *_, ok in check_run.check(entry, measured))
    regressed = [dict(r, late_val_gain=r["late_val_gain"] * 0.78) for r in measured]
    assert [ok for *_, ok in check_run.check(entry, regressed)] == [False, True]
    slow = [dict(r, wall_s=r["wall_s"] * 1.25) for r in measured]
    assert [ok for *_, ok in check_run.check(entry, slow)] == [True, False]


def test_derive_refuses_fewer_than_three_runs_and_runs_that_did_not_learn():
    check_run = _check_run()
    with pytest.raises(ValueError, match="at least 3 runs"):
        check_run.derive(_runs([(0.1, 1.0)] * 2), command="c")
    with pytest.raises(ValueError, match="did not learn"):
        check_run.derive(_runs([(0.0, 1.0)] * 3), command="c")


def test_check_reads_the_mean_of_its_seeds_and_names_bad_input(tmp_path, capsys):
    check_run = _check_run()
    table = json.loads(check_run.THRESHOLDS.read_text())
    key = "sync"
    need, floor = table[key].get("seeds", 1), table[key]["min_late_val_gain"]
    dirs = [str(_run(tmp_path / f"ok{i}", 0.3, [0.3 + floor + 0.01], 1.0)) for i in range(need)]
    assert check_run.main(["check", key, *dirs]) == 0
    low = [str(_run(tmp_path / f"low{i}", 0.3, [0.3 + floor * 0.5], 1.0)) for i in range(need)]
    assert check_run.main(["check", key, *low]) == 1
    assert "REGRESSED" in capsys.readouterr().out
    assert check_run.main(["check", key, str(tmp_path / "missing")]) == 2
    assert "no summary.json" in capsys.readouterr().err
    assert check_run.main(["check", "no/such", *dirs]) == 2
    if need > 1:
        assert check_run.main(["check", key, dirs[0]]) == 2
        assert f"mean of {need} seeds" in capsys.readouterr().err


def test_every_threshold_cites_at_least_three_measured_runs():
    """A threshold with no measurement beside it is a guess (issue: thresholds that cannot
    fail, or fail on healthy code)."""
    check_run = _check_run()
    table = json.loads(check_run.THRESHOLDS.read_text())
    derived = [key for key, entry in table.items() if "pending" not in entry]
    assert {"sync", "one_step_off", "fully_async"} <= set(derived)
    for key in derived:
        entry = table[key]
        measured = entry.get("measured")
        assert measured is not None, f"{key}: no measured runs"
        gains = measured["late_val_gain"]
        assert len(gains) >= 3, key
        assert entry["min_late_val_gain"] == pytest.approx(
            0.8 * statistics.mean(gains), abs=1e-3
        ), key
