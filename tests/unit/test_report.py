"""``python -m recipe.tools.report``: the files it writes for one run and for several, on small
run directories written here (the integration tests run it on real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.tools.report.cli import main, write_report
from recipe.tools.report.data import depth_of, load_run, smooth, top_level

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path: Path, mode: str, *, num_steps: int = 8, summary: bool = True) -> Path:
    """A run directory shaped like the recipes' (metrics, trace with engine slices, summary)."""
    path.mkdir(parents=True)
    t0, step_s = 1.7e15, 0.5e6
    records = [{"step": 0, "param_version": 0, "val/accuracy": 0.3}]
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "trainer"}},
        {"ph": "X", "name": "validate", "cat": "trainer", "pid": 1, "tid": 2, "ts": t0,
         "dur": 0.2e6},
    ]  # fmt: skip
    for step in range(1, num_steps + 1):
        start = t0 + 0.2e6 + (step - 1) * step_s
        record = {
            "step": step,
            "param_version": step,
            "reward/mean": 0.1 * step,
            "throughput/samples": 16.0,
            "timing/step_s": 0.5,
            "trainer/idle_ratio": 0.2,
            "rollouter/idle_ratio": 0.4,
            "staleness/mean": 0.0 if mode == "sync" else 0.5,
            "sync/total_s": 0.05,
            "sync/transfer_s": 0.02,
            "sync/load_s": 0.02,
        }
        if step % 4 == 0:
            record["val/accuracy"] = 0.3 + 0.02 * step
        records.append(record)
        events += [
            {"ph": "X", "name": "step", "cat": "step", "pid": 1, "tid": 1, "ts": start,
             "dur": step_s, "args": {"step": step, "version": step}},
            {"ph": "X", "name": "train_step", "cat": "trainer", "pid": 1, "tid": 2,
             "ts": start, "dur": 0.3e6},
            {"ph": "X", "name": "update", "cat": "trainer", "pid": 1, "tid": 2,
             "ts": start + 0.1e6, "dur": 0.15e6},
            {"ph": "X", "name": "sync", "cat": "trainer", "pid": 1, "tid": 2,
             "ts": start + 0.35e6, "dur": 0.1e6},
            {"ph": "X", "name": "generate [cut]", "cat": "rollout", "pid": 10, "tid": 1,
             "ts": start, "dur": 0.3e6, "args": {"versions": [step - 1], "n": 4,
             "finish": {"aborted": 1, "stop": 3}, "temperature": 1.0, "new_tokens": 8,
             "new_lengths": [2, 2, 2, 2], "resumed": False}},
            {"ph": "C", "name": "queue", "pid": 1, "tid": 0, "ts": start + step_s,
             "args": {"size": 3.0}},
        ]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (path / "config.yaml").write_text(f"mode: {mode}\nrollout:\n  n: 4\n")
    if summary:
        (path / "summary.json").write_text(
            json.dumps(
                {
                    "mode": mode,
                    "steps": num_steps,
                    "throughput/samples_per_s": 32.0,
                    "wall_s": 4.2,
                    "initial/val_accuracy": 0.3,
                    "final/val_accuracy": 0.46,
                    "staleness/mean": 0.0 if mode == "sync" else 0.5,
                    "staleness/max": 0 if mode == "sync" else 1,
                    "staleness/histogram": {"0": 128} if mode == "sync" else {"0": 64, "1": 64},
                }
            )
        )
    return path


def _pngs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.glob("*.png")}


def test_report_of_one_run_writes_every_plot_and_a_table(tmp_path):
    run = write_run(tmp_path / "run", "fully_async")
    assert main([str(run)]) == 0
    out = run / "report"
    pngs = _pngs(out)
    expected = {"val_accuracy", "reward", "staleness", "idle_ratios", "sync_times"}
    assert set(pngs) == {f"{name}.png" for name in expected} | {"gantt_fully_async.png"}
    assert all(data.startswith(PNG_MAGIC) and len(data) > 5000 for data in pngs.values())
    text = (out / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fully_async |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["fully_async", "fully_async", "8", "32.0", "4.2"]
    assert cells[5] == "0.3 -> 0.46" and cells[6:8] == ["0.20", "0.40"]
    assert cells[8] == "0.50 / 1"
    for name in pngs:
        assert f"]({name})" in text  # every image is linked from the report


def test_a_run_with_episodes_gets_a_plot_of_turns_and_environment_time(tmp_path):
    run = write_run(tmp_path / "run", "fully_async")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records[1:]:
        record |= {"agent/turns_mean": 2.5, "agent/env_s_p50": 0.2, "agent/env_s_p99": 1.1}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([str(run)]) == 0
    pngs = _pngs(run / "report")
    assert pngs["agent.png"].startswith(PNG_MAGIC) and len(pngs["agent.png"]) > 5000
    assert "](agent.png)" in (run / "report" / "report.md").read_text()


def test_report_of_several_runs_overlays_them_in_one_table(tmp_path):
    runs = [
        write_run(tmp_path / "a", "sync"),
        write_run(tmp_path / "b", "fully_async"),
        write_run(tmp_path / "c", "fully_async", num_steps=5, summary=False),  # crashed
    ]
    out = tmp_path / "side_by_side"
    report = write_report(runs, out)
    text = report.read_text()
    assert "| sync | sync |" in text
    assert "| fully_async (b) | fully_async |" in text and "| fully_async (c) |" in text
    crashed = next(line for line in text.splitlines() if line.startswith("| fully_async (c)"))
    assert "| 5 |" in crashed and "-> 0.38" in crashed  # steps and accuracy from the records
    assert {"gantt_sync.png", "gantt_fully_async_b.png", "gantt_fully_async_c.png"} <= set(
        _pngs(out)
    )


def test_report_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    run = write_run(tmp_path / "run", "sync")
    assert main([str(run), "--gantt-steps", "3"]) == 2
    assert "FIRST:LAST" in capsys.readouterr().err


def test_gantt_steps_choose_the_window(tmp_path):
    run = write_run(tmp_path / "run", "sync", num_steps=20)
    assert main([str(run), "--gantt-steps", "3:5", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "gantt_sync.png").stat().st_size > 5000
    assert main([str(run), "--gantt-steps", "30:31", "--out", str(tmp_path / "x")]) == 2


def test_run_data_series_wall_time_and_phases(tmp_path):
    run = load_run(write_run(tmp_path / "run", "sync", num_steps=4))
    assert run.series("val/accuracy") == [(0, 0.3), (4, pytest.approx(0.38))]
    assert run.wall_s(0) == 0.0
    assert run.wall_s(2) == pytest.approx(0.2 + 2 * 0.5)  # since the first traced event
    assert run.phase_seconds() == {
        "validate": pytest.approx(0.2),
        "train_step": pytest.approx(4 * 0.3),
        "sync": pytest.approx(4 * 0.1),
    }
    assert run.staleness_histogram() == {0: 128}


def test_nesting_helpers_and_smoothing():
    slices = [
        {"ts": 0, "dur": 10, "name": "a"},
        {"ts": 1, "dur": 3, "name": "b"},
        {"ts": 2, "dur": 1, "name": "c"},
        {"ts": 12, "dur": 1, "name": "d"},
    ]
    assert [e["name"] for e in top_level(slices)] == ["a", "d"]
    assert [(e["name"], d) for e, d in depth_of(slices)] == [("a", 0), ("b", 1), ("c", 2), ("d", 0)]
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
