"""Errors that crossed a Ray actor boundary."""

from __future__ import annotations


def remote_cause(exc: BaseException) -> BaseException:
    """The error an actor raised, unwrapped from the ``RayTaskError`` that carries it as
    ``cause`` (whose own text is the remote traceback); ``exc`` itself otherwise."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
