"""``python -m recipe.tools.study.modes [key=value ...]``: the same task in several modes, side by
side, and how soon each reaches the synchronous baseline's final accuracy.

Each run is ``python -m recipe mode=M trainer.seed=S rollout.seed=S ...`` in a subprocess
writing ``<out>/<mode>-seed<S>/``; every run gets the same overrides, so the modes train the
same model on the same prompts with the same batch, budget and number of trained samples.
Its figures are kept as ``<records>/<mode>-seed<S>.json`` (small, committed); a run with a
record is not run again, so a study stopped by a deadline continues where it was. Records
trained with other overrides (a changed ``actor.lr``, another model) are never mixed in: a
study whose ``<records>/results.json`` names other overrides stops with one ``error:`` line
(exit 2) before any run, the keys that differ named; only where the data files lie
(``data.train_files``, ``data.val_files``) may differ between machines. A run that
fails or times out gets no record, is reported, and makes the exit code 1: it is never
counted as done. Then the table (``recipe.tools.study.accuracy``): final accuracy per mode,
samples/s and the time to sync's final accuracy as a fraction of sync's; ``<records>/results.json``;
``<records>/accuracy.png`` (validation accuracy against trained samples and against seconds);
and ``python -m recipe.tools.report`` over the runs into ``<records>/report/``.

Study keys (everything else is a config override for every run):

    modes=sync,fully_async     the modes, sync first (it sets the target)
    seeds=0                    trainer.seed and rollout.seed
    out=outputs/study/modes    where the run directories go
    records=docs/study/modes   where each run's record, results.json and the report go
    timeout_s=3600             a run past it fails
    table_only=false           aggregate what is there, run nothing
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from recipe.tools.cli import fail, keys_and_overrides
from recipe.tools.study.accuracy import (
    RunRecord,
    print_rows,
    read_run,
    table,
    write_json,
    write_plot,
)
from recipe.tools.study.runs import LOG_FILE, run_logged

logger = logging.getLogger(__name__)

MODES = ("sync", "one_step_off", "fully_async")
STUDY_KEYS = {
    "modes": "sync,fully_async",
    "seeds": "0",
    "out": "outputs/study/modes",
    "records": "docs/study/modes",
    "timeout_s": "3600",
    "table_only": "false",
}


@dataclass(frozen=True, slots=True)
class Study:
    modes: tuple[str, ...]
    seeds: tuple[int, ...]
    out: Path
    records: Path
    timeout_s: float
    overrides: tuple[str, ...]

    def runs(self) -> list[tuple[str, int]]:
        return [(mode, seed) for seed in self.seeds for mode in self.modes]

    def command(self, mode: str, seed: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "recipe",
            f"mode={mode}",
            "logger.quiet=true",
            f"hydra.run.dir={self.out / run_name(mode, seed)}",
            f"trainer.seed={seed}",
            f"rollout.seed={seed}",
            *self.overrides,
        ]


def run_name(mode: str, seed: int) -> str:
    return f"{mode}-seed{seed}"


def parse(argv: list[str]) -> tuple[Study, bool]:
    """(the study, table_only) from ``key=value`` arguments; exit code 2 naming a bad one."""
    args, overrides = keys_and_overrides(argv, __doc__, STUDY_KEYS)
    for key in (o.partition("=")[0] for o in overrides):
        if key in ("mode", "trainer.seed", "rollout.seed", "hydra.run.dir"):
            fail(f"{key} is set by the study per run; use modes= / seeds=")
    modes = tuple(args["modes"].split(","))
    if unknown := sorted(set(modes) - set(MODES)):
        fail(f"modes={args['modes']}: unknown {unknown}; known {MODES}")
    if "sync" not in modes:
        fail(
            "modes= must include sync (its final accuracy is the target; a sync run "
            "whose record exists is not run again)"
        )
    study = Study(
        modes=tuple(sorted(modes, key=lambda m: m != "sync")),
        seeds=tuple(int(x) for x in args["seeds"].split(",")),
        out=Path(args["out"]),
        records=Path(args["records"]),
        timeout_s=float(args["timeout_s"]),
        overrides=tuple(overrides),
    )
    return study, args["table_only"].lower() == "true"


# Keys naming where a machine keeps the data: they may differ between the machines that add
# runs to one study's records.
MACHINE_KEYS = frozenset({"data.train_files", "data.val_files"})


def settings(overrides: Sequence[str]) -> dict[str, str]:
    """``key -> value`` of ``overrides`` apart from ``MACHINE_KEYS`` (the last one set wins)."""
    pairs = (o.partition("=") for o in overrides)
    return {key: value for key, _, value in pairs if key not in MACHINE_KEYS}


def check_records_match(study: Study) -> None:
    """Exit 2 when ``study.records`` holds runs trained with other overrides than ``study``'s."""
    path = study.records / "results.json"
    if not path.is_file():
        return
    kept, now = settings(read_json(path).get("overrides", [])), settings(study.overrides)
    differ = [
        f"{key} {kept.get(key, '(unset)')} there, {now.get(key, '(unset)')} here"
        for key in sorted(kept.keys() | now.keys())
        if kept.get(key) != now.get(key)
    ]
    if differ:
        fail(
            f"{study.records} holds runs trained with other overrides ({'; '.join(differ)}): "
            "give this study records= of its own, or move those runs away"
        )


def run_one(study: Study, mode: str, seed: int) -> bool:
    """Run ``mode``/``seed`` unless its record exists; True when it has one afterwards."""
    name = run_name(mode, seed)
    record, run_dir = study.records / f"{name}.json", study.out / name
    if record.is_file():
        return True
    if not (run_dir / "summary.json").is_file():
        failed, took_s = run_logged(study.command(mode, seed), run_dir, timeout_s=study.timeout_s)
        if failed is not None:
            print(f"{name}: FAILED ({failed}; see {run_dir}/{LOG_FILE})", flush=True)
            return False
        print(f"{name}: done in {took_s:.0f} s", flush=True)
    write_json(record, read_run(run_dir, seed=seed).to_json())
    return True


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    study, table_only = parse(argv)
    check_records_match(study)
    ok = True
    if not table_only:
        for mode, seed in study.runs():
            ok = run_one(study, mode, seed) and ok
    records = [study.records / f"{run_name(m, s)}.json" for m, s in study.runs()]
    runs = [RunRecord.from_json(read_json(p)) for p in records if p.is_file()]
    if not any(r.mode == "sync" for r in runs):
        print("no finished sync run yet: no table")
        return 1
    rows = table(runs)
    print_rows(rows)
    write_json(study.records / "results.json", {"overrides": study.overrides, "rows": rows})
    write_plot(study.records / "accuracy.png", runs, title=study.records.name)
    _report(study)
    return 0 if ok else 1


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _report(study: Study) -> None:
    paths = [study.out / run_name(m, s) for m, s in study.runs()]
    dirs = [str(d) for d in paths if (d / "summary.json").is_file()]
    if dirs:
        cmd = [
            sys.executable,
            "-m",
            "recipe.tools.report",
            *dirs,
            "--out",
            str(study.records / "report"),
        ]
        subprocess.run(cmd, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
