"""The engine's two decode speeds fitted from a sync run's batches (recipe/tools/plan/decode.py):
recovered from batches that follow the engine model, batches that cannot be read left out, no
fit where the two costs do not separate, and the planner's measured workload using the fit."""

from __future__ import annotations

import json
import math
import random

import pytest

from recipe.tools.plan.cli import main
from recipe.tools.plan.decode import Batch, busy_batches, fit_decode
from recipe.tools.plan.inputs import measure
from recipe.tools.report.data import load_run

A, B = 0.004, 0.0002  # an engine step: 4 ms + 0.2 ms per sequence: 250 and 5,000 tokens/s
# Per step: each of 4 groups of 2 responses; the steps differ in their tail.
STEP_LENGTHS = [
    [[10, 12], [8, 9], [11, 10], [9, 200]],
    [[10, 12], [8, 9], [11, 10], [9, 14]],
    [[30, 12], [8, 90], [11, 10], [9, 14]],
    [[10, 12], [8, 9], [11, 400], [9, 14]],
    [[10, 12], [50, 9], [11, 10], [9, 14]],
    [[10, 12], [8, 9], [11, 10], [120, 14]],
]


def _duration_s(groups: list[list[int]]) -> float:
    lengths = [n for group in groups for n in group]
    return A * max(lengths) + B * sum(lengths)


def _sync_run(tmp_path, mode: str = "sync"):
    """A sync run on one replica whose generation follows the engine model exactly; steps 1-2
    repeat steps 3-4 (the planner leaves them out as warm-up)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    steps = STEP_LENGTHS[2:4] + STEP_LENGTHS
    events, records, t = [], [], 1e9
    for step, groups in enumerate(steps, start=1):
        gen_s = _duration_s(groups)
        everyone = [n for group in groups for n in group]
        for slot, group in enumerate(groups):
            # a group ends with its longest response: that many engine steps, each with the
            # sequences still running (the longest group's end is the batch's)
            dur_s = A * max(group) + B * sum(min(n, max(group)) for n in everyone)
            args = {"prompt_uid": f"p{step}-{slot}", "n": 2, "new_tokens": sum(group),
                    "tokens": sum(group), "new_lengths": group, "lengths": group,
                    "versions": [0], "finish": {"stop": 2}, "resumed": False,
                    "temperature": 1.0}  # fmt: skip
            events.append({"ph": "X", "name": "generate", "cat": "rollout", "pid": 10,
                           "tid": slot + 1, "ts": t, "dur": dur_s * 1e6,
                           "args": args})  # fmt: skip
        step_s = gen_s + 0.51
        events.append({"ph": "X", "name": "step", "cat": "step", "pid": 1, "tid": 1, "ts": t,
                       "dur": step_s * 1e6, "args": {"step": step}})  # fmt: skip
        records.append({"step": step, "throughput/samples": 8.0, "timing/gen_s": gen_s,
                        "timing/old_log_prob_s": 0.2, "timing/update_s": 0.3,
                        "timing/sync_s": 0.01, "sync/pause_window_s": 0.01,
                        "timing/step_s": step_s})  # fmt: skip
        t += step_s * 1e6
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "summary.json").write_text(json.dumps({"mode": mode, "steps": len(steps)}))
    return tmp_path


def _batch(longest: int, tokens: int, **changes: float) -> Batch:
    fields = {"duration_s": A * longest + B * tokens, "longest": longest, "tokens": tokens,
              "sequences": 8, "start_spread_s": 0.0} | changes  # fmt: skip
    return Batch(**fields)  # type: ignore[arg-type]


def test_the_two_speeds_are_recovered_from_batches_that_follow_the_engine_model():
    batches = [_batch(longest, tokens) for longest, tokens in
               [(200, 280), (14, 90), (90, 200), (400, 480), (50, 130)]]  # fmt: skip
    fit = fit_decode(batches, max_num_seqs=256)
    assert fit is not None
    assert fit.seq_tps == pytest.approx(1 / A) and fit.engine_tps == pytest.approx(1 / B)
    assert (fit.batches, fit.r2) == (5, pytest.approx(1.0))
    assert "a lone sequence 250 tokens/s, a full engine 5,000 tokens/s" in fit.describe()


def test_batches_that_cannot_be_read_are_left_out_and_alike_ones_give_no_fit():
    good = [_batch(200, 280), _batch(14, 90), _batch(90, 200), _batch(400, 480)]
    late = _batch(50, 130, duration_s=9.0, start_spread_s=5.0)  # requests did not start together
    wide = _batch(50, 130, duration_s=9.0, sequences=300)  # more than the engine runs at once
    fit = fit_decode([*good, late, wide], max_num_seqs=256)
    assert fit is not None and fit.batches == 4 and fit.seq_tps == pytest.approx(1 / A)
    assert fit_decode(good[:3], max_num_seqs=256) is None  # too few
    assert fit_decode([_batch(10, 40)] * 6, max_num_seqs=256) is None  # all alike
    flat = [_batch(n, 2 * n, duration_s=0.001 * n) for n in (10, 20, 30, 40)]
    noisy = [*flat, _batch(10, 200, duration_s=0.01)]  # more tokens, no slower: b <= 0
    assert fit_decode(noisy, max_num_seqs=256) is None


def test_batches_whose_longest_hardly_differs_give_no_fit():
    # every batch's longest response at the limit: duration noise decides how it splits
    rng = random.Random(0)
    at_limit = [
        _batch(250 + rng.randint(-5, 5), tokens, duration_s=1.8 + rng.uniform(-0.2, 0.2))
        for tokens in range(9000, 12500, 250)
    ]
    assert fit_decode(at_limit, max_num_seqs=256) is None
    spread = [  # the same noise, but longest responses from 40 to 2,000 tokens
        _batch(n, t, duration_s=A * n + B * t + rng.uniform(-0.02, 0.02))
        for n, t in zip(range(40, 2000, 140), range(9000, 12500, 250), strict=False)
    ]
    fit = fit_decode(spread, max_num_seqs=256)
    assert fit is not None and fit.seq_tps == pytest.approx(1 / A, rel=0.1)


def test_a_replicas_busy_periods_are_its_batches():
    def event(pid: int, ts: float, dur: float, lengths: list[int]) -> dict:
        args = {"n": len(lengths), "new_lengths": lengths, "new_tokens": sum(lengths)}
        return {"pid": pid, "ts": ts, "dur": dur, "args": args}

    requests = [event(10, 0, 5e6, [3, 4]), event(10, 1e5, 2e6, [2, 2]),  # one period
                event(10, 6e6, 1e6, [7, 1]), event(11, 0, 1e6, [5, 5])]  # fmt: skip
    batches = sorted(busy_batches(requests, start_us=0), key=lambda b: (b.duration_s, b.tokens))
    assert [(b.duration_s, b.longest, b.tokens, b.sequences) for b in batches] == [
        (1.0, 7, 8, 2),
        (1.0, 5, 10, 2),
        (5.0, 4, 11, 4),
    ]
    assert batches[2].start_spread_s == pytest.approx(0.1)
    assert [b.longest for b in busy_batches(requests, start_us=5e6)] == [7]  # after the warm-up


def test_measure_uses_the_fit_of_a_sync_run_and_the_mean_otherwise(tmp_path, capsys):
    measured = measure(load_run(_sync_run(tmp_path / "sync")))
    w = measured.workload
    assert w.seq_tps == pytest.approx(1 / A, rel=0.02)
    assert w.engine_tps == pytest.approx(1 / B, rel=0.02)
    assert main(["--run", str(tmp_path / "sync"), "--gpus", "2"]) == 0
    assert capsys.readouterr().out.startswith("engine: a lone sequence 25")
    other = measure(load_run(_sync_run(tmp_path / "async", mode="fully_async")))
    assert other.decode is None and math.isinf(other.workload.seq_tps)
    assert "its mean while busy" in other.describe_engine()
