"""verl's reward function in the peer benchmark (``reward.custom_reward_function.path``): our
scorer registry, so both systems score every response with the same code (for
``openai/gsm8k`` ours is verl's strict ``#### N`` rule, restated in
``recipe.reward.scorers.gsm8k_score``)."""

from __future__ import annotations

from typing import Any

from recipe.reward.registry import get_scorer


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    return get_scorer(data_source)(data_source, solution_str, ground_truth, extra_info)
