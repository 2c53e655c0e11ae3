"""How long a study's next phase may take, so that a call starts only what fits before its
deadline (``harness.Harness.fits``), and how much of an evaluation is worth starting.

    a phase of a run                    its estimate
    -------------------------------     -------------------------------------------------------
    train, a run not begun              1.1 x the longest training process of a kept run of
                                        the mode; before any, the design's run_timeout_s
    train, the next segment of a run    1.1 x (its last segment's start-up + the steps left x
                                        that segment's seconds a step), at most 1.1 x that
                                        segment (a segment that cannot finish runs as long)
    eval                                1.1 x the longest evaluation of a kept run of the
                                        mode; before any, the design's eval_timeout_s

Why the own estimate of a segmented run: its later segments resume a run whose speed on this
machine is already measured, and the last one trains only the steps that remain. Seen on one
H100 (GSM8K at 2,048 tokens): the first segment 526 s for 28 of 32 steps, the second 172 s,
which the design's 540 s would have refused with anything under 540 s left.

An evaluation resumes where it stopped (``evaluate``: each point is written as it is scored),
so one that does not fit whole still starts when ``EVAL_MIN_S`` are left: its points count,
the next call scores the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipe.tools.study.design import StudyDesign

MARGIN = 1.1
"""Every estimate's headroom over what was measured."""
EVAL_MIN_S = 120.0
"""The least time left that starts an evaluation that may not finish: the engine's start-up
(45-60 s on one H100 or H200) plus one snapshot scored, with room to spare."""
RUNS_DIR = "runs"
RECORD_FILE = "record.json"
"""A kept run's record, ``<records>/runs/<tag>/record.json``: written last, it marks the run
done."""


def mode_estimate_s(records: Path, design: StudyDesign, phase: str, mode: str) -> float:
    """1.1 x the longest ``phase`` ("train": one training process, a run or a segment;
    "eval") of a kept run of ``mode`` under ``records/runs``; before any, the design's
    limit for it."""
    taken = []
    for path in (records / RUNS_DIR).glob(f"*/{RECORD_FILE}"):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["mode"] == mode:
            seconds = record["seconds"]
            key = "train_process_max" if phase == "train" else phase
            taken.append(seconds.get(key, seconds[phase]))
    if taken:
        return MARGIN * max(taken)
    return design.run_timeout_s if phase == "train" else design.eval_timeout_s


def segment_estimate_s(run_dir: Path, trained: dict[str, Any], total_steps: int) -> float | None:
    """The next segment of a run trained in segments, from its last one (module docstring);
    None when no segment is done or its records do not say how far it got."""
    segments_s = trained.get("segments_s") or []
    k = len(segments_s)
    if not k:
        return None
    last, before = _summary(run_dir, k), _summary(run_dir, k - 1) if k > 1 else {}
    if not last or "steps" not in last:
        return None
    steps = int(last["steps"])
    steps_in_segment = steps - int(before.get("steps", 0))
    if steps_in_segment <= 0:
        return None
    seconds = float(segments_s[-1])
    startup_s = min(float(last.get("startup/to_first_step_s") or 0.0), seconds)
    step_s = (seconds - startup_s) / steps_in_segment
    needed_s = startup_s + max(total_steps - steps, 0) * step_s
    return MARGIN * min(needed_s, seconds)


def _summary(run_dir: Path, segment: int) -> dict[str, Any]:
    """An earlier segment's summary (``summary-<segment>.json``, kept aside by the harness)."""
    path = run_dir / f"summary-{segment}.json"
    if not path.is_file():
        return {}
    summary: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return summary
