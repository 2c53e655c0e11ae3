"""The reward component: score one decoded response against its ground truth.

    PromptRecord.data_source --> registry (built-in scorers) --+
                                 or reward.custom_fn ----------+--> fn(...) --> RewardResult

Scoring functions keep verl's calling convention (keyword arguments ``data_source``,
``solution_str``, ``ground_truth``, ``extra_info``) and may return a number, a bool or a dict
with a ``"score"`` key (extra numeric keys become ``extras``, e.g. ``acc``), so reward
functions written for verl work unchanged. ``RewardFunction`` turns whatever they return into
a typed ``RewardResult`` and fails loudly on anything else.

``RewardFunction.check_data_sources`` is meant for startup: a dataset source without a scorer
fails before any generation, not at the first batch.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from recipe.reward.config import RewardConfig
from recipe.reward.custom import load_custom_fn
from recipe.reward.registry import Scorer, get_scorer, known_data_sources, register_scorer

__all__ = [
    "RewardConfig",
    "RewardFunction",
    "RewardResult",
    "get_scorer",
    "known_data_sources",
    "register_scorer",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RewardResult:
    """The reward of one response."""

    score: float
    """The scalar reward the advantage estimator uses."""
    extras: dict[str, float] = field(default_factory=dict)
    """Other numeric values the function returned (e.g. ``acc``), logged as ``reward/<key>``."""


class RewardFunction:
    """Scores responses with the registry's scorers, or with ``reward.custom_fn`` for all.

    Pickles as its config, so a Ray actor that receives it reloads ``custom_fn`` itself
    (a function loaded from a file is not importable by name on another process).
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        self._custom_fn: Scorer | None = load_custom_fn(cfg.custom_fn) if cfg.custom_fn else None

    def __reduce__(self) -> tuple[type[RewardFunction], tuple[RewardConfig]]:
        return (RewardFunction, (self.cfg,))

    def check_data_sources(self, sources: set[str]) -> None:
        """Raise ``ValueError`` naming every source in ``sources`` that has no scorer."""
        if self._custom_fn is not None:
            return
        known = set(known_data_sources())
        missing = sorted(s for s in sources if s not in known)
        if missing:
            raise ValueError(
                f"no reward scorer for data_source {', '.join(repr(s) for s in missing)}; known "
                f"data sources: {', '.join(known_data_sources())}. Set reward.custom_fn="
                "'path/to/file.py:function' (or 'package.module:function') to score them"
            )

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> RewardResult:
        fn = self._custom_fn if self._custom_fn is not None else get_scorer(data_source)
        raw = fn(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
        )
        return to_reward_result(raw, fn_name=self._fn_name(fn))

    def _fn_name(self, fn: Scorer) -> str:
        if self._custom_fn is not None:
            return f"reward.custom_fn={self.cfg.custom_fn!r}"
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


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
            if isinstance(value, numbers.Real):
                extras[str(key)] = float(value)
            else:
                _warn_dropped_extra(fn_name, str(key), type(value).__name__)
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
def _warn_dropped_extra(fn_name: str, key: str, type_name: str) -> None:
    # Once per (function, key): verl scorers return e.g. {"pred": "72"} on every call.
    logger.warning(
        "reward function %s returned non-numeric %r (%s); it is not logged", fn_name, key, type_name
    )
