"""GSPO, CISPO, Dr.GRPO's constant aggregation and the policy-loss dispatcher against values
and gradients computed by hand."""

import math

import pytest
import torch

from recipe.algo.losses import PolicyLossInputs, agg_loss, ppo_clip_loss
from recipe.algo.policy_loss import cispo_loss, gspo_loss, policy_loss
from recipe.workers.config import DR_GRPO_AGG_MODE
from recipe.workers.trainer.actor_loss import aggregation

CLIP = {"clip_low": 0.2, "clip_high": 0.28}
LOG2 = math.log(2.0)


def _gspo_case():
    """Row 0: s = 1 (ratios 2, 0.5, 1), mixed advantages, nothing clipped. Row 1: s = 2 with
    A = +1, clipped to 1.28. Row 2: s = sqrt(4 * 1) = 2 with A = -1, the pessimistic unclipped
    branch. Padded positions carry ratio 9 and advantage 100, which must not leak in."""
    ratio = torch.tensor([[2.0, 0.5, 1.0], [2.0, 2.0, 9.0], [4.0, 1.0, 9.0]], dtype=torch.float64)
    old = torch.full((3, 3), -1.0, dtype=torch.float64)
    logp = (old + ratio.log()).requires_grad_(True)
    adv = torch.tensor([[-1.0, 2.0, 0.5], [1.0, 1.0, 100.0], [-1.0, -1.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    return logp, old, adv.double(), mask


def test_gspo_loss_matches_hand_computed_values():
    logp, old, adv, mask = _gspo_case()
    loss, stats = gspo_loss(logp, old, adv, mask, **CLIP)
    # token losses: row 0 [1, -2, -0.5]; row 1 max(-2, -1.28) twice; row 2 max(2, 1.28) twice
    expected = ((1 - 2 - 0.5) / 3 + -1.28 + 2.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    assert stats.pg_clipfrac.item() == pytest.approx(2 / 7)
    # log-ratios: log 2, -log 2, 0, log 2, log 2, 2 log 2, 0
    assert stats.ppo_kl.item() == pytest.approx(-4 * LOG2 / 7, rel=1e-6)
    assert stats.num_tokens.item() == 7


def test_gspo_gradient_is_sequence_ratio_times_advantage_and_zero_when_clipped():
    logp, old, adv, mask = _gspo_case()
    loss, _ = gspo_loss(logp, old, adv, mask, **CLIP)
    loss.backward()
    # d/dlogp_t = -A_t * s_i * (0 if clipped else 1) / (tokens_i * num_seqs); padding gets 0
    expected = torch.tensor(
        [[1 / 9, -2 / 9, -0.5 / 9], [0.0, 0.0, 0.0], [2 / 6, 2 / 6, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(logp.grad, expected)


def test_gspo_token_gradient_equals_finite_differences_of_the_sequence_objective():
    """With one advantage per sequence, GSPO-token's gradient is that of sequence-level GSPO:
    the mean over sequences of max(-A_i s_i, -A_i clip(s_i)), s_i depending on all its tokens."""
    torch.manual_seed(0)
    old = -torch.rand(3, 4, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(3, 4, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[1.0], [-0.5], [2.0]], dtype=torch.float64).expand(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    clip = {"clip_low": 0.05, "clip_high": 0.05}

    def sequence_objective(lp):
        log_s = ((lp - old) * mask).sum(-1) / mask.sum(-1)
        s, a = log_s.exp(), adv[:, 0]
        return torch.maximum(-a * s, -a * s.clamp(0.95, 1.05)).mean()

    gspo_loss(logp, old, adv, mask, **clip)[0].backward()
    fd = torch.zeros_like(logp)
    eps = 1e-6
    for i, t in mask.nonzero().tolist():
        step = torch.zeros_like(logp)
        step[i, t] = eps
        lp = logp.detach()
        fd[i, t] = (sequence_objective(lp + step) - sequence_objective(lp - step)) / (2 * eps)
    on_mask = fd[mask.bool()]
    assert (on_mask == 0).any() and (on_mask != 0).any()  # some sequences clip, some do not
    torch.testing.assert_close(logp.grad, fd, rtol=1e-6, atol=1e-9)


def test_gspo_ignores_agg_mode_and_num_tokens():
    logp, old, adv, mask = _gspo_case()
    base, _ = gspo_loss(logp, old, adv, mask, **CLIP)
    other, _ = gspo_loss(logp, old, adv, mask, **CLIP, agg_mode="token-mean", num_tokens=99)
    torch.testing.assert_close(other, base)


def test_gspo_scales_tokens_by_importance_weights():
    logp, old, adv, mask = _gspo_case()
    weights = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]).double()
    loss, _ = gspo_loss(logp, old, adv, mask, **CLIP, is_weights_bt=weights)
    expected = ((2 - 2 - 0.5) / 3 + -1.28 / 2 + 2.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-9)


def _cispo_case():
    """Row 0 ratios 1.5, 0.5, 1.1 (first two clipped); row 1 ratios 0.5, 1.5 and a padded 9."""
    ratio = torch.tensor([[1.5, 0.5, 1.1], [0.5, 1.5, 9.0]], dtype=torch.float64)
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    logp = (old + ratio.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0], [1.0, -1.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp, old, adv, mask


def test_cispo_loss_matches_hand_computed_values():
    logp, old, adv, mask = _cispo_case()
    loss, stats = cispo_loss(logp, old, adv, mask, **CLIP, agg_mode="token-mean")
    # -clip(r) * A * logp, clip(r) = 1.28, 0.8, 1.1 / 0.8, 1.28 and logp = -1 + log r
    terms = [(1.28, 1, 1.5), (0.8, -1, 0.5), (1.1, 1, 1.1), (0.8, 1, 0.5), (1.28, -1, 1.5)]
    expected = sum(-w * a * (-1 + math.log(r)) for w, a, r in terms) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    assert stats.pg_clipfrac.item() == pytest.approx(4 / 5)  # every ratio but 1.1 is clipped
    expected_kl = -(2 * math.log(1.5) + 2 * math.log(0.5) + math.log(1.1)) / 5
    assert stats.ppo_kl.item() == pytest.approx(expected_kl, rel=1e-6)
    assert stats.num_tokens.item() == 5


def test_cispo_keeps_the_gradient_of_clipped_tokens_where_ppo_clip_drops_it():
    logp, old, adv, mask = _cispo_case()
    cispo_loss(logp, old, adv, mask, **CLIP, agg_mode="token-mean")[0].backward()
    cispo_grad, logp.grad = logp.grad.clone(), None
    ppo_clip_loss(logp, old, adv, mask, **CLIP, agg_mode="token-mean")[0].backward()
    # CISPO: -sg(clip(r)) * A / 5 on every token, 0 off the mask
    expected = torch.tensor([[-1.28, 0.8, -1.1], [-0.8, 1.28, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(cispo_grad, expected)
    # row 0, token 0: r = 1.5 > 1.28 with A > 0, so PPO's clipped term is active
    assert logp.grad[0, 0].item() == 0.0
    assert cispo_grad[0, 0].item() != 0.0


def test_cispo_scales_tokens_by_importance_weights():
    logp, old, adv, mask = _cispo_case()
    weights = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    plain, _ = cispo_loss(logp, old, adv, mask, **CLIP, agg_mode="token-mean")
    weighted, _ = cispo_loss(
        logp, old, adv, mask, **CLIP, agg_mode="token-mean", is_weights_bt=weights
    )
    dropped = -1.28 * 1 * (-1 + math.log(1.5)) / 5
    assert weighted.item() == pytest.approx(plain.item() - dropped, rel=1e-9)


def _random_batch(seed: int):
    torch.manual_seed(seed)
    old = -torch.rand(4, 5, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(4, 5, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(4, 1, dtype=torch.float64).expand(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    return logp, old, adv, mask


@pytest.mark.parametrize(
    ("loss_fn", "kwargs"),
    [
        (cispo_loss, {"clip_low": 1.0, "clip_high": 0.2, "agg_mode": "token-mean"}),
        (gspo_loss, {"clip_low": 0.1, "clip_high": 0.1}),
    ],
)
def test_micro_batch_losses_with_global_counts_sum_to_the_full_batch_loss(loss_fn, kwargs):
    logp, old, adv, mask = _random_batch(0)
    full, _ = loss_fn(logp, old, adv, mask, **kwargs)
    full_grad = torch.autograd.grad(full, logp)[0]
    counts = {"num_tokens": int(mask.sum()), "num_seqs": 4}
    halves = [
        loss_fn(logp[rows], old[rows], adv[rows], mask[rows], **kwargs, **counts)[0]
        for rows in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close(sum(halves), full)
    torch.testing.assert_close(torch.autograd.grad(sum(halves), logp)[0], full_grad)


def test_dr_grpo_aggregation_divides_token_sums_by_a_constant_length():
    loss_bt = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask_bt = torch.tensor([[1, 1, 0], [1, 0, 0]])
    mode, counts = aggregation(DR_GRPO_AGG_MODE, {"num_tokens": 3, "num_seqs": 2}, 4)
    # (1 + 2 + 4) / (2 sequences * 4 tokens)
    assert agg_loss(loss_bt, mask_bt, mode, **counts).item() == pytest.approx(7 / 8)
    assert aggregation("token-mean", {"num_seqs": 2}, 4) == ("token-mean", {"num_seqs": 2})


def test_dr_grpo_aggregation_weighs_tokens_equally_whatever_the_response_length():
    loss_bt = torch.ones(2, 4, requires_grad=True)
    mask_bt = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])
    mode, counts = aggregation(DR_GRPO_AGG_MODE, {"num_tokens": 5, "num_seqs": 2}, 4)
    agg_loss(loss_bt, mask_bt, mode, **counts).backward()
    torch.testing.assert_close(loss_bt.grad, mask_bt.float() / 8)
    loss_bt.grad = None
    agg_loss(loss_bt, mask_bt, "seq-mean-token-mean").backward()
    assert loss_bt.grad[0, 0] > loss_bt.grad[1, 0]  # the length bias Dr.GRPO removes


@pytest.mark.parametrize(
    ("name", "loss_fn"), [("ppo", ppo_clip_loss), ("gspo", gspo_loss), ("cispo", cispo_loss)]
)
def test_policy_loss_dispatches_on_the_name(name, loss_fn):
    logp, old, adv, mask = _cispo_case()
    kwargs = {**CLIP, "agg_mode": "token-mean"}
    got, got_stats = policy_loss(name, PolicyLossInputs(logp, old, adv, mask, **kwargs))
    want, want_stats = loss_fn(logp, old, adv, mask, **kwargs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_stats.pg_clipfrac, want_stats.pg_clipfrac)


def test_policy_loss_rejects_an_unknown_name_naming_the_key_and_choices():
    logp, old, adv, mask = _cispo_case()
    inputs = PolicyLossInputs(logp, old, adv, mask, **CLIP, agg_mode="token-mean")
    with pytest.raises(ValueError, match=r"algorithm\.policy_loss='grpo'.*ppo.*gspo.*cispo"):
        policy_loss("grpo", inputs)
