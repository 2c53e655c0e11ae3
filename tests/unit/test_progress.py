"""observability/progress.py: the step bar and the console's metric lines sharing a stream.

A log file (stdout/stderr redirected) and a terminal are both driven into one StringIO, with the
bar redrawing at every step, the worst case for lines glued onto the bar's text.
"""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from recipe.observability import progress
from recipe.observability.backends import ConsoleBackend
from recipe.observability.progress import step_bar, update_bar

METRIC_LINE = re.compile(r"step \d+ \|")


class _Terminal(io.StringIO):
    """A StringIO that says it is a TTY, so the bar redraws in place with ``\\r``."""

    def isatty(self) -> bool:
        return True


def _drive(stream: io.StringIO, num_steps: int, every: int) -> None:
    """What a recipe's loop does: log the step's metrics, then advance the bar."""
    console = Console(file=stream, highlight=False, force_terminal=False, width=200)
    backend = ConsoleBackend(every=every, quiet=False, console=console)
    bar = step_bar(num_steps, "fully_async", quiet=False, file=stream)
    for step in range(1, num_steps + 1):
        metrics = {"reward/mean": 0.293, "staleness/mean": 0.5, "timing/step_s": 1.02}
        backend.log(metrics, step)
        update_bar(bar, metrics, version=step)
    bar.close()


def _screen_lines(text: str) -> list[str]:
    """What a terminal shows: within a line, each ``\\r`` returns to column 0 and overwrites."""
    lines = []
    for raw in text.split("\n"):
        shown = ""
        for part in raw.split("\r"):
            shown = part + shown[len(part) :]
        lines.append(shown.rstrip())
    return lines


def test_every_metric_line_starts_its_own_line_in_a_log_file(monkeypatch):
    monkeypatch.setattr(progress, "LOG_FILE_MININTERVAL_S", 0.0)  # a bar line every step
    log = io.StringIO()
    _drive(log, num_steps=30, every=10)
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text  # no in-place updates piling up on one line
    metric_lines = [line for line in lines if METRIC_LINE.search(line)]
    assert [line.split(" | ")[0] for line in metric_lines] == ["step 10", "step 20", "step 30"]
    assert all(line.startswith("step ") for line in metric_lines)
    bar_lines = [line for line in lines if line.startswith("fully_async:")]
    assert len(bar_lines) + len(metric_lines) == len(lines)
    assert "30/30" in bar_lines[-1]


def test_every_metric_line_starts_its_own_line_on_a_terminal():
    terminal = _Terminal()
    _drive(terminal, num_steps=30, every=10)
    shown = _screen_lines(terminal.getvalue())
    metric_lines = [line for line in shown if METRIC_LINE.search(line)]
    assert len(metric_lines) == 3
    assert all(line.startswith("step ") for line in metric_lines)
    assert "30/30" in shown[-1] or "30/30" in shown[-2]  # the bar, redrawn under the lines


def test_a_log_file_bar_writes_a_line_at_most_every_thirty_seconds():
    log = io.StringIO()
    bar = step_bar(100, "sync", quiet=False, file=log)
    assert bar.mininterval == pytest.approx(30.0)
    for step in range(5):
        update_bar(bar, {"reward/mean": 0.5}, version=step)
    assert len(log.getvalue().splitlines()) == 1  # the 0/100 line written on creation
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "5/100" in lines[-1]


def test_a_terminal_bar_keeps_redrawing_in_place():
    bar = step_bar(10, "sync", quiet=False, file=_Terminal())
    try:
        assert bar.mininterval == pytest.approx(0.1) and bar.dynamic_ncols
    finally:
        bar.close()


def test_quiet_bar_writes_nothing_and_lines_still_print():
    log = io.StringIO()
    bar = step_bar(10, "sync", quiet=True, file=log)
    backend = ConsoleBackend(every=1, quiet=False, console=Console(file=log, highlight=False))
    backend.log({"reward/mean": 0.5}, step=1)
    update_bar(bar, {"reward/mean": 0.5}, version=1)
    bar.close()
    assert log.getvalue() == "step 1 | reward/mean 0.5\n"


def test_a_metric_line_shows_means_over_the_steps_since_the_last_one():
    log = io.StringIO()
    backend = ConsoleBackend(every=4, quiet=False, console=Console(file=log, width=200))
    for step in range(1, 9):  # staleness alternates 0, 1 at T = 2; the printed step is even
        backend.log({"staleness/mean": float(step % 2), "reward/mean": step / 10}, step)
    lines = [line for line in log.getvalue().splitlines() if line.startswith("step ")]
    assert lines == [
        "step 4 | reward/mean 0.25 | staleness/mean 0.5",
        "step 8 | reward/mean 0.65 | staleness/mean 0.5",
    ]
