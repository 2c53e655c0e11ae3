"""``python -m recipe.tools.study.pair BASE OTHER [skip_steps=2] [resamples=10000] [seed=0]``:
two runs of the same steps side by side, step by step, from their records alone.

Each of BASE and OTHER is a run directory (or a folder holding its ``metrics.jsonl`` and
``summary.json``). The table gives each figure of both runs and OTHER / BASE::

    samples/s over the steps      trained samples / the steps' summed ``timing/step_s``: the
                                  wall clock without start-up and the final validation
    steady samples/s              the same over the steps after ``skip_steps`` (start-up and
                                  a filling pipeline out), with a 95% interval of the ratio:
                                  the steps resampled by index, both runs together (paired)
    tokens/s over the steps       trained tokens (``throughput/tokens``) likewise
    timing/*_s                    every phase either run times, summed over its steps
    trainer wait                  the mean share of a step after step 1 the trainer waited
                                  for its batch (``trainer/idle_ratio``)
    start-up, wall                ``startup/to_first_step_s`` and ``wall_s`` of the summaries

The interval holds the variation between the steps of these two runs only, not between
repeated runs: it says whether the gap is steady across steps, not what another run would
give. Runs whose step numbers differ are refused. Bad input: one ``error:`` line, exit code 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.tools.cli import fail, parse_pairs

KEYS = {"skip_steps": 2, "resamples": 10_000, "seed": 0}


@dataclass(frozen=True, slots=True)
class Steps:
    """One run's per-step records (in step order) and its summary."""

    name: str
    rows: list[dict[str, Any]]
    summary: dict[str, Any]

    def total(self, key: str, indices: Sequence[int] | None = None) -> float:
        chosen = range(len(self.rows)) if indices is None else indices
        return float(sum(self.rows[i].get(key, 0.0) for i in chosen))

    def rate(self, key: str, indices: Sequence[int] | None = None) -> float:
        seconds = self.total("timing/step_s", indices)
        return self.total(key, indices) / seconds if seconds > 0 else math.nan


def read_steps(path: Path) -> Steps:
    """A run's records; ``ValueError`` naming the path when they are missing or unreadable."""
    metrics, summary = path / "metrics.jsonl", path / "summary.json"
    if not metrics.is_file():
        raise ValueError(f"{path}: no metrics.jsonl")
    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        meta = json.loads(summary.read_text()) if summary.is_file() else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: a record is not JSON ({err})") from None
    steps = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    if not steps:
        raise ValueError(f"{path}: no training step in metrics.jsonl")
    return Steps(path.name, sorted(steps, key=lambda r: r["step"]), meta)


def labels(paths: Sequence[Path]) -> list[str]:
    """Column names: the folders' names, with their parents' where the names alone are equal
    (``rule-1/run`` and ``judge-1/run``)."""
    names = [p.resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]


def paired_interval(
    statistic: Callable[[Sequence[int]], float],
    indices: Sequence[int],
    *,
    resamples: int,
    seed: int,
) -> tuple[float, float]:
    """95% percentile interval of ``statistic`` over ``indices`` drawn with replacement."""
    rng = random.Random(seed)
    values = sorted(statistic([rng.choice(indices) for _ in indices]) for _ in range(resamples))
    return values[math.floor(0.025 * (resamples - 1))], values[math.ceil(0.975 * (resamples - 1))]


def table(base: Steps, other: Steps, *, skip_steps: int, resamples: int, seed: int) -> list[str]:
    """The comparison's lines (module docstring)."""
    if [r["step"] for r in base.rows] != [r["step"] for r in other.rows]:
        raise ValueError(
            f"{base.name} trained steps {[r['step'] for r in base.rows]}, {other.name} "
            f"{[r['step'] for r in other.rows]}: a pair needs the same steps"
        )
    steady = [i for i, r in enumerate(base.rows) if r["step"] > skip_steps]
    if len(steady) < 2:
        raise ValueError(f"skip_steps={skip_steps} leaves {len(steady)} steps: need 2")
    samples = "throughput/samples"

    def ratio(indices: Sequence[int]) -> float:
        return other.rate(samples, indices) / base.rate(samples, indices)

    low, high = paired_interval(ratio, steady, resamples=resamples, seed=seed)
    rows: list[tuple[str, float, float, str]] = [
        ("samples/s over the steps", base.rate(samples), other.rate(samples), ""),
        (
            f"steady samples/s (steps > {skip_steps})",
            base.rate(samples, steady),
            other.rate(samples, steady),
            f"  95% [{low:.3f}, {high:.3f}] over {len(steady)} paired steps",
        ),
        (
            "tokens/s over the steps",
            base.rate("throughput/tokens"),
            other.rate("throughput/tokens"),
            "",
        ),
    ]
    phases = sorted(
        {k for s in (base, other) for r in s.rows for k in r if k.startswith("timing/")}
    )
    rows += [(f"{key}, summed", base.total(key), other.total(key), "") for key in phases]
    rows.append(("trainer wait after step 1", _wait(base), _wait(other), ""))
    for key in ("startup/to_first_step_s", "wall_s"):
        rows.append((key, base.summary.get(key, math.nan), other.summary.get(key, math.nan), ""))
    width = max(12, len(base.name), len(other.name)) + 2
    head = f"{'':<40}{base.name:>{width}}{other.name:>{width}}{'other/base':>12}"
    return [head] + [
        f"{label:<40}{a:>{width}.4g}{b:>{width}.4g}{_ratio(a, b):>12.3f}{note}"
        for label, a, b, note in rows
    ]


def _wait(steps: Steps) -> float:
    waits = [r["trainer/idle_ratio"] for r in steps.rows[1:] if "trainer/idle_ratio" in r]
    return sum(waits) / len(waits) if waits else math.nan


def _ratio(a: float, b: float) -> float:
    return b / a if a and math.isfinite(a) and math.isfinite(b) else math.nan


def main(argv: list[str]) -> int:
    paths, pairs = parse_pairs(argv, __doc__, num_positional=min(2, len(argv)))
    if len(paths) != 2 or any("=" in p for p in paths):
        fail("give two run directories, BASE then OTHER")
    keys = dict(KEYS)
    for key, value in pairs:
        if key not in KEYS:
            fail(f"{key}={value}: unknown key (allowed: {', '.join(KEYS)})")
        if not value.isdigit() or (key == "resamples" and int(value) < 1):
            fail(f"{key}={value}: expected a whole number{' >= 1' if key == 'resamples' else ''}")
        keys[key] = int(value)
    try:
        base, other = (
            dataclasses.replace(read_steps(Path(p)), name=name)
            for p, name in zip(paths, labels([Path(p) for p in paths]), strict=True)
        )
        lines = table(base, other, **keys)
    except ValueError as err:
        fail(str(err))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
