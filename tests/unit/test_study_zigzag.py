"""``recipe.tools.study.zigzag`` (reading: zigzag_steps, statistics: zigzag_stats) on run
directories and study records written here: positions in the sync window, the trend-free
contrast between positions, the autocorrelation against its shuffled null, the groups' lengths
and carry-over from the ledger and the trace."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from recipe.tools.study.zigzag import main
from recipe.tools.study.zigzag_stats import across_push, contrast, reward_autocorrelation
from recipe.tools.study.zigzag_steps import by_window, positions_of, read_run


def _write_run(run_dir, rewards, *, mode="fully_async", sync_every=2, extra=None):
    """metrics.jsonl (a val record first, a push every ``sync_every`` steps) and
    config.yaml; ``extra(step, position)`` adds fields to a step's record."""
    run_dir.mkdir(parents=True)
    records = [{"step": 0, "param_version": 0, "val/accuracy": 0.1}]
    version = 0
    for step, reward in enumerate(rewards, start=1):
        position = (step - 1) % sync_every + 1
        record = {"step": step, "reward/mean": reward, "response_length/mean": 10.0}
        if position == sync_every or mode == "sync":
            version += 1
            record["timing/sync_s"] = 0.1
        record["param_version"] = version
        record |= extra(step, position) if extra else {}
        records.append(record)
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    config = f"mode: {mode}\nasync_training:\n  trigger_parameter_sync_step: {sync_every}\n"
    (run_dir / "config.yaml").write_text(config)
    return run_dir


def _learning(num_steps, seed, zigzag=0.0):
    """A rising reward with noise; ``zigzag`` added to every second step, taken off the first."""
    rng = np.random.default_rng(seed)
    trend = np.linspace(0.1, 0.6, num_steps)
    sign = np.array([-1.0 if s % 2 == 0 else 1.0 for s in range(num_steps)])
    return list(trend + zigzag * sign + rng.normal(0, 0.02, num_steps))


def test_a_step_that_pushed_ends_its_window_and_a_last_short_window_counts_from_one():
    assert positions_of([False, True, False, True, True]) == [1, 2, 1, 2, 1]
    assert positions_of([False, False, True, False]) == [1, 2, 3, 1]
    assert positions_of([True, True]) == [1, 1]


def test_the_contrast_between_positions_is_zero_under_a_trend_and_finds_a_zigzag(tmp_path):
    rng = np.random.default_rng(0)
    trend_only = read_run(_write_run(tmp_path / "trend", list(np.linspace(0, 1, 40))))
    flat = contrast(by_window(trend_only, "reward"), 2, 2, rng, 500)
    assert abs(flat.mean) < 1e-12 and flat.num_windows == 19  # the last window has no next
    zig = read_run(_write_run(tmp_path / "zig", _learning(60, seed=1, zigzag=0.05)))
    found = contrast(by_window(zig, "reward"), 2, 2, rng, 2000)
    assert found.mean == pytest.approx(0.1, abs=0.02)  # +0.05 against -0.05 on both sides
    assert found.p_value < 0.01
    none = read_run(_write_run(tmp_path / "none", _learning(60, seed=2)))
    assert contrast(by_window(none, "reward"), 2, 2, rng, 2000).p_value > 0.05


def test_across_a_push_a_zigzag_drops_where_stale_groups_alone_make_a_staircase(tmp_path):
    """Groups one version old in every first step (and none of composition) give a staircase,
    x(k + 1, 1) = x(k, 2): the contrast within the window sees half a version's gain, the
    difference across the push nothing. A zigzag drops across every push."""
    rng = np.random.default_rng(0)
    stairs = [float((s + 1) // 2) for s in range(40)]  # 0, 1, 1, 2, 2, ...: version of the groups
    run = read_run(_write_run(tmp_path / "stairs", stairs))
    assert contrast(by_window(run, "reward"), 2, 2, rng, 500).mean == pytest.approx(0.5)
    assert across_push(by_window(run, "reward"), 2, rng, 500).mean == 0.0
    zig = read_run(_write_run(tmp_path / "zig", _learning(60, seed=1, zigzag=0.05)))
    drop = across_push(by_window(zig, "reward"), 2, rng, 2000)
    assert drop.mean == pytest.approx(-0.1 + 0.5 / 59, abs=0.02) and drop.p_value < 0.01


def test_the_autocorrelation_of_a_zigzag_lies_below_what_detrending_alone_gives(tmp_path):
    rng = np.random.default_rng(0)
    zig = reward_autocorrelation(_learning(64, seed=3, zigzag=0.05), 5, rng, 1000)
    assert zig.lag1 < -0.6 and zig.p_low < 0.01
    assert -0.45 < zig.null_mean < -0.1  # a 5-step moving average alone makes it negative
    plain = reward_autocorrelation(_learning(64, seed=4), 5, rng, 1000)
    assert plain.p_low > 0.05 and plain.lag1 > zig.lag1


def test_a_run_directory_gives_every_recorded_column_by_position(tmp_path, capsys):
    def extra(step, position):
        return {
            "staleness/mean": 1.0 if position == 1 and step > 1 else 0.0,
            "partial/ratio": 0.5 if position == 1 else 0.0,
            "trainer/idle_ratio": 0.5,
            "timing/step_s": 2.0,
        }

    run_dir = _write_run(tmp_path / "fa", _learning(20, seed=5, zigzag=0.05), extra=extra)
    run = read_run(run_dir)
    assert run.sync_every == 2 and run.steps == list(range(1, 21))
    assert run.positions == [1, 2] * 10
    assert run.columns["wait_s"][0] == 1.0 and math.isnan(run.columns["queue"][0])
    assert main([str(run_dir), "permutations=200"]) == 0
    out = capsys.readouterr().out
    assert "(fully_async, T=2, 20 steps)" in out and "2 - 1, detr." in out and "next 1 - 2" in out
    assert "stale" in out and "partial" in out and "queue" not in out  # never recorded
    assert "reward lag-1 autocorrelation" in out


def test_a_sync_run_has_one_position_and_a_record_needs_its_window(tmp_path, capsys):
    sync_dir = _write_run(tmp_path / "sync", _learning(12, seed=6), mode="sync", sync_every=1)
    assert set(read_run(sync_dir).positions) == {1}
    train = [{"step": s, "samples": 8 * s, "reward": r} for s, r in enumerate(_learning(8, 7), 1)]
    record = tmp_path / "fully_async-seed0.json"
    record.write_text(json.dumps({"mode": "fully_async", "train": train}))
    assert main([str(record)]) == 2
    assert "give sync_every=T" in capsys.readouterr().err
    assert read_run(record, sync_every=2).positions == [1, 2] * 4


def test_the_ledger_and_trace_say_how_long_and_how_old_each_positions_groups_are(tmp_path):
    """Step 3, the first of window 1, trains group c: begun before the push, cut by it and
    resumed after it, the longest; its reward is the run's lowest."""
    run_dir = _write_run(tmp_path / "fa", [0.2, 0.8, 0.1, 0.7])
    ledger = [{"step": s, "trained": [u]} for s, u in enumerate(["a", "b", "c", "d"], start=1)]
    (run_dir / "ledger.jsonl").write_text("\n".join(json.dumps(r) for r in ledger))

    def generate(uid, ts, dur, lengths, resumed=False):
        args = {"prompt_uid": uid, "n": 2, "lengths": lengths, "resumed": resumed}
        return {"ph": "X", "name": "generate", "ts": ts, "dur": dur, "args": args}

    events = [
        generate("a", 0, 10, [4, 5]),
        generate("b", 0, 15, [2, 3]),
        generate("c", 5, 20, [3, 6]),  # cut by the push at 30
        generate("c", 35, 10, [9, 12], resumed=True),
        generate("d", 36, 5, [1, 2]),
        {"ph": "X", "name": "end_sync (resume)", "ts": 30, "dur": 2},
    ]
    step_starts = {1: 10, 2: 20, 3: 50, 4: 60}
    events += [
        {"ph": "X", "name": "step", "ts": ts, "dur": 10, "args": {"step": s}}
        for s, ts in step_starts.items()
    ]
    (run_dir / "trace.json").write_text(json.dumps({"traceEvents": events}))
    run = read_run(run_dir)
    assert run.columns["group_len"] == [5.0, 3.0, 12.0, 2.0]
    assert run.columns["carried"] == [0.0, 0.0, 1.0, 0.0]
    # window 0 began a, b, c: they finished a (10), b (15), c (45); window 1 began d
    assert run.columns["finish_rank"] == [0.0, 0.5, 1.0, 0.0]
    # A trace without the rollouter's window openings (sync) gives lengths only.
    events = [e for e in events if e["name"] != "end_sync (resume)"]
    (run_dir / "trace.json").write_text(json.dumps({"traceEvents": events}))
    run = read_run(run_dir)
    assert run.columns["group_len"] == [5.0, 3.0, 12.0, 2.0]
    assert all(math.isnan(v) for v in run.columns["carried"] + run.columns["finish_rank"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "at least one run directory"),
        (["nowhere"], "nowhere: not a directory"),
        (["RUN", "trend=wide"], "trend='wide': expected an integer"),
        (["RUN", "permutations=0"], "permutations=0: allowed >= 1"),
        (["RUN", "colour=red"], "unknown key 'colour'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, argv, message):
    run_dir = _write_run(tmp_path / "fa", _learning(8, seed=8))
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
