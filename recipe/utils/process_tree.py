"""Kill a process and everything it started, at a deadline.

A run of ``python -m recipe`` (or verl's trainer) starts Ray's GCS and raylet, which start
the workers and the engines' processes; several of them call ``setsid``, so killing the run's
process group leaves them alive, holding GPU memory and cores that the next run then
measures against. ``kill_tree`` collects every descendant from ``/proc`` first, then kills
the group and each of them. ``kill_session`` ends what is left of a session whose leader
has already exited (an agent command's background jobs): its members are found by their
session id, since the leader's pid no longer leads to them.

A process this one may not signal (another user's, a PermissionError) is skipped, the rest
are still killed, and the skipped ones are logged once and returned.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

logger = logging.getLogger(__name__)


class _Proc(NamedTuple):
    pid: int
    ppid: int
    session: int


def _processes() -> list[_Proc]:
    """Every live process (Linux ``/proc``; empty elsewhere)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        fields = text.rsplit(")", 1)[1].split()
        found.append(_Proc(int(stat.parent.name), int(fields[1]), int(fields[3])))
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux ``/proc``; empty elsewhere), whatever session
    or group it moved to."""
    children: dict[int, list[int]] = {}
    for proc in _processes():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid``'s process group (``pid`` leads it: ``start_new_session=True``) and every
    process below ``pid``; processes already gone are skipped. Returns those it may not
    signal (logged)."""
    return _kill(pid, descendants(pid), f"the process tree of {pid}")


def kill_session(session: int) -> list[int]:
    """SIGKILL every process left in ``session`` (its leader may be gone: a session id is not
    reused while a member lives) and in the process group of the same id. Returns those it
    may not signal (logged)."""
    members = [p.pid for p in _processes() if p.session == session and p.pid != os.getpid()]
    return _kill(session, members, f"session {session}")


def _kill(group: int, pids: list[int], what: str) -> list[int]:
    denied: list[int] = []
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # no member of the group may be signalled; the others below
        denied.append(group)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            denied.append(pid)
    if denied:
        logger.warning(
            "killing %s: not permitted to signal %s (left running)",
            what,
            ", ".join(str(p) for p in denied),
        )
    return denied


def process_start_time() -> float:
    """When this process started (seconds since the epoch, the OS's record of it), so the
    interpreter's and the imports' seconds count too; now when the OS does not say."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # no psutil, or a platform without the record: count from here
        return time.time()
