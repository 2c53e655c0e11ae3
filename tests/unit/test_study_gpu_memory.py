"""GPU memory per process and role beside a run (recipe/tools/study/gpu_memory.py), with a fake
``nvidia-smi`` on PATH: the sampler, the roles, the peaks and the command wrapper."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from recipe.tools.study import gpu_memory
from recipe.tools.study.gpu_memory import GpuProcessMemory, parse_apps, peaks, role_of


def test_roles_come_from_the_command_line():
    assert role_of("VLLM::EngineCore") == "engine"
    assert role_of("ray::TrainerWorker.update_policy") == "trainer"
    assert role_of("ray::VLLMRolloutWorker.generate") == "engine"
    assert role_of("python -m recipe") == "other"


def test_unreadable_lines_of_the_query_are_left_out():
    assert parse_apps("12, 300\n[N/A], 5\n13, [N/A]\n\n14,7") == [(12, 300), (14, 7)]


def test_peaks_are_the_largest_process_per_role_and_the_largest_instant_sum(tmp_path):
    path = tmp_path / "mem.csv"
    path.write_text(
        "1.000,10,100,trainer\n1.000,11,50,engine\n"
        "2.000,10,80,trainer\n2.000,11,90,engine\n2.000,12,5,other\n3.000,10,1"
    )
    assert peaks(path) == {"engine": 90, "other": 5, "trainer": 100, "all": 175}
    assert peaks(tmp_path / "absent.csv") == {}


@pytest.fixture
def fake_smi(tmp_path, monkeypatch) -> None:
    """An ``nvidia-smi`` that reports this test process holding 2048 MiB."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\necho '{os.getpid()}, 2048'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")


def test_the_sampler_writes_a_line_per_process_each_interval(fake_smi, tmp_path):
    path = tmp_path / "mem.csv"
    with GpuProcessMemory(path, interval_s=0.05):
        deadline = 50
        while deadline and (not path.is_file() or len(path.read_text().splitlines()) < 2):
            deadline -= 1
            time.sleep(0.1)
    lines = path.read_text().splitlines()
    assert len(lines) >= 2
    assert all(line.split(",")[1:] == [str(os.getpid()), "2048", "other"] for line in lines)
    assert peaks(path) == {"other": 2048, "all": 2048}


def test_the_wrapper_runs_the_command_and_keeps_its_exit_code(fake_smi, tmp_path, capsys):
    out = tmp_path / "mem.csv"
    code = gpu_memory.main(
        [str(out), "--", sys.executable, "-c", "import time; time.sleep(1.5); exit(3)"]
    )
    assert code == 3
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == {"gpu_memory_mib": {"other": 2048, "all": 2048}, "returncode": 3}


def test_without_nvidia_smi_nothing_is_sampled(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    path = tmp_path / "mem.csv"
    with GpuProcessMemory(path):
        pass
    assert not Path(path).exists() and peaks(path) == {}


def test_a_bad_command_line_is_a_usage_error(capsys):
    assert gpu_memory.main(["out.csv", "python"]) == 2
    assert "usage" in capsys.readouterr().err
