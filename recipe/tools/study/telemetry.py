"""GPU clocks, temperature, power and use sampled beside a study's run (``nvidia-smi``).

    with GpuTelemetry(run_dir / "gpu.csv"):   one line per GPU per second, while the run trains
        ...
    summarize(path) -> {"gpus": ..., "sm_clock_mhz": {"median", "min"}, "temperature_c":
                        {"max", "mean"}, "power_w": {"mean"}, "utilization": {"mean"}}

So a sceptic can see whether two runs met the same machine: a throttled clock or a hot GPU
shows in the run's record. A machine without ``nvidia-smi`` (the CPU) records none, and says
so (``summarize`` returns ``{"gpus": 0}``). ``device_name`` names the cards, which every run
of a study must share.
"""

from __future__ import annotations

import csv
import shutil
import statistics
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

FIELDS = ("index", "clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "utilization.gpu")
QUERY = ["--query-gpu=timestamp," + ",".join(FIELDS), "--format=csv,noheader,nounits"]


def device_name() -> str:
    """The machine's accelerators as one string, "1 x NVIDIA H200" (the card's name and
    how many); "cpu" without ``nvidia-smi`` or when it answers nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    names = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not names:
        return "cpu"
    kinds = sorted(set(names))
    return ", ".join(f"{names.count(name)} x {name}" for name in kinds)


class GpuTelemetry:
    """``nvidia-smi -l 1`` into ``path`` for the duration of the ``with`` block."""

    def __init__(self, path: Path, *, interval_ms: int = 1000) -> None:
        self.path, self.interval_ms = Path(path), interval_ms
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GpuTelemetry:
        smi = shutil.which("nvidia-smi")
        if smi is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("wb") as out:
                self._proc = subprocess.Popen(
                    [smi, *QUERY, f"-lms={self.interval_ms}"],
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def summarize(path: Path) -> dict[str, Any]:
    """The run's telemetry in a few numbers (module docstring)."""
    if not Path(path).is_file():
        return {"gpus": 0}
    rows = []
    with Path(path).open(encoding="utf-8") as stream:
        for row in csv.reader(stream):
            try:
                rows.append([float(v) for v in row[1:]])
            except ValueError:  # a torn last line, or "[N/A]" from a GPU that hides a value
                continue
    if not rows:
        return {"gpus": 0}
    index, sm, mem, temp, power, util = (list(col) for col in zip(*rows, strict=True))
    return {
        "gpus": len(set(index)),
        "samples": len(rows),
        "sm_clock_mhz": {"median": statistics.median(sm), "min": min(sm)},
        "mem_clock_mhz": {"median": statistics.median(mem)},
        "temperature_c": {"max": max(temp), "mean": statistics.fmean(temp)},
        "power_w": {"mean": statistics.fmean(power), "max": max(power)},
        "utilization": {"mean": statistics.fmean(util)},
    }
