"""Rollout correction (TIS, MIS, IcePop, geometric rejection) against values computed by hand.

Log-ratios are logs of simple numbers (0.25, 0.5, 2, 3), so every expected ratio, product and
cap is exact up to float32 rounding; padding positions hold huge values that must not leak."""

import math
import re
from dataclasses import fields

import pytest
import torch

from recipe.algo.config import RolloutCorrectionConfig
from recipe.algo.correction import (
    IS_LEVELS,
    RS_LEVELS,
    MismatchSums,
    geometric_reject_mask,
    rollout_correction,
    sequence_is_weights,
    sequence_reject_mask,
    token_is_weights,
    token_reject_mask,
)
from recipe.observability.tracking import MetricsAccumulator
from recipe.protocol import Trajectory
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.correction import correct_batch

L = math.log
PAD = 1e4
"""A log-ratio at a padding position: inside the mask it would dominate every result."""
KEY = "algorithm.rollout_correction"
DEFAULTS = dict(is_threshold=2.0, rs_low=0.5, rs_high=2.0)


def _t(rows: list[list[float]]) -> torch.Tensor:
    """A float32 (B, T) tensor from nested lists."""
    return torch.tensor(rows, dtype=torch.float32)


def _sums(sums: MismatchSums) -> dict[str, float]:
    """Every field of ``sums`` as a Python float, by name."""
    return {f.name: getattr(sums, f.name).item() for f in fields(sums)}


def _counts(sums: MismatchSums) -> tuple[float, ...]:
    """(masked_tokens, masked_seqs, tokens, seqs)."""
    return tuple(x.item() for x in (sums.masked_tokens, sums.masked_seqs, sums.tokens, sums.seqs))


def _correct(log_ratio_bt: torch.Tensor, mask_bt: torch.Tensor, **kwargs):
    """``rollout_correction`` on log-probs whose difference is ``log_ratio_bt``."""
    rollout_bt = torch.full_like(log_ratio_bt, -1.5)
    return rollout_correction(
        log_ratio_bt + rollout_bt, rollout_bt, mask_bt, **{**DEFAULTS, **kwargs}
    )


def test_token_is_weights_are_truncated_at_the_threshold_and_zero_off_the_mask():
    log_ratio_bt = _t([[L(0.25), L(3.0), 0.0, PAD], [L(2.0), -PAD, PAD, L(1.5)]])
    mask_bt = _t([[1, 1, 1, 0], [1, 1, 0, 0]])
    weights_bt = token_is_weights(log_ratio_bt, mask_bt, threshold=2.0)
    torch.testing.assert_close(weights_bt, _t([[0.25, 2.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]]))


def test_sequence_is_weights_use_the_product_of_masked_ratios_capped_at_the_threshold():
    log_ratio_bt = _t([[L(3.0), L(0.5), PAD], [L(3.0), L(3.0), 0.0], [PAD, PAD, PAD]])
    mask_bt = _t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    weights_bt = sequence_is_weights(log_ratio_bt, mask_bt, threshold=2.0)
    # row 0: 3 * 0.5 = 1.5; row 1: 9 capped at 2; row 2 has no masked token
    torch.testing.assert_close(weights_bt, _t([[1.5, 1.5, 0], [2, 2, 2], [0, 0, 0]]))


def test_sequence_is_weights_stay_finite_when_the_product_overflows():
    log_ratio_bt = _t([[PAD, PAD, math.inf], [-PAD, -PAD, math.nan]])
    mask_bt = _t([[1, 1, 0], [1, 1, 0]])
    weights_bt = sequence_is_weights(log_ratio_bt, mask_bt, threshold=5.0)
    torch.testing.assert_close(weights_bt, _t([[5, 5, 0], [0, 0, 0]]))


def test_token_reject_mask_keeps_masked_tokens_with_ratio_inside_inclusive_bounds():
    log_ratio_bt = _t([[L(0.25), L(0.5), 0.0, L(2.0), L(3.0), 0.0]])
    mask_bt = _t([[1, 1, 1, 1, 1, 0]])
    keep_bt = token_reject_mask(log_ratio_bt, mask_bt, low=0.5, high=2.0)
    torch.testing.assert_close(keep_bt, _t([[0, 1, 1, 1, 0, 0]]))


def test_token_reject_mask_with_a_lower_bound_of_zero_keeps_every_small_ratio():
    log_ratio_bt = _t([[-PAD, L(0.25), L(3.0)]])
    keep_bt = token_reject_mask(log_ratio_bt, torch.ones(1, 3), low=0.0, high=2.0)
    torch.testing.assert_close(keep_bt, _t([[1, 1, 0]]))


def test_sequence_reject_mask_keeps_or_drops_whole_sequences_by_the_product_ratio():
    log_ratio_bt = _t([[L(3.0), L(0.5), PAD], [L(3.0), L(3.0), 0.0], [L(0.25), L(1.0), 0.0]])
    mask_bt = _t([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    keep_bt = sequence_reject_mask(log_ratio_bt, mask_bt, low=0.5, high=2.0)
    # products: 1.5 kept (padding ignored), 9 too high, 0.25 too low
    torch.testing.assert_close(keep_bt, _t([[1, 1, 0], [0, 0, 0], [0, 0, 0]]))


def test_geometric_reject_mask_bounds_the_mean_ratio_per_token_not_the_product():
    log_ratio_bt = _t([[L(2.0), L(2.0), L(2.0)], [L(3.0), L(3.0), PAD], [PAD, PAD, PAD]])
    mask_bt = _t([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    keep_bt = geometric_reject_mask(log_ratio_bt, mask_bt, low=0.5, high=2.5)
    # row 0: product 8 but geometric mean 2, kept; row 1: mean 3, dropped; row 2 is empty
    torch.testing.assert_close(keep_bt, _t([[1, 1, 1], [0, 0, 0], [0, 0, 0]]))
    dropped_by_product = sequence_reject_mask(log_ratio_bt, mask_bt, low=0.5, high=2.5)
    assert dropped_by_product[0].sum() == 0


@pytest.mark.parametrize("reject", [token_reject_mask, sequence_reject_mask, geometric_reject_mask])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_reject_masks_return_the_dtype_of_the_input_mask(reject, dtype):
    mask_bt = torch.tensor([[1, 1, 0]]).to(dtype)
    keep_bt = reject(_t([[0.0, 0.0, PAD]]), mask_bt, low=0.5, high=2.0)
    assert keep_bt.dtype == dtype
    assert keep_bt.tolist() == mask_bt.tolist()


def test_rollout_correction_without_levels_returns_the_input_mask_no_weights_and_kl_sums():
    log_ratio_bt = _t([[L(2.0), 0.0], [L(4.0), -PAD], [PAD, PAD]])
    mask_bt = _t([[1, 1], [1, 0], [0, 0]])
    out = _correct(log_ratio_bt, mask_bt, is_level=None, rs_level=None)
    assert out.mask_bt is mask_bt
    assert out.weights_bt is None
    l2 = L(2.0)
    expected = {
        "kl_k1": -3 * l2,  # -(log 2 + 0 + log 4)
        "kl_k2": 2.5 * l2**2,  # 0.5 * (log 2)^2 + 0.5 * (2 log 2)^2
        "kl_k3": 4 - 3 * l2,  # (2 - 1 - log 2) + 0 + (4 - 1 - 2 log 2)
        "is_weight": 3.0,
        "is_weight_max": 1.0,
        "masked_tokens": 0.0,
        "masked_seqs": 0.0,
        "tokens": 3.0,
        "seqs": 2.0,
    }
    assert _sums(out.sums) == pytest.approx(expected, rel=1e-6, abs=1e-6)
    for f in fields(out.sums):
        value = getattr(out.sums, f.name)
        assert value.dtype == torch.float64 and value.dim() == 0, f.name


def test_rollout_correction_token_is_with_token_rs_is_icepop():
    log_ratio_bt = _t([[L(0.25), L(2.0), 0.0, L(3.0)]])
    out = _correct(
        log_ratio_bt, torch.ones(1, 4), is_level="token", rs_level="token", is_threshold=1.5
    )
    torch.testing.assert_close(out.mask_bt, _t([[0, 1, 1, 0]]))
    torch.testing.assert_close(out.weights_bt, _t([[0, 1.5, 1, 0]]))
    sums = _sums(out.sums)
    assert sums["is_weight"] == pytest.approx(2.5, rel=1e-6)
    assert sums["is_weight_max"] == pytest.approx(1.5, rel=1e-6)
    assert _counts(out.sums) == (2, 0, 4, 1)


def test_rollout_correction_rejects_sequences_before_sequence_is_weights_them():
    log_ratio_bt = _t([[L(3.0), L(3.0)], [L(2.0), L(0.5)], [L(3.0), L(0.5)], [PAD, PAD]])
    mask_bt = _t([[1, 1], [1, 1], [1, 1], [0, 0]])
    out = _correct(
        log_ratio_bt,
        mask_bt,
        is_level="sequence",
        rs_level="sequence",
        is_threshold=1.2,
        rs_low=0.5,
        rs_high=5.0,
    )
    # products 9 (rejected), 1, 1.5 (capped at 1.2); the empty row is neither kept nor rejected
    torch.testing.assert_close(out.mask_bt, _t([[0, 0], [1, 1], [1, 1], [0, 0]]))
    torch.testing.assert_close(out.weights_bt, _t([[0, 0], [1, 1], [1.2, 1.2], [0, 0]]))
    sums = _sums(out.sums)
    assert sums["is_weight"] == pytest.approx(4.4, rel=1e-6)
    assert sums["is_weight_max"] == pytest.approx(1.2, rel=1e-6)
    assert _counts(out.sums) == (2, 1, 6, 3)


def test_sequence_is_after_token_rejection_uses_only_the_kept_tokens():
    log_ratio_bt = _t([[L(8.0), L(0.5), L(3.0)]])
    out = _correct(
        log_ratio_bt,
        torch.ones(1, 3),
        is_level="sequence",
        rs_level="token",
        is_threshold=10.0,
        rs_low=0.4,
        rs_high=4.0,
    )
    # 0.5 * 3 = 1.5; with the rejected token the product would be 12, capped at 10
    torch.testing.assert_close(out.weights_bt, _t([[0, 1.5, 1.5]]))


def test_rollout_correction_counts_a_fully_rejected_sequence_but_not_an_empty_one():
    log_ratio_bt = _t([[L(3.0), L(3.0)], [0.0, 0.0], [PAD, PAD]])
    mask_bt = torch.tensor([[True, True], [True, False], [False, False]])
    out = _correct(log_ratio_bt, mask_bt, is_level=None, rs_level="geometric")
    assert out.mask_bt.dtype == torch.bool
    assert out.mask_bt.tolist() == [[False, False], [True, False], [False, False]]
    sums = _sums(out.sums)
    assert _counts(out.sums) == (2, 1, 3, 2)
    assert (sums["is_weight"], sums["is_weight_max"]) == (1, 1)


def test_rollout_correction_with_every_token_rejected_has_zero_is_weight_max():
    out = _correct(_t([[L(3.0), L(0.25)]]), torch.ones(1, 2), is_level="token", rs_level="token")
    assert out.weights_bt.sum() == 0
    assert _sums(out.sums)["is_weight_max"] == 0
    assert _sums(out.sums)["masked_seqs"] == 1


@pytest.mark.parametrize("rs_level", [None, *RS_LEVELS])
@pytest.mark.parametrize("is_level", [None, *IS_LEVELS])
def test_rollout_correction_stays_finite_with_huge_log_ratios(is_level, rs_level):
    log_ratio_bt = _t([[PAD, -PAD, 0.0], [-PAD, -PAD, PAD], [PAD, PAD, PAD]])
    mask_bt = _t([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    out = _correct(log_ratio_bt, mask_bt, is_level=is_level, rs_level=rs_level, rs_low=0.0)
    if out.weights_bt is not None:
        assert torch.isfinite(out.weights_bt).all()
    assert all(math.isfinite(v) for v in _sums(out.sums).values())


def test_rollout_correction_returns_detached_results():
    proximal_bt = torch.zeros(2, 3, requires_grad=True)
    out = rollout_correction(
        proximal_bt,
        torch.full((2, 3), -0.1),
        torch.ones(2, 3),
        is_level="token",
        is_threshold=2.0,
        rs_level="token",
        rs_low=0.5,
        rs_high=2.0,
    )
    assert not out.weights_bt.requires_grad
    assert not any(getattr(out.sums, f.name).requires_grad for f in fields(out.sums))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"is_level": "seq"}, "rollout_is"),
        ({"is_threshold": 0.0}, "rollout_is_threshold"),
        ({"is_threshold": math.nan}, "rollout_is_threshold"),
        ({"rs_level": "tokens"}, "rollout_rs"),
        ({"rs_low": -0.1}, "rollout_rs_threshold_lower"),
        ({"rs_low": 2.0, "rs_high": 2.0}, "rollout_rs_threshold"),
        ({"rs_low": 3.0, "rs_high": 2.0}, "rollout_rs_threshold"),
    ],
)
def test_rollout_correction_rejects_bad_levels_and_thresholds_naming_the_key(override, key):
    kwargs = {"is_level": "token", "rs_level": "token", **override}
    with pytest.raises(ValueError, match="^" + re.escape(f"{KEY}.{key}=")):
        _correct(torch.zeros(1, 2), torch.ones(1, 2), **kwargs)


def test_standalone_functions_reject_bad_thresholds_naming_the_key():
    log_ratio_bt, mask_bt = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match=re.escape(f"{KEY}.rollout_is_threshold=")):
        sequence_is_weights(log_ratio_bt, mask_bt, threshold=-1.0)
    with pytest.raises(ValueError, match=re.escape(f"{KEY}.rollout_rs_threshold=")):
        geometric_reject_mask(log_ratio_bt, mask_bt, low=1.0, high=0.5)


def test_the_driver_applies_rejection_and_weights_to_a_batch_and_reports_mismatch():
    """``correct_batch``: a sequence whose geometric-mean ratio leaves the band is masked out
    of the batch, the others carry token IS weights; the metrics are token-weighted."""
    trajs = [
        Trajectory("a", 0, [5], [6, 7], [math.log(0.5), math.log(0.5)], [0, 0], "stop"),
        Trajectory("a", 1, [5], [6, 7, 8], [0.0, 0.0, 0.0], [0, 0, 0], "stop"),
    ]
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=0)
    proximal_bt = torch.zeros_like(batch.rollout_logprobs_bt)  # ratio 2 on row 0, 1 on row 1
    config = RolloutCorrectionConfig(
        bypass_mode=False, rollout_rs="geometric", rollout_rs_threshold=1.5
    )
    metrics = MetricsAccumulator()
    out = correct_batch(batch, proximal_bt, config, metrics)
    assert out.response_mask_bt[0].sum() == 0 and out.response_mask_bt[1].sum() == 3
    torch.testing.assert_close(out.is_weights_bt, out.response_mask_bt.float())
    got = metrics.reduce()
    assert got["mismatch/masked_seq_frac"] == 0.5 and got["mismatch/masked_token_frac"] == 0.4
    assert got["mismatch/kl_k1"] == pytest.approx(2 * math.log(0.5) / 5)
    assert got["mismatch/is_weight_mean"] == 1.0 and got["mismatch/is_weight_max"] == 1.0
    bypass = RolloutCorrectionConfig(bypass_mode=True)
    assert correct_batch(batch, proximal_bt, bypass, MetricsAccumulator()).is_weights_bt is None


def test_the_correction_config_resolves_auto_and_warns_when_weights_have_no_effect(caplog):
    assert RolloutCorrectionConfig(bypass_mode=False).is_level == "token"
    assert RolloutCorrectionConfig(bypass_mode=True).is_level is None
    assert RolloutCorrectionConfig(bypass_mode=False, rollout_is=None).is_level is None
    assert RolloutCorrectionConfig(rollout_rs=None).rs_level is None
    assert RolloutCorrectionConfig(rollout_is_threshold=4.0).rs_band == (0.25, 4.0)
    with caplog.at_level("WARNING"):
        RolloutCorrectionConfig(bypass_mode=True, rollout_is="sequence")
    assert "rollout_is='sequence' has no effect with bypass_mode=true" in caplog.text
    with pytest.raises(ValueError, match=r"algorithm\.rollout_correction\.rollout_rs='tokens'"):
        RolloutCorrectionConfig(rollout_rs="tokens")
    with pytest.raises(ValueError, match=r"rollout_correction\.rollout_rs_threshold_lower=3\.0"):
        RolloutCorrectionConfig(rollout_rs_threshold=2.0, rollout_rs_threshold_lower=3.0)
