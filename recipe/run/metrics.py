"""Metrics of the responses a step trained (or a validation generated), and the run's totals,
shared by every mode. Each recipe adds what is its own (timing, queues, idle ratios)::

    sample_metrics      reward/mean, reward/accuracy, reward/<key> (the extra numbers of a
                        dict result), response_length/mean|max|min (max over mean: how far
                        the step's longest response outran its average, the tail a sync
                        step waits for), response_length/clip_ratio,
                        throughput/samples, throughput/tokens, agent/* (multi-turn
                        episodes: recipe/agent/metrics.py)
    staleness_metrics   staleness/mean|max (per response), staleness/token_mean|token_max,
                        partial/ratio, partial/max_span, and where a step trained both
                        kinds, partial/reward_mean and partial/whole_reward_mean (the mean
                        reward of its partial and of its single-version responses: whether
                        responses a sync cut score differently, read beside their lengths,
                        partial/response_length_mean)
    RunTotals           the same over the run, for summary.json (run_summary)

Staleness of a response = the trainer's weights version when it is trained minus the oldest
version that produced one of its tokens (``Trajectory.min_version``); the token variants count
each response token with its own version. A response is *partial* when its tokens come from
more than one version (a sync paused it and it went on). The sync baseline trains what the
current version generated: staleness 0, measured, not assumed.

``response_length/clip_ratio`` is the share of responses cut at ``rollout.response_length``;
validation also reports it (``response/clip_ratio``) and warns above ``CLIP_WARN_RATIO``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recipe.agent.metrics import agent_metrics
from recipe.protocol import Trajectory
from recipe.utils.metric_names import is_metric_part

if TYPE_CHECKING:
    from recipe.reward import RewardFunction

logger = logging.getLogger(__name__)

CLIP_WARN_RATIO = 0.1
"""Validation warns when more than this fraction of responses hit ``rollout.response_length``."""


def sample_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Reward, length and token counts of ``trajs`` (at least one)."""
    num = len(trajs)
    lengths = [t.num_response_tokens for t in trajs]
    out = {
        "reward/mean": sum(t.reward for t in trajs) / num,
        "reward/accuracy": sum(t.reward >= 1.0 for t in trajs) / num,
        **reward_extra_means(trajs),
        "response_length/mean": sum(lengths) / num,
        "response_length/max": float(max(lengths)),
        "response_length/min": float(min(lengths)),
        "response_length/clip_ratio": response_clip_ratio(trajs),
        "throughput/samples": float(num),
        "throughput/tokens": float(sum(t.num_episode_tokens for t in trajs)),
        **agent_metrics(trajs),
    }
    return out


def reward_extra_means(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``reward/<key>``: the mean of each extra number the reward function returned, over
    the responses that returned it (``reward/mean`` and ``reward/accuracy`` are ours)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for traj in trajs:
        for key, value in traj.reward_extras.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    reserved = {"mean", "accuracy"}
    return {
        f"reward/{key if key not in reserved else 'fn_' + key}": sums[key] / counts[key]
        for key in sorted(sums)
        if is_metric_part(key)
    }


def response_clip_ratio(trajs: Sequence[Trajectory]) -> float:
    """Fraction of ``trajs`` cut off at ``rollout.response_length`` (finish_reason ``length``)."""
    return sum(t.finish_reason == "length" for t in trajs) / len(trajs) if trajs else 0.0


def clip_warning(ratio: float, response_length: int) -> str | None:
    """The validation warning when more than ``CLIP_WARN_RATIO`` of responses were cut off
    (the tiny preset's 16 tokens cut most answers short), else None."""
    if ratio <= CLIP_WARN_RATIO:
        return None
    return (
        f"{ratio:.0%} of validation responses stopped at rollout.response_length="
        f"{response_length} tokens (finish_reason 'length'; more than {CLIP_WARN_RATIO:.0%}): "
        f"their answers are cut off. Raise it, e.g. rollout.response_length={2 * response_length}"
    )


def val_sampling(version: int, temperature: float) -> dict[str, Any]:
    """Generation arguments of a validation: one answer per prompt at ``temperature``
    (``rollout.val_temperature``, greedy by default) on ``version``, the one served now, to
    its end of sequence."""
    return {"version": version, "n": 1, "temperature": temperature,
            "top_p": 1.0, "top_k": -1, "training": False}  # fmt: skip


def val_metrics(
    groups: Sequence[Sequence[Trajectory]], start: float, response_length: int
) -> dict[str, float]:
    """``val/*`` of scored validation ``groups`` (one per val record), begun at ``start``
    (``time.perf_counter()``); warns when many answers hit ``response_length``."""
    trajs = [t for group in groups for t in group]
    scores = [t.reward for t in trajs]
    lengths = [t.num_response_tokens for t in trajs]
    clipped = response_clip_ratio(trajs)
    if (warning := clip_warning(clipped, response_length)) is not None:
        logger.warning(warning)
    return {
        "val/accuracy": sum(s >= 1.0 for s in scores) / len(scores),
        "val/num_prompts": float(len(scores)),
        "val/reward_mean": sum(scores) / len(scores),
        "val/response_length_mean": sum(lengths) / len(lengths),
        "response/clip_ratio": clipped,
        "timing/val_s": time.perf_counter() - start,
    }


def judge_metrics(reward_fn: RewardFunction, step: Mapping[str, float]) -> dict[str, float]:
    """The judge's ``judge/*`` metrics of a batch recipe's ``step`` (its other metrics), with
    ``judge/trainer_wait_share``: the share of the step the trainer waited on scoring
    (``timing/reward_s`` over ``timing/step_s``); empty without a judge."""
    out = reward_fn.drain_metrics()
    if out:
        waited = step.get("timing/reward_s", 0.0)
        out["judge/trainer_wait_share"] = waited / max(step["timing/step_s"], 1e-9)
    return out


def staleness_metrics(trajs: Sequence[Trajectory], trainer_version: int) -> dict[str, float]:
    """staleness/* and partial/* of responses trained at ``trainer_version``."""
    staleness = [trainer_version - t.min_version for t in trajs if t.model_versions]
    token_staleness = [trainer_version - v for t in trajs for v in t.model_versions]
    spans = [t.max_version - t.min_version for t in trajs if t.model_versions]
    out = {
        "staleness/mean": _mean(staleness),
        "staleness/max": float(max(staleness, default=0)),
        "staleness/token_mean": _mean(token_staleness),
        "staleness/token_max": float(max(token_staleness, default=0)),
        "partial/ratio": sum(s > 0 for s in spans) / max(len(trajs), 1),
        "partial/max_span": float(max(spans, default=0)),
    }
    return out | _partial_split(trajs)


def _partial_split(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Rewards of the partial and of the single-version responses, where both were trained
    (a mean over none is left out, not written as 0)."""
    partial = [t for t in trajs if t.model_versions and t.max_version > t.min_version]
    whole = [t for t in trajs if t.model_versions and t.max_version == t.min_version]
    if not partial or not whole:
        return {}
    return {
        "partial/reward_mean": _mean([t.reward for t in partial]),
        "partial/whole_reward_mean": _mean([t.reward for t in whole]),
        "partial/response_length_mean": _mean([t.num_response_tokens for t in partial]),
    }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass(slots=True)
class RunTotals:
    """Response-weighted totals over the whole run (for ``summary.json``; checkpointed)."""

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

    def add(self, trajs: Sequence[Trajectory], trainer_version: int) -> None:
        for traj in trajs:
            self.num_samples += 1
            if not traj.model_versions:
                continue
            staleness = trainer_version - traj.min_version
            self.staleness_sum += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            self.staleness_counts[staleness] += 1
            self.num_partial += traj.max_version > traj.min_version

    def summary(self) -> dict[str, Any]:
        num = max(self.num_samples, 1)
        return {
            "samples/trained": self.num_samples,
            "staleness/max": self.staleness_max,
            "staleness/mean": self.staleness_sum / num,
            "staleness/histogram": {str(k): n for k, n in sorted(self.staleness_counts.items())},
            "partial/ratio": self.num_partial / num,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON values (the per-staleness counts get string keys)."""
        return {
            "num_samples": self.num_samples,
            "num_partial": self.num_partial,
            "staleness_sum": self.staleness_sum,
            "staleness_max": self.staleness_max,
            "staleness_counts": {str(k): v for k, v in self.staleness_counts.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RunTotals:
        counts = Counter({int(k): int(v) for k, v in state["staleness_counts"].items()})
        return cls(
            num_samples=int(state["num_samples"]),
            num_partial=int(state["num_partial"]),
            staleness_sum=float(state["staleness_sum"]),
            staleness_max=int(state["staleness_max"]),
            staleness_counts=counts,
        )


def run_summary(
    mode: str,
    *,
    steps: int,
    version: int,
    totals: RunTotals,
    initial_val: Mapping[str, float],
    final_val: Mapping[str, float],
    wall_s: float,
) -> dict[str, Any]:
    """The ``summary.json`` fields every mode writes; a recipe adds its own (prompts,
    queues, idle ratios, faults)."""
    return {
        "mode": mode,
        "steps": steps,
        "param_version": version,
        "initial/val_accuracy": initial_val.get("val/accuracy"),
        "final/val_accuracy": final_val.get("val/accuracy"),
        **totals.summary(),
        "throughput/samples_per_s": totals.num_samples / wall_s,
        "wall_s": wall_s,
    }
