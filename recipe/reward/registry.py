"""The scorer registry: ``data_source`` -> reward function, as verl's ``default_compute_score``.

Every record names its ``data_source``; the reward component looks the scorer up here. The
built-ins cover the synthetic task, MATH-style and GSM8K-style sources, and reasoning-gym's
tasks (``recipe.reward.reasoning_gym``). Other sources either register a scorer in code::

    @register_scorer("my_org/my_dataset")
    def my_score(data_source, solution_str, ground_truth, extra_info=None) -> float: ...

or, without touching code, set ``reward.custom_fn`` to use one function for every source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recipe.reward import scorers
from recipe.reward.reasoning_gym import DATA_SOURCE as REASONING_GYM_SOURCE
from recipe.reward.reasoning_gym import reasoning_gym_score

Scorer = Callable[..., Any]
"""``fn(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``."""

# Filled at import time (built-ins below, user modules through the decorator); read-only after.
_SCORERS: dict[str, Scorer] = {}

MATH_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math",
)
GSM8K_SOURCES = ("openai/gsm8k", "gsm8k")


def register_scorer(*data_sources: str) -> Callable[[Scorer], Scorer]:
    """Decorator registering a scorer for each of ``data_sources``.

    Registering a different function for a source that already has one is an error: the
    silent override of a built-in would change rewards without a trace.
    """
    if not data_sources or not all(isinstance(s, str) and s for s in data_sources):
        raise ValueError(f"register_scorer needs non-empty data source names, got {data_sources}")

    def decorator(fn: Scorer) -> Scorer:
        if not callable(fn):
            raise TypeError(f"register_scorer({', '.join(data_sources)}): {fn!r} is not callable")
        for source in data_sources:
            current = _SCORERS.get(source)
            if current is not None and _qualified_name(current) != _qualified_name(fn):
                raise ValueError(
                    f"data_source {source!r} already has the scorer {_qualified_name(current)}; "
                    f"cannot also register {_qualified_name(fn)}"
                )
            _SCORERS[source] = fn
        return fn

    return decorator


def get_scorer(data_source: str) -> Scorer:
    """The scorer of ``data_source``; ``ValueError`` listing the known sources otherwise."""
    try:
        return _SCORERS[data_source]
    except KeyError:
        raise ValueError(
            f"no reward scorer for data_source {data_source!r}; known data sources: "
            f"{', '.join(known_data_sources())}. Set reward.custom_fn="
            "'path/to/file.py:function' (or 'package.module:function') to score it"
        ) from None


def known_data_sources() -> list[str]:
    return sorted(_SCORERS)


def _qualified_name(fn: Scorer) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


register_scorer("arithmetic")(scorers.arithmetic_score)
register_scorer("calculator")(scorers.calculator_score)
register_scorer(*MATH_SOURCES)(scorers.math_score)
register_scorer(*GSM8K_SOURCES)(scorers.gsm8k_score)
register_scorer(REASONING_GYM_SOURCE)(reasoning_gym_score)
