"""Advantage estimators, PPO-clip loss, aggregation, KL estimators and TIS weights against
values computed by hand."""

import math

import pytest
import torch

from recipe.algo.advantages import compute_advantages, grpo_advantages, rloo_advantages
from recipe.algo.config import AlgorithmConfig
from recipe.algo.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    ppo_clip_loss,
)

# Groups interleaved on purpose: estimators must not assume sorted rows.
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0, 5.0])
GROUPS = torch.tensor([0, 1, 0, 1, 0, 2])


def test_grpo_advantages_match_hand_computed_group_normalisation():
    adv = grpo_advantages(REWARDS, GROUPS, eps=0.0)
    # group 0: mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3)
    std0 = math.sqrt(1 / 3)
    # group 1: mean 3, unbiased std sqrt((1 + 1) / 1) = sqrt(2); group 2 is a singleton
    expected = [2 / 3 / std0, -1 / math.sqrt(2), -1 / 3 / std0, 1 / math.sqrt(2), -1 / 3 / std0, 0]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    assert torch.allclose(adv[GROUPS == 0].std(), torch.tensor(1.0))


def test_grpo_advantages_without_std_are_centered_rewards():
    adv = grpo_advantages(REWARDS, GROUPS, norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1.0, -1 / 3, 1.0, -1 / 3, 0.0]))


def test_grpo_advantages_are_zero_when_a_group_has_equal_rewards():
    adv = grpo_advantages(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([7, 7, 7]))
    assert torch.equal(adv, torch.zeros(3))


def test_rloo_advantages_use_the_mean_of_the_other_responses():
    adv = rloo_advantages(REWARDS, GROUPS)
    # group 0 [1, 0, 0]: baselines 0, 0.5, 0.5; group 1 [2, 4]: baselines 4, 2
    torch.testing.assert_close(adv, torch.tensor([1.0, -2.0, -0.5, 2.0, -0.5, 0.0]))


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_rows_not_counted_get_no_advantage_and_stay_out_of_the_baseline(estimator):
    """An episode that ended in env_error: its reward 0 is no sample of the policy."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    counted = torch.tensor([True, True, False, True, True, False])
    config = AlgorithmConfig(adv_estimator=estimator)
    adv = compute_advantages(rewards, groups, config, counted)
    without = compute_advantages(rewards[[0, 1, 3, 4]], groups[[0, 1, 3, 4]], config)
    torch.testing.assert_close(adv[[0, 1, 3, 4]], without)
    assert adv[2] == adv[5] == 0.0
    # a group with one counted row has no baseline; one with none is all 0
    lone = compute_advantages(rewards[:3], groups[:3], config, torch.tensor([True, False, False]))
    assert lone.tolist() == [0.0, 0.0, 0.0]


def test_compute_advantages_dispatches_on_adv_estimator():
    grpo = compute_advantages(REWARDS, GROUPS, AlgorithmConfig(adv_estimator="grpo"))
    rloo = compute_advantages(REWARDS, GROUPS, AlgorithmConfig(adv_estimator="rloo"))
    torch.testing.assert_close(grpo, grpo_advantages(REWARDS, GROUPS))
    torch.testing.assert_close(rloo, rloo_advantages(REWARDS, GROUPS))
    with pytest.raises(ValueError, match="must both be"):
        compute_advantages(REWARDS, GROUPS[:3], AlgorithmConfig())


def _ppo_case():
    """Two rows; row 0 clips on both sides, row 1 hits the pessimistic (unclipped) branch,
    and masked positions carry huge values that must not leak in."""
    ratio = torch.tensor([[1.5, 0.5, 1.1, 9.0], [0.5, 1.5, 7.0, 1.0]])
    old = torch.full((2, 4), -1.0)
    logp = old + ratio.log()
    adv = torch.tensor([[1.0, -1.0, 1.0, 100.0], [1.0, -1.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    # token losses: max(-A r, -A clip(r, 0.8, 1.28))
    token_losses = [[-1.28, 0.8, -1.1], [-0.5, 1.5]]
    return logp, old, adv, mask, token_losses


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (-1.28 + 0.8 - 1.1 - 0.5 + 1.5) / 5),
        ("seq-mean-token-sum", ((-1.28 + 0.8 - 1.1) + (-0.5 + 1.5)) / 2),
        ("seq-mean-token-mean", ((-1.28 + 0.8 - 1.1) / 3 + (-0.5 + 1.5) / 2) / 2),
    ],
)
def test_ppo_clip_loss_matches_hand_computed_values(mode, expected):
    logp, old, adv, mask, _ = _ppo_case()
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode=mode)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats.pg_clipfrac.item() == pytest.approx(2 / 5)
    expected_kl = -(math.log(1.5) + math.log(0.5) + math.log(1.1) + math.log(0.5) + math.log(1.5))
    assert stats.ppo_kl.item() == pytest.approx(expected_kl / 5, rel=1e-5)
    assert stats.num_tokens == 5


def test_ppo_clip_loss_gradient_is_zero_on_clipped_tokens():
    logp, old, adv, mask, _ = _ppo_case()
    logp = logp.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode="token-mean"
    )
    loss.backward()
    # d/dlogp of -A r is -A r / 5 on unclipped tokens; clipped and masked tokens get 0
    expected = torch.tensor([[0.0, 0.0, -1.1 / 5, 0.0], [-0.5 / 5, 1.5 / 5, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=1e-5, atol=1e-7)


def test_ppo_clip_loss_scales_tokens_by_importance_weights():
    logp, old, adv, mask, _ = _ppo_case()
    weights = torch.tensor([[2.0, 1.0, 0.5, 1.0], [1.0, 0.0, 1.0, 1.0]])
    loss, _ = ppo_clip_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode="token-mean",
        is_weights_bt=weights,
    )  # fmt: skip
    assert loss.item() == pytest.approx((2 * -1.28 + 0.8 + 0.5 * -1.1 - 0.5) / 5, rel=1e-5)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_shard_losses_with_global_counts_sum_to_the_full_batch_loss(mode):
    torch.manual_seed(0)
    loss_bt = torch.randn(6, 5)
    mask_bt = torch.rand(6, 5) > 0.4
    mask_bt[2] = False  # an empty response neither adds loss nor counts as a sequence
    full = agg_loss(loss_bt, mask_bt, mode)
    num_tokens, num_seqs = int(mask_bt.sum()), int((mask_bt.sum(1) > 0).sum())
    shards = [
        agg_loss(loss_bt[rows], mask_bt[rows], mode, num_tokens=num_tokens, num_seqs=num_seqs)
        for rows in (slice(0, 2), slice(2, 3), slice(3, 6))
    ]
    torch.testing.assert_close(sum(shards), full, rtol=1e-6, atol=1e-7)


def test_agg_loss_token_mean_uses_the_given_global_count():
    loss_bt = torch.tensor([[1.0, 2.0, 3.0]])
    mask_bt = torch.tensor([[1, 1, 0]])
    assert agg_loss(loss_bt, mask_bt, "token-mean").item() == pytest.approx(1.5)
    assert agg_loss(loss_bt, mask_bt, "token-mean", num_tokens=6).item() == pytest.approx(0.5)
    assert agg_loss(loss_bt, mask_bt, "seq-mean-token-sum", num_seqs=3).item() == pytest.approx(1)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(loss_bt, mask_bt, "sum")


def test_kl_estimators_match_hand_computed_values():
    logp = torch.tensor([math.log(0.5), math.log(0.25)])
    ref = torch.tensor([math.log(0.25), math.log(0.5)])
    log2 = math.log(2)
    torch.testing.assert_close(kl_penalty(logp, ref, "kl"), torch.tensor([log2, -log2]))
    torch.testing.assert_close(kl_penalty(logp, ref, "abs"), torch.tensor([log2, log2]))
    mse = 0.5 * log2**2
    torch.testing.assert_close(kl_penalty(logp, ref, "mse"), torch.tensor([mse, mse]))
    # k3 = q/p - log(q/p) - 1 with q/p = 0.5 and 2
    k3 = torch.tensor([0.5 + log2 - 1, 2 - log2 - 1])
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl"), k3)


def test_low_var_kl_is_clamped_for_extreme_ratios():
    k3 = kl_penalty(torch.tensor([0.0]), torch.tensor([-100.0]), "low_var_kl")
    assert k3.item() == 10.0
    with pytest.raises(ValueError, match="kl_loss_type"):
        kl_penalty(torch.tensor([0.0]), torch.tensor([0.0]), "k4")


def test_entropy_from_logits_is_log_v_for_uniform_and_zero_for_peaked():
    logits = torch.stack([torch.zeros(8), torch.tensor([100.0] + [0.0] * 7)])
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.tensor([math.log(8), 0.0]), atol=1e-6, rtol=0
    )
