"""``python -m recipe.tools.bench.peers.repeats OUT [OUT ...] [json=PATH]``: several repeats of
the peer benchmark in one table.

    each OUT: one repeat's ``out=`` folder, OUT/<system>/result.json per finished system
    --> per system: each figure's mean over the repeats and its range, the run order
    --> per ratio of ``report.PAIRS``: the ratio within each repeat (both systems of a repeat,
        so a slow sitting slows both sides), then their mean and range
    --> the table, and json=PATH

A repeat that lacks a system, or whose system failed, adds nothing to that system's figures or
its ratios; ``n`` says how many repeats each figure holds. The run order of each repeat is read
from its result files' times, so that an order kept the same in every repeat shows.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.tools.bench.peers import ours, verl
from recipe.tools.bench.peers.report import PAIRS
from recipe.tools.bench.peers.result import SystemResult
from recipe.tools.cli import exit_on_help, fail, split_key_values

FIGURES = ("samples_per_s", "gen_tokens_per_s", "step_s", "startup_s")
GPU_FIGURES = ("sm_clock_mhz_median", "temp_c_max")
CPU_FIGURES = ("cpu_busy_before", "cpu_busy_median")
SYSTEM_NAMES = (*verl.SYSTEMS, *ours.SYSTEMS)


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over the repeats that have it."""

    n: int
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        if not values:
            return None
        return cls(len(values), sum(values) / len(values), min(values), max(values))

    def cell(self, digits: int) -> str:
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def read_repeat(folder: Path) -> list[SystemResult]:
    """The finished systems of one repeat, in the order they finished."""
    found = [
        (path.stat().st_mtime, SystemResult.from_json(json.loads(path.read_text())))
        for name in SYSTEM_NAMES
        if (path := folder / name / "result.json").is_file()
    ]
    return [result for _, result in sorted(found, key=lambda pair: pair[0])]


@dataclass(slots=True)
class RepeatSummary:
    systems: dict[str, dict[str, Spread]]
    """Per system, each of ``FIGURES``, ``GPU_FIGURES`` and ``CPU_FIGURES`` over its
    finished runs."""
    ratios: dict[str, Spread]
    """``<system>_over_<base> <figure>``: the ratios within each repeat."""
    orders: list[list[str]]
    """Each repeat's finished systems in the order they finished."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def summarize_repeats(repeats: list[list[SystemResult]]) -> RepeatSummary:
    """The figures of every system and ratio over ``repeats`` (module docstring)."""
    systems: dict[str, dict[str, Spread]] = {}
    for name in SYSTEM_NAMES:
        runs = [r for repeat in repeats for r in repeat if r.system == name and not r.failed]
        figures = {
            key: Spread.of([v for r in runs if (v := getattr(r, key)) is not None])
            for key in FIGURES
        }
        for attr, keys in (("gpu_state", GPU_FIGURES), ("cpu_state", CPU_FIGURES)):
            figures |= {
                key: Spread.of([state[key] for r in runs if key in (state := getattr(r, attr))])
                for key in keys
            }
        if runs:
            systems[name] = {k: v for k, v in figures.items() if v is not None}
    ratios: dict[str, Spread] = {}
    for system, base in PAIRS:
        for key in ("samples_per_s", "startup_s"):
            values = [
                mine / theirs
                for repeat in repeats
                if (mine := _figure(repeat, system, key)) is not None
                and (theirs := _figure(repeat, base, key))
            ]
            if (spread := Spread.of(values)) is not None:
                ratios[f"{system}_over_{base} {key}"] = spread
    return RepeatSummary(systems, ratios, [[r.system for r in repeat] for repeat in repeats])


def _figure(repeat: list[SystemResult], system: str, key: str) -> float | None:
    for result in repeat:
        if result.system == system and not result.failed:
            value: float | None = getattr(result, key)
            return value
    return None


COLUMNS = (
    ("samples/s", "samples_per_s", 2),
    ("gen tok/s", "gen_tokens_per_s", 0),
    ("step s", "step_s", 2),
    ("start-up s", "startup_s", 1),
    ("SM MHz", "sm_clock_mhz_median", 0),
    ("max C", "temp_c_max", 0),
    ("CPU pre", "cpu_busy_before", 2),
    ("CPU", "cpu_busy_median", 2),
)


def print_repeats(summary: RepeatSummary) -> None:
    head = ["system", "n", *[c[0] for c in COLUMNS]]
    rows = []
    for name, figures in summary.systems.items():
        n = figures["samples_per_s"].n if "samples_per_s" in figures else 0
        cells = [figures[key].cell(digits) if key in figures else "-" for _, key, digits in COLUMNS]
        rows.append([name, str(n), *cells])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    for line in (head, *rows):
        print("  ".join(x.rjust(w) for x, w in zip(line, widths, strict=True)))
    for key, spread in summary.ratios.items():
        print(f"{key}: {spread.cell(2)}x (n={spread.n})")
    for index, order in enumerate(summary.orders, start=1):
        print(f"repeat {index} order: {', '.join(order) or '-'}")


def main(argv: list[str]) -> int:
    exit_on_help(argv, __doc__)
    folders = [Path(a) for a in argv if "=" not in a]
    options = {"json": ""}
    for key, value in (split_key_values(a) or ("", a) for a in argv if "=" in a):
        if key not in options:
            fail(f"{key}={value}: unknown key; known: json")
        options[key] = value
    if not folders:
        fail("usage: python -m recipe.tools.bench.peers.repeats OUT [OUT ...] [json=PATH]")
    if missing := [str(f) for f in folders if not f.is_dir()]:
        fail(f"not a folder: {', '.join(missing)}")
    summary = summarize_repeats([read_repeat(f) for f in folders])
    print_repeats(summary)
    if options["json"]:
        Path(options["json"]).write_text(json.dumps(summary.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
