"""Response-length statistics of ``python -m recipe.tools.study.lengths``: pure functions over the
measured responses, so they are tested without an engine.

    responses (one per sample, groups of n in sampled order)
      --summarize--> per level and "all": count, p50/p90/p99/max/mean tokens, cut share,
                     tail ratios, mean reward
      --format_table--> the printed table

Tail ratios say how long a synchronous step waits for its slowest member:

    p90/p50        how far the tail of single responses reaches past the median
    group          mean over groups of (longest response / mean response) of the group's n
    batch          the same over batches of B consecutive groups (B x n responses); only
                   whole batches count (a short last batch would lower the ratio), and how
                   many there were is reported beside the value

A sync step ends when its longest response ends, while an async rollouter keeps the engine
busy meanwhile, so a batch ratio near 1 leaves async nothing to win and a large one is the
long tail the study needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ALL = "all"
"""The key of the statistics over every response, whatever its level."""
NO_LEVEL = "none"
"""The level key of responses to prompts whose ``extra_info`` holds no ``level``."""


@dataclass(frozen=True, slots=True)
class Response:
    """One measured response (a row of ``responses.jsonl``)."""

    prompt_uid: str
    """The prompt's ``PromptRecord.uid`` (responses with one uid form a group)."""
    level: int | None
    """The prompt's ``extra_info["level"]``; None when the row carries none."""
    sample_index: int
    """Index within its group, 0..n-1."""
    num_tokens: int
    """Response tokens generated (EOS included when it stopped)."""
    finish_reason: str
    """``stop`` (EOS) or ``length`` (cut at ``rollout.response_length``)."""
    reward: float
    """The run's reward of the response (the scorer of its ``data_source``)."""
    ground_truth: str
    """The prompt's reference answer."""
    text: str
    """The decoded response."""

    @property
    def level_key(self) -> str:
        return NO_LEVEL if self.level is None else str(self.level)


def groups_in_order(responses: Sequence[Response]) -> list[list[Response]]:
    """Responses grouped by prompt, groups in order of their first response."""
    groups: dict[str, list[Response]] = {}
    for response in responses:
        groups.setdefault(response.prompt_uid, []).append(response)
    return list(groups.values())


def max_over_mean(lengths: Sequence[int]) -> float:
    """Longest / mean of ``lengths`` (1.0 when all are 0: nobody waits)."""
    mean = sum(lengths) / len(lengths)
    return max(lengths) / mean if mean > 0 else 1.0


def group_tail(groups: Sequence[Sequence[Response]]) -> float | None:
    """Mean over groups of max/mean response tokens within the group; None without groups."""
    if not groups:
        return None
    return float(np.mean([max_over_mean([r.num_tokens for r in g]) for g in groups]))


def batch_tail(
    groups: Sequence[Sequence[Response]], batch_prompts: int
) -> tuple[float | None, int]:
    """(mean over whole batches of ``batch_prompts`` consecutive groups of max/mean response
    tokens over the batch, number of whole batches); (None, 0) when there is no whole batch."""
    if batch_prompts < 1:
        raise ValueError(f"batch={batch_prompts}: a batch holds at least one prompt")
    num_batches = len(groups) // batch_prompts
    ratios = []
    for b in range(num_batches):
        batch = groups[b * batch_prompts : (b + 1) * batch_prompts]
        ratios.append(max_over_mean([r.num_tokens for g in batch for r in g]))
    return (float(np.mean(ratios)) if ratios else None), num_batches


def length_stats(responses: Sequence[Response], batch_prompts: int) -> dict[str, Any]:
    """The statistics of one set of responses (a level, or all): see the module docstring."""
    if not responses:
        raise ValueError("no responses to summarise")
    tokens = np.array([r.num_tokens for r in responses], dtype=float)
    groups = groups_in_order(responses)
    p50, p90, p99 = (float(np.percentile(tokens, q)) for q in (50, 90, 99))
    batch, num_batches = batch_tail(groups, batch_prompts)
    return {
        "prompts": len(groups),
        "responses": len(responses),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": int(tokens.max()),
        "mean": float(tokens.mean()),
        "cut_share": sum(r.finish_reason == "length" for r in responses) / len(responses),
        "p90_over_p50": p90 / p50 if p50 > 0 else math.inf,
        "group_max_over_mean": group_tail(groups),
        "batch_max_over_mean": batch,
        "num_batches": num_batches,
        "reward_mean": float(np.mean([r.reward for r in responses])),
    }


def summarize(responses: Sequence[Response], batch_prompts: int) -> dict[str, dict[str, Any]]:
    """Statistics per level (ascending, ``none`` last) and over all responses (``all``);
    only ``all`` when no response has a level."""
    by_level: dict[str, list[Response]] = {}
    for response in responses:
        by_level.setdefault(response.level_key, []).append(response)
    if set(by_level) == {NO_LEVEL}:
        return {ALL: length_stats(responses, batch_prompts)}
    order = sorted(by_level, key=lambda k: (k == NO_LEVEL, int(k) if k != NO_LEVEL else 0))
    summary = {key: length_stats(by_level[key], batch_prompts) for key in order}
    summary[ALL] = length_stats(responses, batch_prompts)
    return summary


_COLUMNS = (  # (header, key, format)
    ("level", None, "{}"),
    ("prompts", "prompts", "{}"),
    ("resp", "responses", "{}"),
    ("p50", "p50", "{:.0f}"),
    ("p90", "p90", "{:.0f}"),
    ("p99", "p99", "{:.0f}"),
    ("max", "max", "{}"),
    ("mean", "mean", "{:.1f}"),
    ("cut%", "cut_share", "{:.1%}"),
    ("p90/p50", "p90_over_p50", "{:.2f}"),
    ("grp max/mean", "group_max_over_mean", "{:.2f}"),
    ("batch max/mean", "batch_max_over_mean", "{:.2f}"),
    ("batches", "num_batches", "{}"),
    ("reward", "reward_mean", "{:.3f}"),
)


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """``summarize``'s result as an aligned text table, one row per level and ``all`` last."""
    rows = [[header for header, _, _ in _COLUMNS]]
    for level, stats in summary.items():
        row = [level]
        for _, key, fmt in _COLUMNS[1:]:
            value = stats[key]
            row.append("-" if value is None else fmt.format(value).replace("%", ""))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    )
