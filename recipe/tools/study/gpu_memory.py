"""Each GPU process's memory beside a run, and its peak by role (``nvidia-smi``).

    with GpuProcessMemory(path):   a line per GPU process per second: unix seconds, pid,
        ...                        MiB used, role (trainer, engine, other)
    peaks(path) -> {"trainer": MiB, "engine": MiB, "other": MiB, "all": MiB}
                                   each role's largest single process, and the largest sum
                                   over every process at one instant ("all")

    python -m recipe.tools.study.gpu_memory OUT.csv -- COMMAND ...
                                   runs COMMAND while sampling; prints the peaks as JSON and
                                   exits with COMMAND's code

The role comes from the process's command line: vLLM names its engine process
``VLLM::EngineCore`` (``engine``), Ray names an actor's process after its class
(``ray::TrainerWorker...``: ``trainer``). So the memory a run's trainer and engine held is a
measurement, also for a run that failed (a full fine-tuning that runs out of memory beside its
engine shows what each held up to the failure). Without ``nvidia-smi`` (the CPU) nothing is
sampled and ``peaks`` is ``{}``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import TracebackType

from recipe.tools.cli import exit_on_help

QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
ROLES = (("EngineCore", "engine"), ("VLLM", "engine"), ("Trainer", "trainer"))
"""(substring of the command line, role), first match wins; no match: ``other``."""


def role_of(command: str) -> str:
    """The role of a process by its command line (module docstring)."""
    return next((role for mark, role in ROLES if mark in command), "other")


def parse_apps(text: str) -> list[tuple[int, int]]:
    """(pid, MiB) of each line of ``nvidia-smi``'s compute-apps query; lines it could not
    read (``[N/A]``, a torn line) are left out."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            rows.append((int(parts[0]), int(parts[1])))
    return rows


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


class GpuProcessMemory:
    """Samples every ``interval_s`` into ``path`` for the duration of the ``with`` block."""

    def __init__(self, path: Path, *, interval_s: float = 1.0) -> None:
        self.path, self.interval_s = Path(path), interval_s
        self._smi = shutil.which("nvidia-smi")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuProcessMemory:
        if self._smi is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _sample(self) -> None:
        assert self._smi is not None
        roles: dict[int, str] = {}
        with self.path.open("a", encoding="utf-8") as out:
            while not self._stop.is_set():
                proc = subprocess.run(
                    [self._smi, *QUERY], capture_output=True, text=True, timeout=30, check=False
                )
                now = time.time()
                for pid, mib in parse_apps(proc.stdout):
                    role = roles.setdefault(pid, role_of(_command_line(pid)))
                    out.write(f"{now:.3f},{pid},{mib},{role}\n")
                out.flush()
                self._stop.wait(self.interval_s)


def peaks(path: Path) -> dict[str, int]:
    """Each role's largest process and the largest instant sum, in MiB (module docstring)."""
    if not Path(path).is_file():
        return {}
    largest: dict[str, int] = defaultdict(int)
    at_instant: dict[str, int] = defaultdict(int)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split(",")
        if len(parts) != 4 or not parts[2].isdigit():
            continue  # a torn last line
        instant, _, mib, role = parts
        largest[role] = max(largest[role], int(mib))
        at_instant[instant] += int(mib)
    if not at_instant:
        return {}
    return dict(sorted(largest.items())) | {"all": max(at_instant.values())}


def main(argv: list[str]) -> int:
    exit_on_help(argv, __doc__)
    if len(argv) < 3 or argv[1] != "--":
        print(
            "error: usage: python -m recipe.tools.study.gpu_memory OUT.csv -- COMMAND ...",
            file=sys.stderr,
        )
        return 2
    out = Path(argv[0])
    with GpuProcessMemory(out):
        code = subprocess.run(argv[2:], check=False).returncode
    print(json.dumps({"gpu_memory_mib": peaks(out), "returncode": code}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
