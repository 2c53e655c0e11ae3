"""The pipeline simulation (recipe/tools/plan/sim.py) against closed forms, the planner's
sweep and recommendation (recipe/tools/plan/cli.py), and its measured inputs
(recipe/tools/plan/inputs.py)."""

from __future__ import annotations

import json

import pytest

from recipe.tools.plan.cli import Row, main, recommend, sweep
from recipe.tools.plan.inputs import measure
from recipe.tools.plan.modes import simulate
from recipe.tools.plan.spec import Layout, Workload
from recipe.tools.report.data import load_run

N, R, LENGTH = 4, 8, 10
SAMPLES = N * R


def workload(**overrides) -> Workload:
    """Deterministic: every response LENGTH tokens, every sample the same train cost."""
    base = {
        "n": N,
        "prompts_per_step": R,
        "lengths": (LENGTH,),
        "engine_tps": 100.0,
        "train_s_per_sample": 0.01,
        "sync_s": 0.2,
    }
    return Workload(**(base | overrides))


def durations(result) -> list[float]:
    ends = result.step_end_s
    return [b - a for a, b in zip([0.0, *ends], ends, strict=False)]


def test_sync_step_is_generation_plus_training_plus_push():
    w = workload(step_overhead_s=0.05)
    gen_s = SAMPLES * LENGTH / w.engine_tps  # all 32 sequences share the engine: 3.2 s
    train_s = SAMPLES * w.train_s_per_sample + w.step_overhead_s
    result = simulate(w, Layout("sync"), 5)
    assert durations(result) == pytest.approx([gen_s + train_s + w.sync_s] * 5, rel=1e-12)
    assert result.samples_per_s == pytest.approx(SAMPLES / (gen_s + train_s + w.sync_s))
    assert result.trainer_idle_ratio == pytest.approx(gen_s / (gen_s + train_s + w.sync_s))
    assert result.staleness_max == 0


def test_a_lone_sequence_rate_and_more_engines_shape_generation_time():
    # rate per sequence = 1 / (1/seq_tps + k/engine_tps); two engines split the groups
    w = workload(seq_tps=50.0, train_s_per_sample=0.0, sync_s=0.0)
    one = simulate(w, Layout("sync"), 1).wall_s
    assert one == pytest.approx(LENGTH * (1 / 50.0 + SAMPLES / 100.0))
    two = simulate(w, Layout("sync", engines=2), 1).wall_s
    assert two == pytest.approx(LENGTH * (1 / 50.0 + SAMPLES / 2 / 100.0))
    # max_num_seqs=16: two waves of 16 sequences
    capped = simulate(
        workload(max_num_seqs=16, train_s_per_sample=0.0, sync_s=0.0), Layout("sync"), 1
    )
    assert capped.wall_s == pytest.approx(2 * 16 * LENGTH / 100.0)


@pytest.mark.parametrize("train_s_per_sample", [0.01, 0.2])  # generation-bound, train-bound
def test_one_step_off_steady_step_is_max_of_generation_and_training_plus_push(train_s_per_sample):
    w = workload(train_s_per_sample=train_s_per_sample)
    gen_s, train_s = SAMPLES * LENGTH / w.engine_tps, SAMPLES * train_s_per_sample
    steps = durations(simulate(w, Layout("one_step_off"), 6))
    assert steps[0] == pytest.approx(gen_s + max(gen_s, train_s) + w.sync_s)
    assert steps[1:-1] == pytest.approx([max(gen_s, train_s) + w.sync_s] * 4, rel=1e-12)
    assert steps[-1] == pytest.approx(train_s + w.sync_s)  # nothing left to generate


def test_one_step_off_trains_every_batch_after_the_first_one_version_old():
    result = simulate(workload(), Layout("one_step_off"), 5)
    assert result.staleness == {0: SAMPLES, 1: 4 * SAMPLES}


def test_contention_slows_both_sides_while_they_overlap():
    # one_step_off, train 6.4 s > gen 3.2 s of work: both run 1.5x slower for 1.5 * 3.2 s,
    # then the trainer's last 3.2 s run alone.
    w = workload(train_s_per_sample=0.2, contention=1.5)
    gen_s, train_s = 3.2, 6.4
    steps = durations(simulate(w, Layout("one_step_off"), 4))
    assert steps[1:-1] == pytest.approx([train_s + 0.5 * gen_s + w.sync_s] * 2, rel=1e-12)


def test_fully_async_trainer_bound_step_is_training_plus_push_every_t_steps():
    # Engines 100x faster than the trainer: the trainer never waits after the first step.
    w = workload(engine_tps=10_000.0, train_s_per_sample=0.1)
    train_s = SAMPLES * 0.1
    layout = Layout("fully_async", steps_per_sync=2, staleness_threshold=1.0)
    result = simulate(w, layout, 12)
    steps = durations(result)
    assert steps[2:] == pytest.approx([train_s, train_s + w.sync_s] * 5, rel=1e-9)
    # B = 2W: staleness <= floor((B - 1) / W) = 1
    assert result.staleness_max == 1
    assert sum(result.staleness.values()) == result.num_samples == 12 * SAMPLES


@pytest.mark.parametrize("threshold, bound", [(0.0, 0), (0.5, 1), (2.0, 2)])
def test_fully_async_staleness_stays_within_the_admission_bound(threshold, bound):
    w = workload(lengths=(2, 5, 40, 80), train_s_per_sample=0.02)
    layout = Layout("fully_async", steps_per_sync=1, staleness_threshold=threshold)
    result = simulate(w, layout, 20, seed=3)
    assert result.staleness_max <= bound
    assert result.num_samples == 20 * SAMPLES


def test_fully_async_without_partial_rollout_pushes_wait_for_the_long_tail():
    # One response in 31 takes 20 s alone; with partial rollout it spans pushes, without it
    # every push waits for it.
    w = workload(
        lengths=(5,) * 30 + (400,), engine_tps=10_000.0, seq_tps=20.0, train_s_per_sample=0.05
    )
    partial = simulate(w, Layout("fully_async", staleness_threshold=1.0), 20, seed=1)
    drained = simulate(
        w, Layout("fully_async", staleness_threshold=1.0, partial_rollout=False), 20, seed=1
    )
    assert drained.wall_s > 1.3 * partial.wall_s
    assert drained.trainer_idle_ratio < partial.trainer_idle_ratio  # draining is not idle


def test_bad_workload_and_layout_values_are_rejected_by_name():
    with pytest.raises(ValueError, match="engine_tps"):
        workload(engine_tps=0.0)
    with pytest.raises(ValueError, match="contention"):
        workload(contention=0.5)
    with pytest.raises(ValueError, match="mode"):
        Layout("async")


# ---- sweep and recommendation ----------------------------------------------------------------


def test_sweep_covers_every_split_and_threshold_and_async_beats_sync_on_a_long_tail():
    w = workload(lengths=(5,) * 15 + (300,), seq_tps=20.0, train_s_per_sample=0.05)
    rows = sweep(
        w,
        gpus=8,
        gpus_per_engine=1,
        measured_trainer_gpus=1,
        steps=12,
        steps_per_sync=1,
        thresholds=(0.0, 0.5),
    )
    assert rows[0].layout.mode == "sync" and rows[0].layout.engines == 8
    splits = {(r.trainer_gpus, r.rollout_gpus) for r in rows[1:]}
    assert splits == {(t, 8 - t) for t in range(1, 8)}
    assert len(rows) == 1 + 7 * 3  # one_step_off + 2 thresholds per split
    best = recommend(rows)
    assert best.result.steady_samples_per_s() > rows[0].result.steady_samples_per_s()


def test_recommend_prefers_the_freshest_layout_within_three_percent_of_the_best():
    def row(threshold: float, sps: float, staleness: float) -> Row:
        class Result:
            staleness_mean = staleness

            def steady_samples_per_s(self, warmup_steps: int = 2) -> float:
                return sps

        layout = Layout("fully_async", staleness_threshold=threshold)
        return Row(layout, 4, 4, Result())  # type: ignore[arg-type]

    rows = [row(1.0, 100.0, 0.9), row(0.5, 98.0, 0.5), row(0.0, 90.0, 0.0)]
    assert recommend(rows).layout.staleness_threshold == 0.5


def test_plan_command_prints_a_table_whose_last_line_is_the_recommendation(capsys):
    code = main(
        [
            "--engine-tps", "100", "--train-s-per-sample", "0.01", "--length-mean", "10",
            "--sync-s", "0.1", "--n", "4", "--prompts-per-step", "8", "--gpus", "4",
            "--steps", "6", "--thresholds", "0", "0.5",
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert lines[0].split()[:2] == ["layout", "samples/s"]
    assert lines[1].startswith("sync on all 4 GPUs")
    assert lines[-1].startswith("recommendation: ")


def test_plan_command_without_inputs_names_the_missing_flags(capsys):
    assert main(["--engine-tps", "100"]) == 2
    assert "--train-s-per-sample" in capsys.readouterr().err


# ---- measured inputs -------------------------------------------------------------------------


def _synthetic_sync_run(tmp_path, num_steps: int = 6):
    """A sync run whose every step generates 2 groups of 2 responses of 3 tokens in 0.5 s,
    trains 0.2 + 0.3 s and pushes in 0.1 s (step 1.2 s: 0.1 s of overhead)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    events, records, t = [], [], 1e9
    for step in range(1, num_steps + 1):
        for slot in range(2):
            args = {"prompt_uid": f"p{step}-{slot}", "n": 2, "new_tokens": 6,
                    "tokens": 6, "new_lengths": [3, 3], "lengths": [3, 3], "versions": [0],
                    "finish": {"stop": 2}, "resumed": False, "temperature": 1.0}  # fmt: skip
            events.append({"ph": "X", "name": "generate", "cat": "rollout", "pid": 10,
                           "tid": slot + 1, "ts": t, "dur": 0.5e6, "args": args})  # fmt: skip
        events.append({"ph": "X", "name": "step", "cat": "step", "pid": 1, "tid": 1, "ts": t,
                       "dur": 1.2e6, "args": {"step": step}})  # fmt: skip
        records.append({"step": step, "throughput/samples": 4.0, "timing/gen_s": 0.5,
                        "timing/old_log_prob_s": 0.2, "timing/update_s": 0.3,
                        "timing/sync_s": 0.1, "timing/step_s": 1.2})  # fmt: skip
        t += 1.2e6
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "summary.json").write_text(json.dumps({"mode": "sync", "steps": num_steps}))
    return tmp_path


def test_measure_reads_costs_lengths_and_engine_speed_from_a_run(tmp_path):
    measured = measure(load_run(_synthetic_sync_run(tmp_path)))
    w = measured.workload
    assert (w.n, w.prompts_per_step, set(w.lengths)) == (2, 2, {3})
    assert w.engine_tps == pytest.approx(12 / 0.5)  # 12 tokens while busy 0.5 s
    assert w.train_s_per_sample == pytest.approx(0.5 / 4)
    assert w.sync_s == pytest.approx(0.1) and w.step_overhead_s == pytest.approx(0.1)
    assert measured.samples_per_s == pytest.approx(4 / 1.2)
    # Fed back, the simulation gives the run's own step: 0.5 + 0.5 + 0.1 + 0.1 s.
    result = simulate(w, Layout("sync"), 6)
    assert result.steady_samples_per_s() == pytest.approx(measured.samples_per_s)


def test_measure_names_a_run_without_a_trace(tmp_path):
    run = _synthetic_sync_run(tmp_path)
    (run / "trace.json").unlink()
    with pytest.raises(ValueError, match=r"no trace\.json"):
        measure(load_run(run))


def test_validate_prints_predicted_vs_measured(tmp_path, capsys):
    run = _synthetic_sync_run(tmp_path)
    assert main(["--run", str(run), "--validate", str(run)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    mode, predicted, measured, error, path = last.split()
    assert (mode, path) == ("sync", str(run))
    assert float(predicted) == pytest.approx(float(measured), abs=0.1)
    assert error == "+0.0%"


def test_contention_is_the_training_slowdown_per_unit_of_overlap(tmp_path):
    base = measure(load_run(_synthetic_sync_run(tmp_path / "sync"))).workload  # 0.125 s/sample
    run = _synthetic_sync_run(tmp_path / "async")
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # training takes 1.5x as long ...
        record["timing/update_s"] = 0.3 + 0.25
    starts = [e["ts"] for e in events if e["name"] == "step"]
    for start in starts:  # ... and a third of it overlaps generation
        events.append({"ph": "X", "name": "update", "cat": "trainer", "pid": 1, "tid": 2,
                       "ts": start + 0.25e6, "dur": 0.5e6})  # fmt: skip
        events.append({"ph": "X", "name": "old_log_prob", "cat": "trainer", "pid": 1, "tid": 2,
                       "ts": start + 0.75e6, "dur": 0.25e6})  # fmt: skip
    (run / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # generation covers [start, start + 0.5 s]: 0.25 s of the 0.75 s of training; 1.5x slower
    # over a third of the time means 2.5x slower while overlapped
    from recipe.tools.plan.inputs import estimate_contention

    contention = estimate_contention(base, load_run(run))
    assert contention == pytest.approx(2.5)
