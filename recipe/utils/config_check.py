"""Validation helpers shared by every config schema.

Each schema validates its own fields in ``__post_init__`` (which OmegaConf runs when a
composed config is turned into objects) and names the full dotted key, so a bad value
fails at startup with one line that says what to change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config value is outside its allowed range. The message names the key."""


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed {allowed}")


def require_choice(key: str, value: Any, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    require(value in choices, key, value, "one of " + ", ".join(repr(c) for c in choices))


def require_positive(key: str, value: float | int) -> None:
    require(value is not None and value > 0, key, value, "a number > 0")


def require_non_negative(key: str, value: float | int) -> None:
    require(value is not None and value >= 0, key, value, "a number >= 0")


def require_fraction(key: str, value: float, *, open_low: bool = True) -> None:
    low_ok = value > 0 if open_low else value >= 0
    require(value is not None and low_ok and value <= 1, key, value, "a number in (0, 1]")


def warn_unused(key: str, mode: str, instead: str = "") -> None:
    """A knob that has no effect in the chosen mode warns (it does not fail); ``instead``
    says what sets the same thing in that mode, if anything does."""
    hint = f"; {instead}" if instead else ""
    logger.warning("%s has no effect in mode=%s; it is ignored%s", key, mode, hint)
