"""Per-step metrics of the groups the fully async trainer trained, and their run totals.

Staleness of a sample = the trainer's weights version when it is trained minus the oldest
version that produced one of its tokens (``Trajectory.min_version``); the token-weighted
variants count each response token with its own version. A sample is *partial* when its
tokens come from more than one version (it was paused by a sync and resumed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fully_async_policy.messages import PromptGroup
from recipe.run.metrics import sample_metrics


def group_metrics(groups: list[PromptGroup], trainer_version: int) -> dict[str, float]:
    """reward/*, response_length/*, staleness/*, partial/* of one step's groups."""
    trajs = [t for g in groups for t in g.trajectories]
    num = len(trajs)
    staleness = [trainer_version - t.min_version for t in trajs if t.token_versions]
    token_staleness = [trainer_version - v for t in trajs for v in t.token_versions]
    spans = [t.max_version - t.min_version for t in trajs if t.token_versions]
    return {
        **sample_metrics(trajs),
        "staleness/mean": _mean(staleness),
        "staleness/max": float(max(staleness, default=0)),
        "staleness/token_mean": _mean(token_staleness),
        "staleness/token_max": float(max(token_staleness, default=0)),
        "partial/ratio": sum(s > 0 for s in spans) / num,
        "partial/max_span": float(max(spans, default=0)),
        "partial/resumed_group_ratio": sum(g.num_resumes > 0 for g in groups) / len(groups),
    }


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass(slots=True)
class RunTotals:
    """Sample-weighted totals over the whole run (for ``summary.json``)."""

    num_samples: int = 0
    """Responses trained."""
    num_partial: int = 0
    """Responses whose tokens came from more than one version."""
    staleness_sum: float = 0.0
    """Sum of per-response staleness (versions)."""
    staleness_max: int = 0
    """Largest per-response staleness (versions)."""
    staleness_counts: Counter[int] = field(default_factory=Counter)
    """Responses trained per staleness (versions)."""

    def add(self, groups: list[PromptGroup], trainer_version: int) -> None:
        for traj in (t for g in groups for t in g.trajectories):
            self.num_samples += 1
            if not traj.token_versions:
                continue
            staleness = trainer_version - traj.min_version
            self.staleness_sum += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            self.staleness_counts[staleness] += 1
            self.num_partial += traj.max_version > traj.min_version

    def summary(self) -> dict[str, float | dict[str, int]]:
        num = max(self.num_samples, 1)
        return {
            "samples/trained": self.num_samples,
            "staleness/max": self.staleness_max,
            "staleness/mean": self.staleness_sum / num,
            "staleness/histogram": {str(k): n for k, n in sorted(self.staleness_counts.items())},
            "partial/ratio": self.num_partial / num,
        }
