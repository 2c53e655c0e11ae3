"""Per-step metrics of the groups the fully async trainer trained.

The staleness and partial-rollout metrics are every mode's (recipe/run/metrics.py); what is
this recipe's own is the share of groups a sync cut and resumed.
"""

from __future__ import annotations

from fully_async_policy.messages import PromptGroup
from recipe.run.metrics import sample_metrics, staleness_metrics


def group_metrics(groups: list[PromptGroup], trainer_version: int) -> dict[str, float]:
    """reward/*, response_length/*, staleness/*, partial/* of one step's groups."""
    trajs = [t for g in groups for t in g.trajectories]
    return {
        **sample_metrics(trajs),
        **staleness_metrics(trajs, trainer_version),
        "partial/resumed_group_ratio": sum(g.num_resumes > 0 for g in groups) / len(groups),
    }
