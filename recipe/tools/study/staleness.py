"""``python -m recipe.tools.study.staleness [key=value ...]``: does learning hold as staleness
grows?

A grid of real ``mode=fully_async`` runs on the default task (or whatever the overrides set),
all with the same number of trained prompts (``rollout.total_rollout_steps``)::

    staleness_threshold  x  correction (CORRECTIONS)  x  seed     [x max_staleness]

Each run is ``python -m recipe`` in a subprocess writing ``<out>/<cell>/``; its figures are
kept as ``<records>/<cell>.json`` (small, committed: docs/study/staleness/), and a cell that
has a record or a summary is not run again, so a study that is stopped continues where it
was, in another session or on another machine. Then the table
(``recipe.tools.study.table``): final greedy validation accuracy mean +- std over the seeds, the
area under the validation curve, samples/s, measured staleness mean/max and the fractions
masked by rejection; written to ``<out>/results.json`` and ``<out>/staleness.png``.

Study keys (everything else is a config override, ``key=value``, for every run):

    thresholds=0,0.5,1,2,4        async_training.staleness_threshold values
    corrections=bypass,decoupled,icepop   names in CORRECTIONS
    seeds=0,1,2                   trainer.seed and rollout.seed of a run
    max_staleness=none            async_training.max_staleness (none: unbounded); a list
                                  (none,1) runs the grid once per value
    prompts=3200                  rollout.total_rollout_steps (trained prompts per run)
    test_freq=20                  trainer.test_freq (versions between validations)
    out=outputs/study/staleness   where the run directories go
    records=docs/study/staleness  where each run's figures, results.json and the plot go
    timeout_s=3600                a run past it counts as failed (its cell stays empty)
    table_only=false              aggregate what is there, run nothing
"""

from __future__ import annotations

import itertools
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from recipe.tools.cli import fail, keys_and_overrides
from recipe.tools.study.runs import run_logged
from recipe.tools.study.table import Cell, collect, print_table, run_row, write_plot, write_results

logger = logging.getLogger(__name__)

CORRECTIONS: dict[str, tuple[str, ...]] = {
    "bypass": ("algorithm.rollout_correction.bypass_mode=true",),
    "decoupled": ("algorithm.rollout_correction.bypass_mode=false",),
    "icepop": (
        "algorithm.rollout_correction.bypass_mode=false",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token",
    ),
    "seq_tis": (
        "algorithm.rollout_correction.bypass_mode=false",
        "algorithm.rollout_correction.rollout_is=sequence",
    ),
    "geometric": (
        "algorithm.rollout_correction.bypass_mode=false",
        "algorithm.rollout_correction.rollout_rs=geometric",
        "algorithm.rollout_correction.rollout_rs_threshold=1.5",
    ),
    "bypass_geometric": (
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.rollout_rs=geometric",
        "algorithm.rollout_correction.rollout_rs_threshold=1.5",
    ),
}
"""Named corrections: PPO anchored at the rollout policy (bypass); decoupled PPO with token
TIS (the decoupled default); IcePop (token IS, tokens outside [0.5, 2] masked); sequence TIS;
geometric-mean rejection outside [1/1.5, 1.5] with token TIS, and the same on bypass."""

STUDY_KEYS = {
    "thresholds": "0,0.5,1,2,4",
    "corrections": "bypass,decoupled,icepop",
    "seeds": "0,1,2",
    "max_staleness": "none",
    "prompts": "3200",
    "test_freq": "20",
    "out": "outputs/study/staleness",
    "records": "docs/study/staleness",
    "timeout_s": "3600",
    "table_only": "false",
}


@dataclass(frozen=True, slots=True)
class Study:
    """The grid and where it goes (see the module docstring for the keys)."""

    thresholds: tuple[float, ...]
    corrections: tuple[str, ...]
    seeds: tuple[int, ...]
    max_staleness: tuple[int | None, ...]
    prompts: int
    test_freq: int
    out: Path
    records: Path
    timeout_s: float
    overrides: tuple[str, ...]

    def cells(self) -> list[Cell]:
        grid = itertools.product(self.max_staleness, self.thresholds, self.corrections)
        return [
            Cell(threshold, correction, seed, bound)
            for bound, threshold, correction in grid
            for seed in self.seeds
        ]

    def command(self, cell: Cell) -> list[str]:
        """``python -m recipe`` for one cell."""
        bound = "null" if cell.max_staleness is None else str(cell.max_staleness)
        return [
            sys.executable,
            "-m",
            "recipe",
            "mode=fully_async",
            "logger.quiet=true",
            f"hydra.run.dir={self.out / cell.name}",
            f"async_training.staleness_threshold={cell.threshold:g}",
            f"async_training.max_staleness={bound}",
            f"rollout.total_rollout_steps={self.prompts}",
            f"trainer.test_freq={self.test_freq}",
            "trainer.val_before_train=true",
            f"trainer.seed={cell.seed}",
            f"rollout.seed={cell.seed}",
            *CORRECTIONS[cell.correction],
            *self.overrides,
        ]


def parse(argv: list[str]) -> tuple[Study, bool]:
    """(the study, table_only) from ``key=value`` arguments; exit code 2 naming a bad one."""
    args, overrides = keys_and_overrides(argv, __doc__, STUDY_KEYS)
    corrections = tuple(args["corrections"].split(","))
    unknown = sorted(set(corrections) - set(CORRECTIONS))
    if unknown:
        fail(f"corrections={args['corrections']}: unknown {unknown}; known {sorted(CORRECTIONS)}")
    study = Study(
        thresholds=tuple(float(x) for x in args["thresholds"].split(",")),
        corrections=corrections,
        seeds=tuple(int(x) for x in args["seeds"].split(",")),
        max_staleness=tuple(
            None if x.lower() in ("none", "null") else int(x)
            for x in args["max_staleness"].split(",")
        ),
        prompts=int(args["prompts"]),
        test_freq=int(args["test_freq"]),
        out=Path(args["out"]),
        records=Path(args["records"]),
        timeout_s=float(args["timeout_s"]),
        overrides=tuple(overrides),
    )
    return study, args["table_only"].lower() == "true"


def run_cell(study: Study, cell: Cell) -> bool:
    """Run one cell unless it has a record or a finished run (a failed one runs again);
    True when it has one afterwards."""
    if (study.records / f"{cell.name}.json").is_file() or run_row(study.out, cell) is not None:
        return True
    run_dir = study.out / cell.name
    failed, took_s = run_logged(study.command(cell), run_dir, timeout_s=study.timeout_s)
    status = "done" if failed is None else f"FAILED ({failed}; see study.log)"
    print(f"{cell.name}: {status} in {took_s:.0f} s", flush=True)
    return failed is None


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    study, table_only = parse(argv)
    cells = study.cells()
    if not table_only:
        for cell in cells:
            run_cell(study, cell)
    rows = [row for row in collect(study.records, study.out, cells) if row["seeds"]]
    print_table(rows)
    for row in rows:
        if row["seeds"] < len(study.seeds):
            print(f"note: {row['correction']} at threshold {row['threshold']:g} averages "
                  f"{row['seeds']} of {len(study.seeds)} seeds (the others failed or are "
                  "still to run)")  # fmt: skip
    write_results(study.records / "results.json", rows)
    write_plot(study.records / "staleness.png", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
