"""Errors that crossed a Ray actor boundary."""

from __future__ import annotations


def remote_cause(exc: BaseException) -> BaseException:
    """The error an actor raised, unwrapped from the ``RayTaskError`` that carries it as
    ``cause`` (whose own text is the remote traceback); ``exc`` itself otherwise."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def error_line(exc: BaseException) -> str:
    """``"Type: first line of the message"`` of ``exc`` (of the remote error, for one that
    crossed an actor boundary)."""
    cause = remote_cause(exc)
    lines = [ln for ln in str(cause).splitlines() if ln.strip()]
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
