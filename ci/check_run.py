"""The nightly CPU job's learning checks against ``ci/thresholds.json``, and their derivation.

    python ci/check_run.py check KEY RUN_DIR...     exit 1 on a regression, 2 on bad input
    python ci/check_run.py derive KEY RUN_DIR...    (re)write KEY's thresholds from the runs

KEY is a mode (``sync``) or an environment and a mode (``retry/sync``). The learning figure
is the late validation gain: the mean greedy validation accuracy of the run's last
``LATE_VALIDATIONS`` validations, minus the accuracy before training. The final validation
alone moves by more than a 20% regression from one sampling seed to the next (sync, default
run: final gains 0.145, 0.082, 0.156; late gains 0.162, 0.140, 0.152): one 256-prompt
evaluation of one version is noisy, the mean of five is not. A check reads the mean of its
runs, and each entry says how many seeds (``seeds``) that mean needs. ``derive`` records the
measured runs beside the thresholds it sets from them:

    min_late_val_gain   0.8 x the measured mean: a 20% regression fails
    max_wall_s          1.2 x the measured mean wall time: a 20% slow-down fails
    seeds               the seeds whose mean a healthy tree keeps above the gain's threshold
                        19 times in 20 (normal, the measured spread):
                        ceil((1.645 sd / (0.2 mean))^2), 1 to MAX_SEEDS
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

THRESHOLDS = Path(__file__).parent / "thresholds.json"
MAX_SEEDS = 5
LATE_VALIDATIONS = 5
REGRESSION = 0.2
Z_ONE_SIDED_95 = 1.645


def figures(run_dir: Path) -> dict[str, float]:
    """The checked figures of one finished run (``summary.json``, ``metrics.jsonl``)."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        raise ValueError(f"{run_dir}: no summary.json (the run did not finish)")
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "metrics.jsonl") as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    trained = [r["val/accuracy"] for r in records if r["step"] > 0 and "val/accuracy" in r]
    late = trained[-LATE_VALIDATIONS:] or [summary["final/val_accuracy"]]
    initial = summary["initial/val_accuracy"]
    return {
        "late_val_gain": statistics.mean(late) - initial,
        "final_val_gain": summary["final/val_accuracy"] - initial,
        "wall_s": summary["wall_s"],
    }


def derive(runs: list[dict[str, float]], command: str) -> dict[str, Any]:
    """A thresholds entry from measured runs (module docstring); at least 3 runs."""
    if len(runs) < 3:
        raise ValueError(f"a threshold needs at least 3 runs, got {len(runs)}")
    gains = [r["late_val_gain"] for r in runs]
    walls = [r["wall_s"] for r in runs]
    mean, sd = statistics.mean(gains), statistics.stdev(gains)
    if mean <= 0:
        raise ValueError(f"the runs did not learn (mean gain {mean:.3f}): no threshold")
    needed = math.ceil((Z_ONE_SIDED_95 * sd / (REGRESSION * mean)) ** 2)
    return {
        "min_late_val_gain": round((1 - REGRESSION) * mean, 3),
        "max_wall_s": round((1 + REGRESSION) * statistics.mean(walls)),
        "seeds": min(max(needed, 1), MAX_SEEDS),
        "measured": {
            "date": date.today().isoformat(),
            "command": command,
            "late_val_gain": [round(g, 4) for g in gains],
            "final_val_gain": [round(r["final_val_gain"], 4) for r in runs],
            "gain_mean": round(mean, 4),
            "gain_sd": round(sd, 4),
            "wall_s": [round(w) for w in walls],
        },
    }


def check(
    limits: dict[str, Any], runs: list[dict[str, float]]
) -> list[tuple[str, float, float, bool]]:
    """Rows (figure, mean value, threshold, passed) for the mean of ``runs``."""
    gain = statistics.mean(r["late_val_gain"] for r in runs)
    min_gain = limits["min_late_val_gain"]
    wall = statistics.mean(r["wall_s"] for r in runs)
    return [
        ("late val gain", gain, min_gain, gain >= min_gain),
        ("wall s", wall, limits["max_wall_s"], wall <= limits["max_wall_s"]),
    ]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in ("check", "derive"):
        print("usage: check_run.py check|derive KEY RUN_DIR...", file=sys.stderr)
        return 2
    action, key, run_dirs = argv[0], argv[1], argv[2:]
    table = json.loads(THRESHOLDS.read_text())
    try:
        runs = [figures(Path(d)) for d in run_dirs]
        if action == "derive":
            table[key] = derive(runs, command=_command(key))
            THRESHOLDS.write_text(_dumps(table))
            print(f"{key}: {json.dumps({k: v for k, v in table[key].items() if k != 'measured'})}")
            return 0
        if key not in table:
            raise ValueError(f"no thresholds for {key!r} in {THRESHOLDS.name}")
        limits = table[key]
        if len(runs) < limits.get("seeds", 1):
            raise ValueError(
                f"{key} is checked on the mean of {limits['seeds']} seeds, got {len(runs)} runs"
            )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = check(limits, runs)
    print(f"{'figure':<20}{'value':>10}{'threshold':>12}  verdict  ({key}, mean of {len(runs)})")
    for name, value, limit, ok in rows:
        print(f"{name:<20}{value:>10.3f}{limit:>12.3f}  {'ok' if ok else 'REGRESSED'}")
    return 0 if all(ok for *_, ok in rows) else 1


def _command(key: str) -> str:
    env, _, mode = key.rpartition("/")
    args = (f"env={env} " if env else "") + f"mode={mode}"
    return f"python -m recipe {args} trainer.seed=SEED rollout.seed=SEED logger.quiet=true"


def _dumps(table: dict[str, Any]) -> str:
    """One line per key: a changed threshold is one line of a diff."""
    lines = [f"  {json.dumps(key)}: {json.dumps(entry)}" for key, entry in table.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
