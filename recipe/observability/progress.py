"""The step bar every recipe shows: steps done, ETA, and the figures a person watches.

    fully_async:  37%|███▋      | 185/500 [01:40<02:51, 1.84step/s, v=92, q=12, stale=0.50,
                  reward=0.412, acc=0.547]

``v`` is the weights version the engines serve, ``q`` the groups waiting for the trainer
(fully_async: the message queue; one_step_off: the next batch's groups already generated when
the step's training ended), ``stale`` the step's mean staleness in versions, ``reward`` its
mean reward, ``acc`` the latest validation accuracy. ``logger.quiet=true`` turns the bar off
(CI logs); metrics still go to every other sink.

On a terminal the bar redraws itself in place (``\\r``) and other lines go through
``bar_paused``, which erases it first and redraws it after. In a log file (the stream is no
TTY) in-place updates would pile up on one line, with the console's metric lines glued to
them; there the bar writes each refresh as a whole line, at most every
``LOG_FILE_MININTERVAL_S``, so nothing else can land on a line it started.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator, Mapping
from typing import IO, Any, TextIO

from tqdm import tqdm

POSTFIX_KEYS = (
    ("q", "queue/size", "{:.0f}"),
    ("stale", "staleness/mean", "{:.2f}"),
    ("reward", "reward/mean", "{:.3f}"),
)
LOG_FILE_MININTERVAL_S = 30.0
"""Least seconds between two bar lines in a log file (a terminal redraws every 0.1 s)."""


def step_bar(total: int, mode: str, *, quiet: bool, file: TextIO | None = None) -> tqdm:
    """A bar of ``total`` trainer steps on ``file`` (stderr; disabled when ``quiet``)."""
    stream = file if file is not None else sys.stderr
    if _is_tty(stream):
        return tqdm(
            total=total, desc=mode, unit="step", disable=quiet, file=stream, dynamic_ncols=True
        )
    # miniters=1 turns off tqdm's adaptive miniters, whose monitor thread would redraw every
    # maxinterval (10 s) regardless of mininterval.
    return tqdm(
        total=total,
        desc=mode,
        unit="step",
        disable=quiet,
        file=_WholeLines(stream),
        mininterval=LOG_FILE_MININTERVAL_S,
        miniters=1,
    )


@contextlib.contextmanager
def bar_paused(file: IO[str]) -> Iterator[None]:
    """Write to ``file`` inside this block: a bar on the same terminal is erased before and
    redrawn after. A log-file bar (``_WholeLines``) is left alone: its lines are complete."""
    with tqdm.external_write_mode(file=file):
        yield


def bar_postfix(
    metrics: Mapping[str, float], version: int, val_accuracy: float | None = None
) -> dict[str, str]:
    """The bar's right-hand figures from one step's metrics (those it has)."""
    out = {"v": str(version)}
    for name, key, fmt in POSTFIX_KEYS:
        value = metrics.get(key)
        if value is not None and math.isfinite(value):
            out[name] = fmt.format(value)
    if val_accuracy is not None and math.isfinite(val_accuracy):
        out["acc"] = f"{val_accuracy:.3f}"
    return out


def update_bar(
    bar: tqdm, metrics: Mapping[str, float], version: int, val_accuracy: float | None = None
) -> None:
    """One step done: advance and refresh the figures."""
    bar.set_postfix(bar_postfix(metrics, version, val_accuracy), refresh=False)
    bar.update(1)


class _WholeLines:
    """A stream for tqdm that is no terminal: each redraw (``"\\r" + bar + padding``) becomes
    ``bar + "\\n"``; erasures (``\\r``, padding, the closing ``\\n``) write nothing.

    It is not equal to the stream it wraps, so ``tqdm.external_write_mode`` neither erases nor
    redraws this bar around a line written to that stream.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        line = text.strip("\r\n ")
        if line:
            self._stream.write(line + "\n")
            self._stream.flush()
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        # encoding (tqdm picks unicode or ascii blocks from it), closed, ...
        return getattr(self._stream, name)


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False
