"""What a study keeps of a run once it is trained and evaluated: its small records, the
planner's projection and ``record.json`` in ``<records>/runs/<tag>/``, and the archive of
all records that a machine which loses its files hands back (``harness.Harness.keep``).

    <out>/<tag>/ (the run directory)          <records>/runs/<tag>/
      metrics.jsonl, summary.json, config.yaml   --copied-->   the same names
      snapshots/index.jsonl                      --copied-->   snapshots.jsonl
      snapshots/eval.jsonl                       --copied-->   eval.jsonl
      trace.json  --python -m recipe.tools.plan--> plan-gpus{2,4,8}.txt (a projection)
      the harness's record                       --written last--> record.json (marks done)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from recipe.tools.study.estimates import RECORD_FILE
from recipe.tools.study.evaluate import EVAL_FILE

KEPT = {
    "metrics.jsonl": "metrics.jsonl",
    "summary.json": "summary.json",
    "config.yaml": "config.yaml",
    "snapshots/index.jsonl": "snapshots.jsonl",
    f"snapshots/{EVAL_FILE}": EVAL_FILE,
}
"""A run directory's records kept, by the name each gets in the study's records."""
PROJECT_GPUS = (2, 4, 8)


def keep_run(run_dir: Path, dest: Path, record: dict[str, Any]) -> None:
    """Copy ``run_dir``'s small records and the planner's projections into ``dest``, then
    write ``record`` as its ``record.json`` (atomically, last: it marks the run done)."""
    dest.mkdir(parents=True, exist_ok=True)
    for source, name in KEPT.items():
        if (run_dir / source).is_file():
            shutil.copyfile(run_dir / source, dest / name)
    project(run_dir, dest)
    tmp = dest / f".{RECORD_FILE}.partial"
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(dest / RECORD_FILE)


def project(run_dir: Path, dest: Path) -> None:
    """The planner's projection from this run's measured phases (``python -m
    recipe.tools.plan --run``) for each of ``PROJECT_GPUS``, kept as ``plan-gpusN.txt``: a
    projection, stated as one, for the day more GPUs are lent."""
    if not (run_dir / "trace.json").is_file():
        return  # the planner reads the run's phases off its trace
    for gpus in PROJECT_GPUS:
        cmd = [sys.executable, "-m", "recipe.tools.plan", "--run", str(run_dir), f"--gpus={gpus}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        text = proc.stdout if proc.returncode == 0 else f"planner failed:\n{proc.stderr}"
        (dest / f"plan-gpus{gpus}.txt").write_text(text, encoding="utf-8")


def write_archive(records: Path, archive: Path) -> None:
    """``records`` as one ``.tar.gz`` at ``archive``, replaced atomically: what a machine
    that loses its files hands back after each kept run."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(records, arcname=str(records))
    partial.replace(archive)
