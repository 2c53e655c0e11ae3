"""The lengths study's statistics (``recipe.tools.study.length_stats``) on responses written here,
and its command line's study keys (``recipe.tools.study.lengths.parse``); the end-to-end run on a
real engine is tests/integration/test_study_lengths_cli.py."""

from __future__ import annotations

import pytest

from recipe.tools.study.length_stats import (
    ALL,
    Response,
    batch_tail,
    format_table,
    group_tail,
    groups_in_order,
    summarize,
)
from recipe.tools.study.lengths import parse


def _group(uid: str, tokens: list[int], *, level: int | None = 1, cut: int = 0, reward=0.0):
    """One prompt's responses; the first ``cut`` of them ended at the length limit."""
    return [
        Response(uid, level, i, n, "length" if i < cut else "stop", reward, "1", "x")
        for i, n in enumerate(tokens)
    ]


def test_group_tail_is_the_mean_over_groups_of_longest_over_mean():
    groups = [_group("a", [10, 10, 40]), _group("b", [5, 5])]
    # a: 40 / 20 = 2.0; b: 5 / 5 = 1.0
    assert group_tail(groups) == pytest.approx(1.5)
    assert group_tail([]) is None


def test_batch_tail_counts_whole_batches_only():
    groups = [_group("a", [10, 10]), _group("b", [40, 20]), _group("c", [100, 1])]
    # batch 1 = a + b: max 40 / mean 20 = 2.0; c alone is no whole batch of 2
    assert batch_tail(groups, 2) == (pytest.approx(2.0), 1)
    assert batch_tail(groups, 4) == (None, 0)
    # batches of one prompt are the groups: (1.0 + 40/30 + 100/50.5) / 3
    assert batch_tail(groups, 1)[0] == pytest.approx((1.0 + 4 / 3 + 100 / 50.5) / 3)
    with pytest.raises(ValueError, match="batch=0"):
        batch_tail(groups, 0)


def test_a_batch_waits_longer_than_its_groups_when_the_tail_lands_in_one_group():
    # Every group but one is short; a sync batch of all of them waits for the long one.
    groups = [_group(str(i), [10, 10]) for i in range(7)] + [_group("long", [10, 150])]
    assert group_tail(groups) == pytest.approx((7 * 1.0 + 150 / 80) / 8)
    assert batch_tail(groups, 8) == (pytest.approx(150 / (300 / 16)), 1)


def test_groups_keep_the_order_of_their_first_response():
    responses = _group("b", [1]) + _group("a", [2]) + _group("b", [3])
    assert [[r.num_tokens for r in g] for g in groups_in_order(responses)] == [[1, 3], [2]]


def test_summary_per_level_and_overall():
    responses = (
        _group("p1", [10, 20, 30, 40], level=3, cut=1, reward=1.0)
        + _group("p2", [100, 100], level=1)
        + _group("p3", [50, 50], level=None, reward=1.0)
    )
    summary = summarize(responses, batch_prompts=1)
    assert list(summary) == ["1", "3", "none", ALL]
    three = summary["3"]
    assert (three["prompts"], three["responses"], three["max"]) == (1, 4, 40)
    assert three["p50"] == pytest.approx(25.0) and three["p90"] == pytest.approx(37.0)
    assert three["mean"] == pytest.approx(25.0) and three["cut_share"] == pytest.approx(0.25)
    assert three["p90_over_p50"] == pytest.approx(37 / 25)
    assert three["group_max_over_mean"] == pytest.approx(1.6)
    assert three["reward_mean"] == 1.0 and summary["1"]["reward_mean"] == 0.0
    overall = summary[ALL]
    assert (overall["prompts"], overall["responses"], overall["num_batches"]) == (3, 8, 3)
    assert overall["cut_share"] == pytest.approx(1 / 8)
    assert overall["reward_mean"] == pytest.approx(6 / 8)
    table = format_table(summary).splitlines()
    assert len(table) == 5 and table[0].split()[:3] == ["level", "prompts", "resp"]
    assert table[-1].split()[0] == ALL


def test_rows_without_levels_give_only_the_overall_row():
    summary = summarize(_group("a", [1, 2], level=None), batch_prompts=4)
    assert list(summary) == [ALL]
    assert summary[ALL]["batch_max_over_mean"] is None
    assert "-" in format_table(summary).splitlines()[1].split()


def test_study_keys_are_taken_out_of_the_overrides():
    args = parse(["prompts=8", "rollout.n=4", "batch=2", "out=/tmp/x", "data.seed=3"])
    assert (args.num_prompts, args.batch_prompts, str(args.out)) == (8, 2, "/tmp/x")
    assert args.overrides == ("rollout.n=4", "data.seed=3")
    assert parse([]).batch_prompts is None
    for bad, message in (("prompts=0", "prompts=0"), ("seed=x", "seed='x'")):
        with pytest.raises(ValueError, match=message):
            parse([bad])
