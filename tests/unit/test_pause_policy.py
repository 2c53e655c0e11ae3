"""``PausePolicy.of``: one policy per pair of ``partial_rollout`` and ``multi_turn.enable``."""

from __future__ import annotations

import pytest

from fully_async_policy.rollouter.pause_policy import PausePolicy
from tests.helpers.in_process import fully_async_config


@pytest.mark.parametrize(
    ("partial", "multi_turn", "policy"),
    [
        (False, False, PausePolicy.DRAIN),
        (False, True, PausePolicy.DRAIN),
        (True, False, PausePolicy.CUT),
        (True, True, PausePolicy.KEEP_EPISODES),
    ],
)
def test_the_pause_policy_is_chosen_once_from_partial_rollout_and_multi_turn(
    partial, multi_turn, policy
):
    cfg = fully_async_config(**{"async_training.partial_rollout": partial})
    cfg.rollout.multi_turn.enable = multi_turn
    chosen = PausePolicy.of(cfg)
    assert chosen is policy
    assert chosen.drains_at_hold == (not partial)
    assert chosen.waits_for_cut_groups == (partial and not multi_turn)
    assert chosen.keeps_episodes == (partial and multi_turn)
