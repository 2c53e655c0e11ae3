"""One system's run, measured from outside the same way for every system.

    before the launch: the machine's CPUs' busy share over CPU_BEFORE_S (what an earlier
      |  system left running would show here)
    launch (t=0) --subprocess--> the system's own command, its output in RUN_DIR/run.log
      |  every POLL_S: the GPU's used memory (nvidia-smi; the peak over the run, less what
      |  was in use before the launch), its SM clock and temperature, the CPUs' busy share
      |  since the last poll (/proc/stat), and the line count of the system's per-step
      |  metrics file (each new line: the time its step ended, as seen from here)
      v
    exit --> Measured(rc, wall_s, step_end_s, peak_gpu_mib, clocks)
      |  at a deadline the whole tree is killed: its process group, and every process it
      |  started in a session of its own (Ray's workers, the engines' processes)
      v
    settle: wait (at most SETTLE_S) for the GPU's used memory to fall back to what was in use
    before the launch, so the next system's baseline and peak are its own

The step-end times come from the file's growth, not from each system's clock, so the
start-up time (launch to the first step's start: the first step's end less its own duration)
is measured the same way for a system whatever it logs. Every run has a deadline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from recipe.utils.process_tree import kill_tree

POLL_S = 0.5
LOG_FILE = "run.log"
SETTLE_S = 60.0
SETTLE_SLACK_MIB = 1024.0
"""Memory above the launch's baseline still counted as settled (a driver's context)."""
CPU_BEFORE_S = 1.0
PROC_STAT = Path("/proc/stat")


@dataclass(slots=True)
class Measured:
    """What the harness saw of one run."""

    returncode: int | None
    """The command's exit code; None: killed at its deadline."""
    wall_s: float
    """Launch to exit, seconds."""
    step_end_s: list[float] = field(default_factory=list)
    """Seconds from launch to the moment each per-step metrics line appeared."""
    peak_gpu_mib: float | None = None
    """Peak GPU memory in use during the run less what was in use before it (all GPUs
    summed; None: no nvidia-smi)."""
    left_gpu_mib: float | None = None
    """GPU memory the run still held ``SETTLE_S`` after its exit, above the baseline and its
    slack (None: none, or no nvidia-smi)."""
    gpu_samples: list[GpuSample] = field(default_factory=list)
    """The GPU's state at each poll (empty: no nvidia-smi)."""
    cpu_busy_before: float | None = None
    """The CPUs' busy share (0-1, all CPUs) in the ``CPU_BEFORE_S`` before the launch (None:
    no /proc/stat)."""
    cpu_busy: list[float] = field(default_factory=list)
    """The CPUs' busy share between consecutive polls of the run."""

    def gpu_state(self) -> dict[str, float]:
        """The run's clocks and temperatures: ``sm_clock_mhz_{median,min}``,
        ``temp_c_{start,max}``, ``power_w_median`` (empty without samples)."""
        if not self.gpu_samples:
            return {}
        clocks = sorted(s.sm_clock_mhz for s in self.gpu_samples)
        powers = sorted(s.power_w for s in self.gpu_samples)
        return {
            "sm_clock_mhz_median": clocks[len(clocks) // 2],
            "sm_clock_mhz_min": clocks[0],
            "temp_c_start": self.gpu_samples[0].temp_c,
            "temp_c_max": max(s.temp_c for s in self.gpu_samples),
            "power_w_median": powers[len(powers) // 2],
        }

    def cpu_state(self) -> dict[str, float]:
        """The CPUs' busy share before the launch and its median over the run:
        ``cpu_busy_{before,median}`` (those measured)."""
        state = {} if self.cpu_busy_before is None else {"cpu_busy_before": self.cpu_busy_before}
        if self.cpu_busy:
            state["cpu_busy_median"] = sorted(self.cpu_busy)[len(self.cpu_busy) // 2]
        return {k: round(v, 3) for k, v in state.items()}


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One nvidia-smi reading over every GPU: memory summed, clock the slowest GPU's,
    temperature the hottest's, power summed."""

    used_mib: float
    sm_clock_mhz: float
    temp_c: float
    power_w: float


GPU_QUERY = "--query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw"


def read_gpu() -> GpuSample | None:
    """The GPUs' state now; None without nvidia-smi or when it gives no reading."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", GPU_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return parse_gpu_query(out)


def parse_gpu_query(out: str) -> GpuSample | None:
    """``read_gpu``'s reading of nvidia-smi's CSV, one line per GPU; a field it cannot read
    ("[N/A]") counts as 0 (None when no line has a memory figure)."""
    rows = [[_number(x) for x in line.split(",")] for line in out.splitlines() if line.strip()]
    rows = [r + [0.0] * (4 - len(r)) for r in rows if r and r[0] is not None]
    if not rows:
        return None
    values = [[0.0 if x is None else x for x in r] for r in rows]
    return GpuSample(
        used_mib=sum(r[0] for r in values),
        sm_clock_mhz=min(r[1] for r in values),
        temp_c=max(r[2] for r in values),
        power_w=sum(r[3] for r in values),
    )


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def gpu_used_mib() -> float | None:
    """Memory in use on every GPU, summed (MiB); None without nvidia-smi."""
    sample = read_gpu()
    return None if sample is None else sample.used_mib


def read_cpu_times(path: Path = PROC_STAT) -> tuple[float, float] | None:
    """``(busy, total)`` jiffies of every CPU so far (``/proc/stat``'s first line; idle and
    iowait are not busy); None where it cannot be read."""
    try:
        fields = path.read_text().splitlines()[0].split()
        values = [float(x) for x in fields[1:]]
    except (OSError, IndexError, ValueError):
        return None
    if fields[0] != "cpu" or len(values) < 4:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)
    total = sum(values[:8])  # guest time is counted inside user time already
    return total - idle, total


def busy_share(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> float | None:
    """The CPUs' busy share between two ``read_cpu_times`` readings (None: either missing or
    no time between them)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def run_measured(
    command: list[str],
    run_dir: Path,
    *,
    metrics_file: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Measured:
    """Run ``command`` (output in ``run_dir/run.log``) under ``timeout_s``, watching the GPU
    and ``metrics_file`` (one line per step)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    baseline = gpu_used_mib()
    cpu_start = read_cpu_times()
    time.sleep(CPU_BEFORE_S)
    state = _Watch(metrics_file, baseline)
    cpu_before = busy_share(cpu_start, state.cpu_last)
    start = time.monotonic()
    with (run_dir / LOG_FILE).open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ.copy() | (env or {}),
            cwd=cwd,
            start_new_session=True,  # the whole tree goes at a deadline
        )
        watcher = threading.Thread(target=state.watch, args=(start, proc), daemon=True)
        watcher.start()
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            returncode = None
        watcher.join(timeout=30)
    state.poll(start)  # the last lines, written just before the exit
    wall_s = time.monotonic() - start
    peak = None if baseline is None or state.peak is None else max(0.0, state.peak - baseline)
    left = None if baseline is None else settle_gpu(baseline)
    return Measured(
        returncode,
        wall_s,
        state.step_end_s,
        peak,
        left,
        state.samples,
        cpu_busy_before=cpu_before,
        cpu_busy=state.cpu_busy,
    )


def settle_gpu(baseline_mib: float) -> float | None:
    """Wait at most ``SETTLE_S`` for the GPUs' used memory to fall back to ``baseline_mib``
    (plus ``SETTLE_SLACK_MIB``); the memory still held above it at the deadline, else None."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        used = gpu_used_mib()
        if used is None or used <= baseline_mib + SETTLE_SLACK_MIB:
            return None
        if time.monotonic() >= deadline:
            return used - baseline_mib
        time.sleep(POLL_S)


class _Watch:
    def __init__(self, metrics_file: Path, baseline: float | None):
        self.metrics_file = metrics_file
        self.peak = baseline
        self.step_end_s: list[float] = []
        self.samples: list[GpuSample] = []
        self._gpu = baseline is not None
        self.cpu_last = read_cpu_times()
        self.cpu_busy: list[float] = []

    def watch(self, start: float, proc: subprocess.Popen) -> None:
        while proc.poll() is None:
            self.poll(start)
            time.sleep(POLL_S)

    def poll(self, start: float) -> None:
        now = time.monotonic() - start
        lines = count_lines(self.metrics_file)
        self.step_end_s += [now] * (lines - len(self.step_end_s))
        cpu_now = read_cpu_times()
        if (share := busy_share(self.cpu_last, cpu_now)) is not None:
            self.cpu_busy.append(share)
            self.cpu_last = cpu_now
        if self._gpu and (sample := read_gpu()) is not None:
            self.samples.append(sample)
            if self.peak is None or sample.used_mib > self.peak:
                self.peak = sample.used_mib
