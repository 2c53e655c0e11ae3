"""A reward function that combines a rule and the judge (``reward.custom_fn`` with a
``judge`` argument), loaded by file path as a user's reward file would be."""

from __future__ import annotations

from recipe.reward.scorers import arithmetic_score

PATH = __file__


async def rule_and_judge(data_source, solution_str, ground_truth, extra_info=None, *, judge):
    """The exact-answer rule as the score; the judge's pointwise score beside it."""
    rule = arithmetic_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": float(rule), "judge": await judge(solution_str)}
