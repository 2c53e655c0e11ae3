"""What may stand in a metric key: ``section/name`` parts without whitespace or slashes.

Names that users' code chooses (a reward function's extra keys, an environment's
``StepResult.info`` keys) become parts of metric keys (``reward/<key>``,
``agent/info/<key>``); they are checked where they enter, so a bad one is dropped with one
warning there instead of failing the metric sink after the step has trained.
"""

from __future__ import annotations


def is_metric_part(name: str) -> bool:
    """Whether ``name`` can be one part of a metric key (``recipe.observability.tracking``)."""
    return bool(name) and not any(c.isspace() or c == "/" for c in name)
