"""DAPO's dynamic sampling on its own: which groups carry a signal, how a batch recipe's
step is refilled (exact missing counts, same order, every prompt accounted for), the cap on
generation rounds, the ledger's filtered prompts, and the soft overlong punishment."""

from __future__ import annotations

import pytest

from recipe.algo.config import FilterGroupsConfig
from recipe.algo.dynamic_sampling import (
    FilteredOutError,
    fill_batch,
    has_signal,
    metric_values,
    sample_step,
)
from recipe.checkpoint import StepLedger, num_filtered, read_ledger
from recipe.protocol import PromptRecord, Trajectory
from recipe.reward import RewardFunction
from recipe.reward.config import OverlongBufferConfig, RewardConfig
from recipe.utils.config_check import ConfigError


def _group(uid: str, rewards: list[float], **extras: list[float]) -> list[Trajectory]:
    return [
        Trajectory(
            uid,
            i,
            [1],
            [2, 3],
            [-0.1, -0.2],
            [0, 0],
            "stop",
            reward=r,
            reward_extras={k: v[i] for k, v in extras.items()},
        )
        for i, r in enumerate(rewards)
    ]


def test_a_group_has_a_signal_when_its_metric_varies():
    assert has_signal(_group("a", [0.0, 1.0]), "score")
    assert not has_signal(_group("a", [1.0, 1.0]), "score")
    assert not has_signal(_group("a", [0.0, 1.0], acc=[1.0, 1.0]), "acc")
    assert metric_values(_group("a", [0.5, 0.0], acc=[1.0, 0.0]), "acc") == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"filter_groups\.metric='acc'.*prompt 'a'"):
        has_signal(_group("a", [0.0, 1.0]), "acc")


class _Rollout:
    """Prompts p0, p1, ...; the groups of the prompts in ``flat`` have zero variance."""

    def __init__(self, flat: set[int]):
        self.flat, self.next, self.asked = flat, 0, []

    def take(self, k: int) -> tuple[list[PromptRecord], list[list[Trajectory]]]:
        self.asked.append(k)
        records = [PromptRecord(f"p{self.next + i}", "q", "a", "s") for i in range(k)]
        self.next += k
        groups = [
            _group(r.uid, [1.0, 1.0] if int(r.uid[1:]) in self.flat else [0.0, 1.0])
            for r in records
        ]
        return records, groups


def _keep(group):
    return has_signal(group, "score")


def test_refill_rounds_ask_for_exactly_the_missing_prompts_and_keep_the_order():
    rollout = _Rollout(flat={1, 3, 4, 6})
    records, groups = rollout.take(4)
    filled = fill_batch(
        records, groups, size=4, keep=_keep, generate_more=rollout.take, max_rounds=5
    )
    assert [r.uid for r in filled.records] == ["p0", "p2", "p5", "p7"]
    assert [g[0].prompt_uid for g in filled.groups] == ["p0", "p2", "p5", "p7"]
    assert filled.filtered == ["p1", "p3", "p4", "p6"] and filled.num_rounds == 4
    assert rollout.asked == [4, 2, 1, 1]  # nothing generated that the step cannot train


def test_too_many_rounds_stop_the_run_with_one_line_and_zero_means_no_limit():
    rollout = _Rollout(flat=set(range(1, 9)))
    records, groups = rollout.take(2)
    with pytest.raises(FilteredOutError, match=r"max_num_gen_batches=3") as err:
        fill_batch(records, groups, size=2, keep=_keep, generate_more=rollout.take, max_rounds=3)
    assert "\n" not in str(err.value) and "3 prompt groups were filtered in 3" in str(err.value)
    rollout = _Rollout(flat=set(range(1, 9)))
    records, groups = rollout.take(2)
    unlimited = fill_batch(
        records, groups, size=2, keep=_keep, generate_more=rollout.take, max_rounds=0
    )
    assert [r.uid for r in unlimited.records] == ["p0", "p9"] and unlimited.num_rounds == 9


def test_sample_step_passes_the_groups_through_when_disabled():
    rollout = _Rollout(flat={0})
    records, groups = rollout.take(2)
    filled = sample_step(FilterGroupsConfig(), 2, records, groups, rollout.take)
    assert filled.records == records and filled.filtered == [] and rollout.asked == [2]
    filled = sample_step(FilterGroupsConfig(enable=True), 2, records, groups, rollout.take)
    assert filled.filtered == ["p0"] and [r.uid for r in filled.records] == ["p1", "p2"]


def test_the_ledger_records_filtered_prompts_per_step(tmp_path):
    ledger = StepLedger(tmp_path)
    ledger.append(1, 1, ["a", "b"])
    ledger.append(2, 2, ["c"], ["d", "e"])
    assert read_ledger(tmp_path)[0] == {"step": 1, "param_version": 1, "trained": ["a", "b"]}
    assert read_ledger(tmp_path)[1]["filtered"] == ["d", "e"] and num_filtered(tmp_path) == 2


def test_the_overlong_buffer_penalises_responses_linearly_inside_it():
    config = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0)
    assert [config.penalty(n, 10) for n in (5, 6, 8, 10)] == [0.0, 0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match=r"overlong_buffer\.len=4.*response_length=3"):
        RewardFunction(RewardConfig(overlong_buffer=config), response_length=3)
    shaped = RewardFunction(
        RewardConfig(overlong_buffer=OverlongBufferConfig(True, 1, 0.5)), response_length=2
    )
    group = _group("p", [0.0, 0.0])  # two-token responses use the whole budget of 2
    record = PromptRecord("p", "1+1=", "2", "arithmetic")
    shaped.score_group(record, group)
    assert [t.reward_extras["overlong_penalty"] for t in group] == [-0.5, -0.5]
    with pytest.raises(ConfigError, match=r"reward\.overlong_buffer\.len=0"):
        OverlongBufferConfig(enable=True)
