"""The peer benchmark's GPU readings (clock, temperature), its CPU readings (busy share before
the launch and during the run) and its repeats table: ratios paired within a repeat, failed
runs left out, the run order read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.tools.bench.peers import measure
from recipe.tools.bench.peers import repeats as rep
from recipe.tools.bench.peers.measure import GpuSample, Measured, parse_gpu_query
from recipe.tools.bench.peers.result import SystemResult


def test_one_gpu_reading_sums_memory_and_power_and_keeps_the_slowest_clock_and_hottest_die():
    sample = parse_gpu_query("1000, 1980, 41, 120.5\n3000, 1755, 63, [N/A]\n")
    assert sample == GpuSample(used_mib=4000.0, sm_clock_mhz=1755.0, temp_c=63.0, power_w=120.5)
    assert parse_gpu_query("") is None
    assert parse_gpu_query("[N/A], 1980, 41, 100\n") is None


def test_a_run_keeps_its_clock_and_temperature_range():
    samples = [
        GpuSample(10.0, clock, temp, 100.0) for clock, temp in ((1980, 35), (1410, 71), (1755, 60))
    ]
    state = Measured(0, 1.0, gpu_samples=samples).gpu_state()
    assert state["sm_clock_mhz_median"] == 1755 and state["sm_clock_mhz_min"] == 1410
    assert (state["temp_c_start"], state["temp_c_max"]) == (35, 71)
    assert Measured(0, 1.0).gpu_state() == {}


def test_the_harness_samples_the_gpu_at_every_poll(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "read_gpu", lambda: GpuSample(100.0, 1980.0, 40.0, 90.0))
    monkeypatch.setattr(measure, "SETTLE_S", 0.1)
    command = ["python", "-c", "import time; time.sleep(1.2)"]
    measured = measure.run_measured(
        command, tmp_path / "run", metrics_file=tmp_path / "m.jsonl", timeout_s=30
    )
    assert measured.returncode == 0 and len(measured.gpu_samples) >= 2
    assert measured.gpu_state()["temp_c_max"] == 40.0


def test_the_cpus_busy_share_comes_from_proc_stat_idle_and_iowait_not_busy(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    first = measure.read_cpu_times(stat)
    assert first == (150.0, 1000.0)
    stat.write_text("cpu  200 0 100 1100 100 0 0 0 0 0\n")
    assert measure.busy_share(first, measure.read_cpu_times(stat)) == pytest.approx(0.3)
    assert measure.busy_share(first, first) is None  # no time between them
    stat.write_text("intr 1 2 3\n")
    assert measure.read_cpu_times(stat) is None
    assert measure.read_cpu_times(tmp_path / "none") is None


def test_a_process_left_spinning_before_the_launch_shows_as_busy_cpus(tmp_path, monkeypatch):
    """What an earlier system leaves running (a suspect for two identical runs 1.42x apart)
    is in the run's record: the CPUs' busy share before its launch."""
    monkeypatch.setattr(measure, "read_gpu", lambda: None)
    cpus = os.cpu_count() or 1
    spinners = min(cpus, 8)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    try:
        command = [sys.executable, "-c", "import time; time.sleep(1.2)"]
        measured = measure.run_measured(
            command, tmp_path / "run", metrics_file=tmp_path / "m.jsonl", timeout_s=30
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    state = measured.cpu_state()
    assert state["cpu_busy_before"] >= 0.5 * spinners / cpus, state
    assert 0.0 <= state["cpu_busy_median"] <= 1.0 and len(measured.cpu_busy) >= 2
    assert Measured(0, 1.0).cpu_state() == {}


def test_results_written_before_the_cpu_readings_still_read(tmp_path):
    old = SystemResult("sync", None, samples_per_s=10.0).to_json()
    del old["cpu_state"]
    assert SystemResult.from_json(old).cpu_state == {}


def _result(folder: Path, system: str, rate: float | None, *, when: float, failed=None) -> None:
    result = SystemResult(system, failed, samples_per_s=rate, startup_s=100.0)
    result.gpu_state = {"sm_clock_mhz_median": 1980.0, "temp_c_max": 50.0 + when}
    result.cpu_state = {"cpu_busy_before": 0.01 * when, "cpu_busy_median": 0.5}
    path = folder / system / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result.to_json()))
    os.utime(path, (when, when))


def test_ratios_pair_the_systems_of_each_repeat(tmp_path):
    one, two, three = (tmp_path / f"r{i}" for i in (1, 2, 3))
    _result(one, "verl", 10.0, when=1)
    _result(one, "sync", 20.0, when=2)
    _result(two, "sync", 15.0, when=3)  # a slow sitting slows both
    _result(two, "verl", 5.0, when=4)
    _result(three, "verl", 10.0, when=5)
    _result(three, "sync", None, when=6, failed="exit 1")
    summary = rep.summarize_repeats([rep.read_repeat(f) for f in (one, two, three)])
    ratio = summary.ratios["sync_over_verl samples_per_s"]
    assert (ratio.n, ratio.mean, ratio.low, ratio.high) == (2, 2.5, 2.0, 3.0)
    verl = summary.systems["verl"]["samples_per_s"]
    assert (verl.n, verl.low, verl.high) == (3, 5.0, 10.0)
    assert summary.systems["sync"]["samples_per_s"].n == 2  # the failed run adds nothing
    assert summary.systems["verl"]["temp_c_max"].high == 55.0
    assert summary.systems["verl"]["cpu_busy_before"].high == 0.05
    assert summary.orders == [["verl", "sync"], ["sync", "verl"], ["verl", "sync"]]


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    _result(tmp_path / "r1", "verl", 10.0, when=1)
    _result(tmp_path / "r1", "fully_async", 30.0, when=2)
    out = tmp_path / "s.json"
    assert rep.main([str(tmp_path / "r1"), f"json={out}"]) == 0
    text = capsys.readouterr().out
    assert "fully_async_over_verl samples_per_s: 3.00 [3.00-3.00]x (n=1)" in text
    assert "repeat 1 order: verl, fully_async" in text
    assert json.loads(out.read_text())["ratios"]["fully_async_over_verl samples_per_s"]["n"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [([], "usage"), (["nowhere"], "not a folder: nowhere"), (["r", "colour=red"], "colour=red")],
)
def test_bad_arguments_get_one_line_and_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        rep.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
