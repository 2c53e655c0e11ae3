"""Kill a process and everything it started, at a deadline.

A run of ``python -m recipe`` (or verl's trainer) starts Ray's GCS and raylet, which start
the workers and the engines' processes; several of them call ``setsid``, so killing the run's
process group leaves them alive, holding GPU memory and cores that the next run then
measures against. ``kill_tree`` collects every descendant from ``/proc`` first, then kills
the group and each of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``; empty elsewhere), whatever session
    or group it moved to."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group (``pid`` leads it: ``start_new_session=True``) and every
    process below ``pid``; processes already gone are skipped."""
    tree = descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
