"""The run timeline (observability/trace.py): events, the in-place trace.json, engine request slots,
busy time; and the step bar (recipe/observability/progress.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from recipe.observability.progress import bar_postfix, step_bar, update_bar
from recipe.observability.request_trace import RequestTrace
from recipe.observability.trace import ENGINE_PID_BASE, RunTrace, Tracer, traced
from recipe.observability.trace_file import TraceFile, busy_s, load_trace
from recipe.protocol import Trajectory
from recipe.workers.rollout.requests import GenerationRequest


def _slices(events, name=None):
    return [e for e in events if e["ph"] == "X" and (name is None or e["name"] == name)]


def test_span_records_a_complete_slice_with_args_and_nested_spans_nest():
    tracer = Tracer(1, "trainer")
    with tracer.span("outer", args={"step": 3}) as args:
        with tracer.span("inner"):
            pass
        args["extra"] = 1
    events = tracer.drain()
    outer, inner = _slices(events, "outer")[0], _slices(events, "inner")[0]
    assert outer["args"] == {"step": 3, "extra": 1}
    assert outer["ts"] <= inner["ts"]
    assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["trainer"]
    assert tracer.drain() == []  # drained once


def test_span_of_a_failing_block_is_recorded_with_the_error():
    tracer = Tracer(1, None)
    with pytest.raises(KeyError), tracer.span("load"):
        raise KeyError("x")
    (event,) = _slices(tracer.drain())
    assert event["args"] == {"error": "KeyError"}


def test_disabled_tracer_records_nothing():
    tracer = Tracer(1, "trainer", enabled=False)
    with tracer.span("x"):
        pass
    tracer.counter("queue", {"size": 3})
    assert tracer.drain() == []


def test_traced_decorates_sync_and_async_methods():
    class Worker:
        def __init__(self):
            self.tracer = Tracer(2, None)

        @traced("work", tid=7)
        def work(self, x):
            return x + 1

        @traced("async_work", cat="sync")
        async def async_work(self):
            await asyncio.sleep(0)
            return "done"

    worker = Worker()
    assert worker.work(1) == 2
    assert asyncio.run(worker.async_work()) == "done"
    events = _slices(worker.tracer.drain())
    assert [(e["name"], e["tid"], e["cat"]) for e in events] == [
        ("work", 7, "trainer"),
        ("async_work", 2, "sync"),
    ]


def test_full_buffer_drops_and_reports_the_count(monkeypatch):
    monkeypatch.setattr("recipe.observability.trace.MAX_BUFFERED_EVENTS", 3)
    tracer = Tracer(1, None)
    for i in range(5):
        tracer.counter("c", {"v": i})
    events = tracer.drain()
    assert len([e for e in events if e["ph"] == "C"]) == 3
    assert events[-1]["args"] == {"num_dropped": 2}


def test_tracer_is_safe_across_threads():
    tracer = Tracer(1, None)

    def record():
        for _ in range(500):
            tracer.complete("x", 0.0, 1.0)

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(tracer.drain()) == 2000


# ---- trace.json --------------------------------------------------------------------------


def test_trace_file_is_valid_json_after_every_flush(tmp_path):
    path = tmp_path / "trace.json"
    trace = TraceFile(path, other_data={"mode": "sync"}, flush_interval_s=0.0)
    assert json.loads(path.read_text()) == {
        "displayTimeUnit": "ms",
        "otherData": {"mode": "sync"},
        "traceEvents": [],
    }
    trace.add([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}])
    trace.flush()
    trace.add([{"ph": "C", "name": "q", "pid": 1, "tid": 0, "ts": 3.0, "args": {"size": 1.0}}])
    trace.flush()
    assert [e["name"] for e in json.loads(path.read_text())["traceEvents"]] == ["a", "q"]
    trace.close()
    assert [e["name"] for e in load_trace(path)] == ["a", "q"]


def test_trace_file_waits_for_the_flush_interval_unless_forced(tmp_path):
    path = tmp_path / "trace.json"
    trace = TraceFile(path, flush_interval_s=3600.0)
    trace.flush(force=True)
    trace.add([{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}])
    trace.flush()
    assert load_trace(path) == []
    trace.flush(force=True)
    assert len(load_trace(path)) == 1


def test_trace_cut_mid_write_keeps_its_complete_events_and_a_new_writer_continues_it(tmp_path):
    path = tmp_path / "trace.json"
    trace = TraceFile(path, flush_interval_s=0.0)
    trace.add(
        [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(3)]
    )
    trace.flush()
    trace.close()
    text = path.read_text()
    path.write_text(text[: text.rindex('"e2"') + 5])  # a crash in the middle of the last event
    assert [e["name"] for e in load_trace(path)] == ["e0", "e1"]
    resumed = TraceFile(path, flush_interval_s=0.0)
    resumed.add([{"ph": "X", "name": "after", "pid": 1, "tid": 1, "ts": 9, "dur": 1}])
    resumed.close()
    assert [e["name"] for e in json.loads(path.read_text())["traceEvents"]] == [
        "e0",
        "e1",
        "after",
    ]


def test_load_trace_rejects_a_json_file_that_is_not_a_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text('{"events": []}')
    with pytest.raises(ValueError, match="traceEvents"):
        load_trace(path)


def test_non_finite_args_are_written_as_strings(tmp_path):
    path = tmp_path / "trace.json"
    trace = TraceFile(path)
    trace.add(
        [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"x": 1e999}}]
    )
    trace.close()
    assert load_trace(path)[0]["args"] == {"x": "Infinity"}


def test_run_trace_writes_step_slices_counters_and_pulls_sources(tmp_path):
    run = RunTrace(tmp_path, mode="fully_async", flush_interval_s=3600.0)
    remote = Tracer(2, "rollouter")
    remote.complete("begin_sync (pause)", 0.0, 5.0, tid=1, cat="sync")

    def broken():
        raise RuntimeError("actor died")

    run.step(4, 2, {"timing/step_s": 0.5, "queue/size": 7.0, "reward/mean": 0.25})
    pulled = run.pull([remote.drain, broken])
    assert {e["name"] for e in _slices(pulled)} == {"step", "begin_sync (pause)"}
    run.close()
    events = load_trace(tmp_path / "trace.json")
    (step,) = _slices(events, "step")
    assert step["args"] == {"step": 4, "version": 2, "reward/mean": 0.25, "timing/step_s": 0.5}
    assert step["dur"] == pytest.approx(0.5e6, rel=1e-6)
    counters = {e["name"]: e["args"] for e in events if e["ph"] == "C"}
    assert counters == {"param_version": {"version": 2.0}, "queue": {"size": 7.0}}
    run.close()  # idempotent


# ---- engine requests ---------------------------------------------------------------------


def _traj(uid, index, versions, finish="stop"):
    return Trajectory(
        prompt_uid=uid,
        sample_index=index,
        prompt_ids=[1, 2],
        response_ids=[5] * len(versions),
        rollout_logprobs=[-0.1] * len(versions),
        token_versions=list(versions),
        finish_reason=finish,
    )


def test_concurrent_requests_take_separate_slots_and_a_resumed_group_counts_new_tokens():
    requests = RequestTrace()
    first_start, first_slot = requests.begin()
    _, second_slot = requests.begin()
    assert (first_slot, second_slot) == (0, 1)
    cut = [_traj("p0", 0, [0, 0, 0], "aborted"), _traj("p0", 1, [0], "stop")]
    request = GenerationRequest(prompt_uid="p0", prompt_ids=[1, 2], n=2, max_tokens=8)
    requests.end(first_slot)
    requests.generated(request, cut, first_start, first_slot)
    start, slot = requests.begin()
    assert slot == 0  # freed by the first request
    resumed = GenerationRequest(
        prompt_uid="p0", prompt_ids=[1, 2], n=2, max_tokens=8, resume=list(reversed(cut))
    )
    done = [_traj("p0", 0, [0, 0, 0, 1, 1], "stop"), cut[1]]
    requests.end(slot)
    requests.generated(resumed, done, start, slot)
    requests.end(second_slot)
    events = requests.drain(replica=3)
    pieces = _slices(events)
    assert [e["name"] for e in pieces] == ["generate [cut]", "generate (resumed)"]
    assert {e["pid"] for e in events} == {ENGINE_PID_BASE + 3}
    assert pieces[0]["args"]["finish"] == {"aborted": 1, "stop": 1}
    assert pieces[0]["args"]["new_tokens"] == 4 and pieces[0]["args"]["versions"] == [0]
    assert pieces[1]["args"]["new_lengths"] == [2, 0] and pieces[1]["args"]["tokens"] == 6
    assert pieces[1]["args"]["versions"] == [0, 1] and pieces[1]["args"]["resumed"] is True
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"slot 0", "slot 1"}
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == [
        "engine replica 3"
    ]


def test_busy_s_is_the_union_of_slices_clipped_to_the_window():
    events = [
        {"ph": "X", "ts": 0.0, "dur": 2e6},
        {"ph": "X", "ts": 1e6, "dur": 2e6},  # overlaps the first: [0, 3] s
        {"ph": "X", "ts": 5e6, "dur": 1e6},  # [5, 6] s
        {"ph": "C", "ts": 0.0},
    ]
    assert busy_s(events, 0.0, 10e6) == pytest.approx(4.0)
    assert busy_s(events, 2e6, 5.5e6) == pytest.approx(1.5)
    assert busy_s([], 0.0, 1e6) == 0.0


# ---- the step bar ------------------------------------------------------------------------


def test_quiet_disables_the_bar_and_the_postfix_shows_what_the_step_has():
    assert step_bar(10, "sync", quiet=True).disable
    bar = step_bar(10, "fully_async", quiet=False)
    try:
        assert not bar.disable and bar.desc == "fully_async"
        metrics = {"queue/size": 12.0, "staleness/mean": 0.5, "reward/mean": 0.4125}
        assert bar_postfix(metrics, 7, 0.55) == {
            "v": "7",
            "q": "12",
            "stale": "0.50",
            "reward": "0.412",
            "acc": "0.550",
        }
        assert bar_postfix({"reward/mean": float("nan")}, 0, None) == {"v": "0"}
        update_bar(bar, metrics, 7)
        assert bar.n == 1
    finally:
        bar.close()
