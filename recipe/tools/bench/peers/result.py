"""One system's figures, computed the same way from whatever it logs.

Each system's reader turns its metrics into ``StepRow``s (its own names mapped onto ``PHASES``),
one per trainer step, each with the metrics-file line that ended it; a system that logs once per
several steps (verl's fully async trainer: once per weight sync) gives those steps one line.
``summarize`` then applies one rule to all of them:

    steady rates     samples and generated tokens of the steady steps, over the harness's wall
                     time from the end of the last warm-up line to the end of the last steady
                     line. Warm-up: the first ``warmup_steps`` steps, rounded up to the end of a
                     line. Steady: the steps after it, less those of the last line, since a
                     system may validate before writing its last line (verl does) and another
                     after (ours): no validation falls inside any system's window
    start-up         launch to the first step's start: the harness saw the first line at t1,
                     and the steps it ended took their summed step_s, so t1 - that sum
    phases           mean seconds per steady step of each phase, as the system times it
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipe.tools.bench.peers.measure import Measured

PHASES = ("gen", "wait", "old_log_prob", "ref", "update", "sync")
"""Phases of a step: generation (in-line, sync systems), waiting for rollouts (fully async),
old log-probs, reference log-probs, the actor update, the weight sync to the engine."""


@dataclass(frozen=True, slots=True)
class StepRow:
    """One trainer step as a system logged it."""

    step_s: float
    samples: int
    gen_tokens: float
    """Response tokens generated for this step's samples."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per ``PHASES`` key the system reports (others absent)."""


@dataclass(slots=True)
class SystemResult:
    system: str
    failed: str | None
    """Why the run gave no figures (None: it did)."""
    steps: int = 0
    samples: int = 0
    wall_s: float = 0.0
    startup_s: float | None = None
    samples_per_s: float | None = None
    gen_tokens_per_s: float | None = None
    step_s: float | None = None
    """Mean seconds per steady step."""
    phases_s: dict[str, float] = field(default_factory=dict)
    peak_gpu_mib: float | None = None
    val_accuracy: float | None = None
    notes: list[str] = field(default_factory=list)
    gpu_state: dict[str, float] = field(default_factory=dict)
    """The GPU's clocks and temperatures over the run (``Measured.gpu_state``)."""
    cpu_state: dict[str, float] = field(default_factory=dict)
    """The CPUs' busy share before the launch and over the run (``Measured.cpu_state``)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SystemResult:
        return cls(**data)


def read_metric_records(path: Path) -> list[dict[str, Any]]:
    """A metrics file's records; a last line cut short (a run killed while writing it) is left
    out, any other bad line raises."""
    lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    records = []
    for index, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if index < len(lines) - 1:
                raise
    return records


def summarize(
    system: str,
    measured: Measured,
    rows: list[StepRow],
    *,
    line_of_step: list[int],
    warmup_steps: int,
    val_accuracy: float | None,
) -> SystemResult:
    """The figures of one run. ``line_of_step[i]``: the metrics-file line (0-based) that
    ended step i, so ``measured.step_end_s`` gives its end time."""
    result = SystemResult(system, None, steps=len(rows), wall_s=round(measured.wall_s, 1))
    result.samples = sum(r.samples for r in rows)
    result.peak_gpu_mib = measured.peak_gpu_mib
    result.gpu_state = measured.gpu_state()
    result.cpu_state = measured.cpu_state()
    result.val_accuracy = val_accuracy
    ends = [measured.step_end_s[i] for i in line_of_step if i < len(measured.step_end_s)]
    if not rows or len(ends) < len(rows):
        result.failed = f"{len(rows)} steps logged, {len(ends)} seen ending"
        return result
    # the steps the first line ended: launch to their start is the start-up
    first_s = sum(
        r.step_s for r, line in zip(rows, line_of_step, strict=True) if line == line_of_step[0]
    )
    result.startup_s = round(max(0.0, ends[0] - first_s), 1)
    warm, stop = steady_window(line_of_step, warmup_steps)
    begin = ends[warm - 1] if warm else ends[0] - first_s
    steady = rows[warm:stop]
    span_s = ends[stop - 1] - begin
    if span_s > 0:
        result.samples_per_s = round(sum(r.samples for r in steady) / span_s, 3)
        result.gen_tokens_per_s = round(sum(r.gen_tokens for r in steady) / span_s, 1)
    result.step_s = round(sum(r.step_s for r in steady) / len(steady), 3)
    for phase in PHASES:
        values = [r.phases_s[phase] for r in steady if phase in r.phases_s]
        if values:
            result.phases_s[phase] = round(sum(values) / len(steady), 3)
    return result


def steady_window(line_of_step: list[int], warmup_steps: int) -> tuple[int, int]:
    """``(warm, stop)``: the steady steps are ``[warm, stop)`` (module docstring). Each bound
    falls at the end of a line; with too few lines the window keeps the last line, then the
    warm-up's, so that it is never empty."""
    ends = [i + 1 for i in range(len(line_of_step) - 1) if line_of_step[i] != line_of_step[i + 1]]
    ends.append(len(line_of_step))  # the step index after each line's last step
    warm = next((e for e in ends if e >= warmup_steps), ends[-1]) if warmup_steps else 0
    stop = max((e for e in ends if e < len(line_of_step)), default=len(line_of_step))
    if stop <= warm:  # no whole line between the warm-up and the last line
        stop = len(line_of_step)
    if warm >= stop:
        warm = ends[-2] if len(ends) > 1 else 0
    return warm, stop
