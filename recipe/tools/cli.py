"""The ``key=value`` command line shared by the tools (bench, study): ``--help`` and bad input.

    argv --> -h / --help anywhere (before a ``--``)  --> the tool's docstring on stdout, exit 0
         --> the first ``num_positional`` arguments   --> positional (a RUN_DIR, a subcommand)
         --> every other argument as ``key=value``    --> (key, value) pairs, in order
         --> an argument without ``=`` or with no key --> ``error: 'ARG': expected key=value``
                                                          on stderr, exit 2

Pairs stay in order and may repeat, so a tool can pass unknown keys through as Hydra overrides;
what a key means (known keys, types, ranges) each tool checks itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

HELP_FLAGS = ("-h", "--help")


def exit_on_help(argv: Sequence[str], doc: str | None) -> None:
    """Print ``doc`` (the tool's usage) and exit 0 when ``argv`` asks for help; arguments after
    a ``--`` belong to another command and are not looked at."""
    own = argv[: list(argv).index("--")] if "--" in argv else argv
    if any(arg in HELP_FLAGS for arg in own):
        print((doc or "").strip())
        raise SystemExit(0)


def fail(message: str) -> NoReturn:
    """Bad input: one ``error:`` line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def split_key_values(arg: str) -> tuple[str, str] | None:
    """``(key, value)`` of ``key=value`` (the value may hold ``=``), None when malformed."""
    key, sep, value = arg.partition("=")
    return (key, value) if sep and key else None


def parse_pairs(
    argv: Sequence[str], doc: str | None, *, num_positional: int = 0
) -> tuple[list[str], list[tuple[str, str]]]:
    """(the positional arguments, the ``key=value`` pairs in order) of ``argv`` (module
    docstring); exits 0 on ``--help``, 2 on a malformed argument."""
    exit_on_help(argv, doc)
    positional = list(argv[:num_positional])
    pairs = []
    for arg in argv[num_positional:]:
        pair = split_key_values(arg)
        if pair is None:
            fail(f"{arg!r}: expected key=value")
        pairs.append(pair)
    return positional, pairs


def parse_key_values(argv: Sequence[str], doc: str | None) -> dict[str, str]:
    """``key=value`` arguments as a dict (the last value of a repeated key wins); exits 0 on
    ``--help``, 2 on a malformed argument."""
    return dict(parse_pairs(argv, doc)[1])


def keys_and_overrides(
    argv: Sequence[str], doc: str | None, defaults: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """(``defaults`` updated by the arguments whose key it holds, every other argument as a
    ``key=value`` override, in order); exits 0 on ``--help``, 2 on a malformed argument."""
    values, overrides = dict(defaults), []
    for key, value in parse_pairs(argv, doc)[1]:
        if key in defaults:
            values[key] = value
        else:
            overrides.append(f"{key}={value}")
    return values, overrides
