"""Metrics of the responses a step trained (or a validation generated), shared by every mode.

Each recipe adds what is its own (staleness, partial rollout, timing) to these::

    reward/mean, reward/accuracy, reward/<key>    what the reward function returned
                                                  (<key>: the extra numbers of a dict result)
    response_length/mean, response_length/clip_ratio
    throughput/samples, throughput/tokens

``response_length/clip_ratio`` is the share of responses cut at ``rollout.response_length``;
validation also reports it (``response/clip_ratio``) and warns above ``CLIP_WARN_RATIO``.
"""

from __future__ import annotations

from collections.abc import Sequence

from recipe.protocol import Trajectory

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
        "response_length/clip_ratio": response_clip_ratio(trajs),
        "throughput/samples": float(num),
        "throughput/tokens": float(sum(lengths) + sum(len(t.prompt_ids) for t in trajs)),
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
        if _is_metric_name(key)
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


def _is_metric_name(key: str) -> bool:
    # A metric key part: no whitespace or slashes (tracking.validate_metric_key).
    return bool(key) and not any(c.isspace() or c == "/" for c in key)
