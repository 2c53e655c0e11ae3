"""Two variants of a task compared from their modes-study records
(``python -m recipe.tools.study.variants``): the interval of the difference, its floor at the
evaluations' own noise, the settings that differ, and what it refuses."""

from __future__ import annotations

import json
import math

import pytest

from recipe.tools.study.accuracy import RunRecord, ValPoint
from recipe.tools.study.variants import compare, main, t_975, welch_df


def _run(mode, seed, final, *, samples=8192, speed=30.0, val_prompts=500):
    curve = [ValPoint(0, 0, 0, 0.0, 0.0), ValPoint(32, 32, samples, 200.0, final)]
    return RunRecord(mode, seed, 32, samples, 280.0, speed, val_prompts, curve)


def _records(path, overrides, runs):
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"overrides": overrides, "rows": []}))
    for run in runs:
        (path / f"{run.mode}-seed{run.seed}.json").write_text(json.dumps(run.to_json()))
    return path


def test_one_seed_a_side_gives_the_evaluations_noise_only():
    row = compare("sync", [_run("sync", 0, 0.30)], [_run("sync", 0, 0.25)])
    half = 1.96 * math.sqrt(0.3 * 0.7 / 500 + 0.25 * 0.75 / 500)  # 0.0553
    assert row.interval_from == "evaluation" and row.seeds == (1, 1)
    assert row.difference == pytest.approx(-0.05)
    assert row.interval == pytest.approx((-0.05 - half, -0.05 + half))
    assert row.within
    far = compare("sync", [_run("sync", 0, 0.30)], [_run("sync", 0, 0.05)])
    assert not far.within and far.interval[1] < 0


def test_seeds_on_both_sides_widen_the_interval_by_their_spread_and_t():
    base = [_run("sync", s, a) for s, a in enumerate((0.20, 0.40))]
    other = [_run("sync", s, a) for s, a in enumerate((0.25, 0.45))]
    row = compare("sync", base, other)
    # Each side's mean has variance 0.02 / 2 = 0.01; Welch df = 0.02^2 / (2 * 0.01^2) = 2.
    assert welch_df([[0.20, 0.40], [0.25, 0.45]]) == pytest.approx(2.0)
    assert row.interval_from == "seeds"
    assert row.interval == pytest.approx(
        (0.05 - 4.303 * math.sqrt(0.02), 0.05 + 4.303 * math.sqrt(0.02))
    )
    # Two seeds that agree by chance do not make the interval narrower than one evaluation's
    # noise allows.
    tight = compare("sync", [_run("sync", s, 0.300) for s in (0, 1)],
                    [_run("sync", s, 0.301) for s in (0, 1)])  # fmt: skip
    assert tight.interval_from == "evaluation"
    assert tight.interval[1] - tight.interval[0] == pytest.approx(
        2 * 1.96 * math.sqrt((0.3 * 0.7 + 0.301 * 0.699) / 500 / 2), rel=1e-6
    )


def test_t_quantiles_by_degrees_of_freedom():
    assert t_975(1) == 12.706 and t_975(2.7) == 4.303 and t_975(30) == 2.042
    assert t_975(1000) == 1.96 and t_975(0.4) == 12.706


def test_the_command_names_what_differs_and_writes_the_table(tmp_path, capsys):
    full = _records(tmp_path / "full", ["data.train_files=[/a]", "actor.lr=3e-6"],
                    [_run("sync", 0, 0.30, speed=36.0), _run("fully_async", 0, 0.31)])  # fmt: skip
    lora = _records(tmp_path / "lora", ["data.train_files=[/b]", "actor.lr=1e-4",
                    "actor.lora.rank=32"], [_run("sync", 0, 0.29, speed=30.0)])  # fmt: skip
    assert main([str(full), str(lora), f"out={tmp_path / 'v.json'}"]) == 0
    out = capsys.readouterr().out
    assert "actor.lr: 3e-6 -> 1e-4" in out and "actor.lora.rank: (unset) -> 32" in out
    assert "data.train_files" not in out and "fully_async" not in out  # one side only
    table = json.loads((tmp_path / "v.json").read_text())
    assert [r["mode"] for r in table["rows"]] == ["sync"] and table["rows"][0]["within"]
    assert table["rows"][0]["samples_per_s"] == [36.0, 30.0]


def test_unequal_samples_and_folders_without_a_study_are_refused(tmp_path, capsys):
    full = _records(tmp_path / "full", [], [_run("sync", 0, 0.30)])
    short = _records(tmp_path / "short", [], [_run("sync", 0, 0.30, samples=4096)])
    for argv, message in (
        ([str(full), str(short)], "compare at equal samples"),
        ([str(full), str(tmp_path)], "no results.json"),
        ([str(full)], "expected BASE OTHER"),
        ([str(full), str(full), "seeds=2"], "unknown keys"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1
