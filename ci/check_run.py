"""Check a finished run directory against ``ci/thresholds.json``; exit 1 on a regression.

    python ci/check_run.py RUN_DIR MODE

Prints one table row per checked figure (value, threshold, verdict).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run_dir: str, mode: str) -> int:
    limits = json.loads((Path(__file__).parent / "thresholds.json").read_text())[mode]
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    gain = summary["final/val_accuracy"] - summary["initial/val_accuracy"]
    rows = [
        (
            "val accuracy gain",
            gain,
            limits["min_val_accuracy_gain"],
            gain >= limits["min_val_accuracy_gain"],
        ),
        (
            "wall s",
            summary["wall_s"],
            limits["max_wall_s"],
            summary["wall_s"] <= limits["max_wall_s"],
        ),
    ]
    print(f"{'figure':<20}{'value':>10}{'threshold':>12}  verdict  ({mode}, {run_dir})")
    for name, value, limit, ok in rows:
        print(f"{name:<20}{value:>10.3f}{limit:>12.3f}  {'ok' if ok else 'REGRESSED'}")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
