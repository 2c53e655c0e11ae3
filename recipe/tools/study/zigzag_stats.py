"""The statistics of ``python -m recipe.tools.study.zigzag``: pure functions over a column's
values by window (zigzag_steps.by_window: x(k, p), window k, position p of T) and over the
reward series, so nothing here reads a file.

    position p vs 1, per window (contrast): x(k, p) - [(1 - f) x(k, 1) + f x(k + 1, 1)],
        f = (p - 1) / T: the first steps on both sides, interpolated, so a trend in the run
        (learning) cancels; sign-flip permutation p-value over the windows (two-sided)
    across a push (across_push), x(k + 1, 1) - x(k, T): the first step after it against the
        last before it; with T = 2 and staleness_threshold = 0.5 both train groups admitted
        in window k (its late finishers against its early ones), so no difference of weights
        versions enters it
    reward series (reward_autocorrelation): lag-1 autocorrelation (negative = zigzag) of the
        reward minus its centred moving average, against the same statistic of the run's own
        residuals shuffled (the permutation null: what the detrending alone gives)

contrast, across_push, reward_autocorrelation and nanmean leave out values that are not
finite (a column a step did not record).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Contrast:
    """Position p against position 1, over the windows that have both."""

    mean: float
    """Mean over windows of x(k, p) minus the interpolated first steps around it."""
    p_value: float
    """Two-sided sign-flip permutation p-value of that mean."""
    num_windows: int


@dataclass(frozen=True, slots=True)
class Autocorrelation:
    lag1: float
    """Lag-1 autocorrelation of the detrended reward."""
    null_mean: float
    """The same statistic over shuffled residuals (what detrending alone gives)."""
    p_low: float
    """Share of shuffles at or below ``lag1`` (small: a zigzag beyond chance)."""


def contrast(
    windows: list[dict[int, float]], position: int, sync_every: int, rng: np.random.Generator,
    permutations: int,
) -> Contrast:  # fmt: skip
    """Position ``position`` against the first steps of its window and the next (module
    docstring); NaN values and windows without both are left out."""
    f = (position - 1) / sync_every
    diffs = [
        here[position] - ((1 - f) * here[1] + f * after[1])
        for here, after in itertools.pairwise(windows)
        if position in here and 1 in here and 1 in after
    ]
    diffs = [d for d in diffs if math.isfinite(d)]
    if not diffs:
        return Contrast(math.nan, math.nan, 0)
    return Contrast(float(np.mean(diffs)), sign_flip_p(diffs, rng, permutations), len(diffs))


def across_push(
    windows: list[dict[int, float]], sync_every: int, rng: np.random.Generator, permutations: int
) -> Contrast:
    """x(k + 1, 1) - x(k, T): the first step after a push against the last before it. With
    T = 2 and staleness_threshold = 0.5 both train groups admitted in window k, its late and
    its early finishers, so no difference of weights versions enters it."""
    diffs = [
        after[1] - here[sync_every]
        for here, after in itertools.pairwise(windows)
        if sync_every in here and 1 in after
    ]
    diffs = [d for d in diffs if math.isfinite(d)]
    if not diffs:
        return Contrast(math.nan, math.nan, 0)
    return Contrast(float(np.mean(diffs)), sign_flip_p(diffs, rng, permutations), len(diffs))


def sign_flip_p(diffs: Sequence[float], rng: np.random.Generator, permutations: int) -> float:
    """Two-sided p-value of mean(diffs) != 0 under random signs (paired permutation test)."""
    values = np.asarray(diffs, dtype=float)
    observed = abs(values.mean())
    signs = rng.choice((-1.0, 1.0), size=(permutations, len(values)))
    null = np.abs((signs * values).mean(axis=1))
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + permutations))


def detrend(values: Sequence[float], width: int) -> np.ndarray:
    """``values`` minus their centred moving average over ``width`` steps (shorter at the
    ends)."""
    x = np.asarray(values, dtype=float)
    half = width // 2
    trend = np.array([x[max(0, i - half) : i + half + 1].mean() for i in range(len(x))])
    return x - trend


def lag1(values: np.ndarray) -> float:
    """Lag-1 autocorrelation (NaN for fewer than 3 values or a constant series)."""
    x = values - values.mean()
    denominator = float(np.dot(x, x))
    if len(x) < 3 or denominator == 0.0:
        return math.nan
    return float(np.dot(x[:-1], x[1:]) / denominator)


def reward_autocorrelation(
    rewards: Sequence[float], width: int, rng: np.random.Generator, permutations: int
) -> Autocorrelation:
    """Lag-1 autocorrelation of the detrended reward against shuffled residuals put back on
    the same trend and detrended again."""
    x = np.asarray([r for r in rewards if math.isfinite(r)], dtype=float)
    residual = detrend(x, width)
    trend = x - residual
    observed = lag1(residual)
    null = np.array(
        [lag1(detrend(trend + rng.permutation(residual), width)) for _ in range(permutations)]
    )
    null = null[np.isfinite(null)]
    if not math.isfinite(observed) or not len(null):
        return Autocorrelation(observed, math.nan, math.nan)
    p_low = float((1 + np.sum(null <= observed + 1e-12)) / (1 + len(null)))
    return Autocorrelation(observed, float(null.mean()), p_low)


def nanmean(values: list[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan
