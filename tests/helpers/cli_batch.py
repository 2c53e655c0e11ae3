"""Many ``python -m recipe`` command lines in one interpreter: ``python -m tests.helpers.cli_batch``
reads a JSON list of argument lists on stdin, runs each through ``recipe.main.cli`` (what
``python -m recipe`` runs) with its own ``sys.argv``, and prints one line per command,
``MARK`` and then JSON: its exit code, its stderr, and the CPU and wall seconds it took (the
recipe's own log lines go to stdout too).

Why: a bad command line fails before Ray starts, in well under a second of its own, but a
fresh interpreter pays seconds of imports first. tests/integration/test_bad_input_cli.py
runs every case here, in one interpreter, and a case per checking stage as a real
subprocess of its own."""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time

MARK = "cli_batch: "
"""Starts the result lines on stdout."""


def run_one(argv: list[str]) -> dict[str, object]:
    """One command line: ``{"code", "stderr", "cpu_s", "wall_s"}``."""
    from recipe.main import cli

    err = io.StringIO()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    code: object = 0
    sys.argv = ["recipe", *argv]
    with contextlib.redirect_stderr(err):
        try:
            cli()
        except SystemExit as stop:
            code = stop.code
        except Exception as exc:  # a bug, not bad input: reported, and the batch goes on
            code = "crash"
            print(f"Traceback (in the batch): {exc!r}", file=err)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    wall_s = time.perf_counter() - start
    return {"code": code, "stderr": err.getvalue(), "cpu_s": cpu_s, "wall_s": wall_s}


def main() -> None:
    commands = json.load(sys.stdin)
    out = sys.stdout
    for argv in commands:
        result = run_one(argv)
        out.write(MARK + json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
