"""One training run of a study: ``python -m recipe ...`` in a subprocess, its output in
``RUN_DIR/study.log``, under a deadline. Shared by every study module."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

LOG_FILE = "study.log"


def run_logged(command: list[str], run_dir: Path, *, timeout_s: float) -> tuple[str | None, float]:
    """Run ``command`` with its output in ``run_dir/study.log``: (None, seconds) when it ended
    with a ``summary.json`` written, else (why it failed, seconds)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (run_dir / LOG_FILE).open("w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                env=os.environ.copy(),
                check=False,
            )
            failed = f"exit {proc.returncode}" if proc.returncode != 0 else None
        except subprocess.TimeoutExpired:
            failed = f"past timeout_s={timeout_s:.0f}"
    if failed is None and not (run_dir / "summary.json").is_file():
        failed = "no summary.json"
    return failed, time.perf_counter() - start
