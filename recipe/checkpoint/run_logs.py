"""The run's per-step JSONL logs (``metrics.jsonl``, ``ledger.jsonl``) rewound to a checkpoint.

A resume drops the lines of the steps after its checkpoint (those updates died with the
process and are trained again) and a last line torn by the crash; any other line that cannot
be read means the records were damaged by something other than a crash, which is an error
naming the file and the line, the file left as it is.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


class DamagedRecordsError(ValueError):
    """A per-step JSONL file of the run has a line that is not a record, other than a torn
    last one: something other than a crash changed it."""


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Drop the lines of a per-step JSONL file whose ``step`` is above ``max_step``, and a torn
    last line (a crash mid-write; warned), atomically; returns the number of lines dropped.

    ``DamagedRecordsError`` naming the file and line when any other line is not a record with
    a ``step``: a crash tears only the last line, so the run's records were damaged, and they
    are left as they are rather than rewritten without it."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept, dropped = [], 0
    for number, line in enumerate(lines, start=1):
        try:
            step = _step_of(line)
        except (ValueError, KeyError, TypeError) as err:
            if number < len(lines):
                raise DamagedRecordsError(
                    f"{path}: line {number} is not a record with a step ({type(err).__name__}: "
                    f"{err}): the run's records were damaged (a crash tears only the last "
                    "line); repair or remove that line, or start a new run"
                ) from None
            logger.warning("%s: its last line is torn (a crash mid-write): dropped", path)
            dropped += 1
            continue
        if step > max_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return dropped


def _step_of(line: str) -> int:
    step = json.loads(line)["step"]
    if not isinstance(step, int) or isinstance(step, bool):
        raise TypeError(f"step {step!r} is not an integer")
    return step
