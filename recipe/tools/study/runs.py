"""One training run of a study: ``python -m recipe ...`` in a subprocess, its output in
``RUN_DIR/study.log``, under a deadline (past it, the run and every process it started are
killed). Shared by every study module."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from recipe.utils.process_tree import kill_tree

LOG_FILE = "study.log"
TIMED_OUT = "past timeout_s"
"""How ``run_logged``'s reason begins when the command ran past its ``timeout_s``."""


def run_logged(
    command: list[str],
    run_dir: Path,
    *,
    timeout_s: float,
    log_file: str = LOG_FILE,
    result: str = "summary.json",
) -> tuple[str | None, float]:
    """Run ``command`` with its output in ``run_dir/<log_file>``: (None, seconds) when it
    ended with ``run_dir/<result>`` written, else (why it failed, seconds)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (run_dir / log_file).open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
            start_new_session=True,  # leads its group: kill_tree takes it and what it started
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
            failed = f"exit {returncode}" if returncode != 0 else None
        except subprocess.TimeoutExpired:
            # Ray's processes and the engines outlive a plain kill and hold the GPU the next
            # run of the study would be measured on
            kill_tree(proc.pid)
            proc.wait()
            failed = f"{TIMED_OUT}={timeout_s:.0f}"
    if failed is None and not (run_dir / result).is_file():
        failed = f"no {result}"
    return failed, time.perf_counter() - start
