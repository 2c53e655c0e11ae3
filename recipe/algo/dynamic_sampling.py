"""DAPO's dynamic sampling: keep only prompt groups that carry a GRPO signal, generate more
in place of the others, and account for every prompt.

A group whose responses all score alike (zero variance of ``algorithm.filter_groups.metric``)
gets advantage 0 on every token: it costs a training step's compute and teaches nothing. With
``algorithm.filter_groups.enable`` such a group is *filtered*: counted (``prompts/filtered``),
written to the step's ``ledger.jsonl`` line under ``filtered`` (never silently dropped), and
replaced by more prompts generated on the same weights::

    sync / one_step_off:  round 1: the step's R prompts --score--> kept | filtered
                          round k: exactly the missing number of fresh prompts, same version
                          ... until R kept groups, or max_num_gen_batches rounds -> stop
    fully_async:          a filtered group gives its admission slot back (admission.py), so
                          the window still trains W useful groups under the same bound

Refill rounds ask for exactly the missing number of prompts, so no group is generated that
the step cannot train: nothing is left over to discard or to carry into a later, staler step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from recipe.algo.config import FilterGroupsConfig
from recipe.faults import RunFailure
from recipe.protocol import PromptRecord, Trajectory

Group = list[Trajectory]


class FilteredOutError(RunFailure):
    """Too many groups were filtered: the step (or window) could not be filled within
    ``algorithm.filter_groups.max_num_gen_batches`` rounds."""


def metric_values(group: Sequence[Trajectory], metric: str) -> list[float]:
    """Each response's ``metric``: its reward for ``score``, else the reward function's extra
    number of that name (``ValueError`` naming the key when a response lacks it)."""
    if metric == "score":
        return [t.reward for t in group]
    missing = [t for t in group if metric not in t.reward_extras]
    if missing:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: the reward function returned no "
            f"{metric!r} for prompt {missing[0].prompt_uid!r} (it returned "
            f"{sorted(missing[0].reward_extras) or 'only a score'})"
        )
    return [t.reward_extras[metric] for t in group]


def has_signal(group: Sequence[Trajectory], metric: str) -> bool:
    """Whether the group's responses differ in ``metric`` (a GRPO advantage is non-zero)."""
    values = metric_values(group, metric)
    return max(values) > min(values)


@dataclass(slots=True)
class FilledBatch:
    """One trainer step's prompt groups after dynamic sampling."""

    records: list[PromptRecord] = field(default_factory=list)
    """Kept prompts, in generation order (R of them)."""
    groups: list[Group] = field(default_factory=list)
    """Their scored groups (same order)."""
    filtered: list[str] = field(default_factory=list)
    """Uids of the prompts filtered on the way."""
    num_rounds: int = 0
    """Generation rounds it took (1: nothing was filtered)."""


def fill_batch(
    records: list[PromptRecord],
    groups: list[Group],
    *,
    size: int,
    keep: Callable[[Group], bool],
    generate_more: Callable[[int], tuple[list[PromptRecord], list[Group]]],
    max_rounds: int,
) -> FilledBatch:
    """Split the scored first round (``records``, ``groups``) into kept and filtered groups,
    then ask ``generate_more(k)`` for the next ``k`` prompts, generated and scored on the
    same weights, until ``size`` groups are kept. ``FilteredOutError`` after ``max_rounds``
    rounds (0: no limit)."""
    out = FilledBatch()
    while True:
        out.num_rounds += 1
        for record, group in zip(records, groups, strict=True):
            if keep(group):
                out.records.append(record)
                out.groups.append(group)
            else:
                out.filtered.append(record.uid)
        missing = size - len(out.records)
        if missing <= 0:
            return out
        if max_rounds and out.num_rounds >= max_rounds:
            raise FilteredOutError(
                f"{len(out.filtered)} prompt groups were filtered in {out.num_rounds} "
                f"generation rounds and only {len(out.records)} of the step's {size} have a "
                "reward signal (zero variance in every other group): raise "
                f"algorithm.filter_groups.max_num_gen_batches={max_rounds}, or check that the "
                "reward can tell the responses apart"
            )
        records, groups = generate_more(missing)


def sample_step(
    config: FilterGroupsConfig,
    size: int,
    records: list[PromptRecord],
    groups: list[Group],
    more: Callable[[int], tuple[list[PromptRecord], list[Group]]],
) -> FilledBatch:
    """A batch recipe's step (``size`` prompts) after ``algorithm.filter_groups``: ``more(k)``
    generates and scores the next k prompts on the served version. Disabled: the groups as
    they are."""
    if not config.enable:
        return FilledBatch(records, groups, [], 1)
    return fill_batch(
        records,
        groups,
        size=size,
        keep=lambda group: has_signal(group, config.metric),
        generate_more=more,
        max_rounds=config.max_num_gen_batches,
    )
