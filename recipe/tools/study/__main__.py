"""``python -m recipe.tools.study``: a time-to-accuracy study fixed before its runs.

    python -m recipe.tools.study register configs/study/NAME.yaml records=docs/study/NAME
        the design (design.py) written to records/design.json; commit it before any run
    python -m recipe.tools.study run records=docs/study/NAME data=DATA_DIR [out=outputs/study/NAME]
                               [deadline_s=inf] [archive=PATH.tar.gz] [volatile=false]
        the runs not done yet, in the design's order, each trained, evaluated off the clock and
        kept (harness.py); a phase (training, evaluation) starts only when its estimate fits
        before ``deadline_s``; exit 0 when all are done (then the results), 3 when runs remain
        (call again, on this machine or a fresh one given the records), 1 when a run failed;
        ``archive``: the records as one file, rewritten after each kept run; ``volatile=true``
        on a machine whose files go at the deadline: a run starts only when its training and
        its evaluation both fit (its snapshots would go with the machine)
    python -m recipe.tools.study table records=docs/study/NAME
        results.json, the table and accuracy.png from what is kept (analysis.py)

Bad input (a design that cannot run, a changed design, a missing data folder): one line,
exit code 2.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

from recipe.tools.cli import exit_on_help, parse_pairs
from recipe.tools.study.analysis import analyse, print_results
from recipe.tools.study.design import DesignError, StudyDesign, register, registered
from recipe.tools.study.harness import DeviceMismatch, Harness

USAGE = __doc__.split("\n\n")[1]


def _keys(args: list[str], allowed: dict[str, str]) -> dict[str, str]:
    values = dict(allowed)
    for key, value in parse_pairs(args, __doc__)[1]:
        if key not in allowed:
            expected = ", ".join(f"{k}=" for k in allowed)
            raise ValueError(f"{f'{key}={value}'!r}: unknown key; expected one of {expected}")
        values[key] = value
    if missing := [k for k, v in values.items() if v == ""]:
        raise ValueError(f"missing {', '.join(f'{k}=' for k in missing)}")
    return values


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    exit_on_help(argv, __doc__)
    if not argv or argv[0] not in ("register", "run", "table"):
        print(f"error: expected register, run or table first\n{USAGE}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "register":
            if not rest:
                raise ValueError("register needs the design file")
            keys = _keys(rest[1:], {"records": ""})
            path = register(StudyDesign.load(Path(rest[0])), Path(keys["records"]))
            print(f"registered: {path}")
            return 0
        if command == "table":
            keys = _keys(rest, {"records": ""})
            print_results(analyse(Path(keys["records"])))
            return 0
        allowed = {
            "records": "",
            "data": "-",
            "out": "-",
            "deadline_s": "inf",
            "archive": "-",
            "volatile": "false",
        }
        keys = _keys(rest, allowed)
        records = Path(keys["records"])
        design = registered(records)
        out = Path(f"outputs/study/{design.name}" if keys["out"] == "-" else keys["out"])
        data = "" if keys["data"] == "-" else keys["data"]
        if not data and any("{data}" in a for a in [*design.overrides, *design.eval_overrides]):
            raise ValueError(f"{records}: the design's overrides name {{data}}: give data=DIR")
        archive = None if keys["archive"] == "-" else Path(keys["archive"])
        if keys["volatile"] not in ("true", "false"):
            raise ValueError(f"volatile={keys['volatile']}: true or false")
        volatile = keys["volatile"] == "true"
        harness = Harness(design, records, out, data, archive=archive, volatile=volatile)
        deadline_s = float(keys["deadline_s"])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        code = harness.run_all(deadline_s if math.isfinite(deadline_s) else 1e12)
    except (DesignError, DeviceMismatch) as exc:  # no targets from the warm-up; other cards
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if code == 0:
        print_results(analyse(records))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
