"""The tiny default model's build is reproducible: its child process gets the pinned numerics
whatever the caller's environment says, and the seeded init + SFT give the same bits twice."""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from recipe import tiny
from recipe.tiny import arithmetic, cache


class _FakeRun:
    """Records what ``subprocess.run`` was called with and exits with ``returncode``."""

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, cmd: list[str], *, env: dict[str, str], check: bool):
        self.calls.append((cmd, env))
        return subprocess.CompletedProcess(cmd, self.returncode)


def _has_avx2() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return "avx2" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def test_build_child_gets_build_env_over_the_callers_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    fake = _FakeRun(returncode=0)
    monkeypatch.setattr(cache.subprocess, "run", fake)
    cache.build_in_child(tmp_path)
    [(cmd, env)] = fake.calls
    assert cmd == [sys.executable, "-m", "recipe.tiny", "--build-into", str(tmp_path)]
    assert {k: env[k] for k in tiny.BUILD_ENV} == tiny.BUILD_ENV
    package_root = str(Path(tiny.__file__).resolve().parents[2])
    assert env["PYTHONPATH"].split(os.pathsep) == [package_root, "/somewhere/else"]


def test_failed_build_child_raises_with_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cache.subprocess, "run", _FakeRun(returncode=3))
    with pytest.raises(RuntimeError, match=r"exit 3.*--build-into"):
        cache.build_in_child(tmp_path)


def test_a_variant_builder_gets_its_module_and_arguments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _FakeRun(returncode=0)
    monkeypatch.setattr(cache.subprocess, "run", fake)
    cache.build_in_child(tmp_path, "recipe.tiny.calculator", ("--base", "/b"))
    [(cmd, _)] = fake.calls
    assert cmd[1:] == [
        "-m",
        "recipe.tiny.calculator",
        "--build-into",
        str(tmp_path),
        "--base",
        "/b",
    ]


@pytest.mark.model  # a child process that imports torch
@pytest.mark.skipif(not _has_avx2(), reason="BUILD_ENV pins AVX2 kernels: needs an x86-64 AVX2 CPU")
def test_torch_in_a_build_env_child_runs_avx2_kernels() -> None:
    """ATen reads ATEN_CPU_CAPABILITY once, at start-up: this is why the build is a child."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, **tiny.BUILD_ENV}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "AVX2"


@pytest.mark.model  # builds and trains the tiny model twice
def test_seeded_init_and_sft_give_the_same_weights_twice(tmp_path: Path) -> None:
    import torch

    spec = dataclasses.replace(tiny.TinySpec(), sft_steps=3, sft_batch_size=64)
    tokenizer = tiny.build_tokenizer(tmp_path, model_max_length=spec.max_position_embeddings)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(spec.num_threads)
    try:
        runs = []
        for _ in range(2):
            model = arithmetic._init_model(spec, tokenizer)
            arithmetic._sft(spec, model, tokenizer)
            runs.append([p.detach().clone() for p in model.parameters()])
    finally:
        torch.set_num_threads(prev_threads)
    first, second = runs
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
