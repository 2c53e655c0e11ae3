"""A reward function's return value as a typed ``RewardResult`` (a number, a bool, or a dict
with a ``"score"`` key whose other numeric keys become ``extras``); anything else is an error
naming the function."""

from __future__ import annotations

import functools
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from recipe.utils.metric_names import is_metric_part

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RewardResult:
    """The reward of one response."""

    score: float
    """The scalar reward the advantage estimator uses."""
    extras: dict[str, float] = field(default_factory=dict)
    """Other numeric values the function returned (e.g. ``acc``), logged as ``reward/<key>``."""


def to_reward_result(raw: Any, *, fn_name: str) -> RewardResult:
    """Normalise a reward function's return value (number, bool, or dict with ``"score"``)."""
    if isinstance(raw, dict):
        if "score" not in raw:
            raise TypeError(
                f"reward function {fn_name} returned a dict without a 'score' key "
                f"(keys: {', '.join(map(str, raw))})"
            )
        score = _as_score(raw["score"], fn_name)
        extras = {}
        for key, value in raw.items():
            if key == "score":
                continue
            if not is_metric_part(str(key)):
                _warn_dropped_extra(fn_name, str(key), "a name with a space or a slash")
            elif isinstance(value, numbers.Real):
                extras[str(key)] = float(value)
            else:
                _warn_dropped_extra(fn_name, str(key), f"non-numeric {type(value).__name__}")
        return RewardResult(score=score, extras=extras)
    return RewardResult(score=_as_score(raw, fn_name))


def _as_score(value: Any, fn_name: str) -> float:
    # numbers.Real covers bool, int, float and numpy scalars; strings and tensors are rejected.
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"reward function {fn_name} returned {type(value).__name__} {value!r:.80}; "
            "expected a float, int, bool or a dict with a 'score' key"
        )
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"reward function {fn_name} returned a non-finite score {score}")
    return score


@functools.cache
def _warn_dropped_extra(fn_name: str, key: str, why: str) -> None:
    # Once per (function, key): verl scorers return e.g. {"pred": "72"} on every call.
    logger.warning(
        "reward function %s returned %r (%s): not a reward/<key> metric, not logged",
        fn_name,
        key,
        why,
    )
