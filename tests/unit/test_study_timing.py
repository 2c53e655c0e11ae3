"""The study's statistics: interpolated crossings, censored runs kept as +inf, bootstrap
intervals that widen (never hide) with censoring, budgets past a run's end, the power."""

from __future__ import annotations

import math

import pytest

from recipe.tools.study.timing import (
    INF,
    Point,
    accuracy_at,
    bootstrap,
    censored_median,
    crossing_s,
    mean_difference,
    mean_of,
    median_ratio,
    min_detectable_ratio,
    steady_samples_per_s,
)

CURVE = [Point(0, 0.0, 0.10), Point(512, 100.0, 0.20), Point(1024, 200.0, 0.40)]


def test_a_crossing_is_interpolated_between_the_snapshots_around_it():
    assert crossing_s(CURVE, 0.30) == pytest.approx(150.0)
    assert crossing_s(CURVE, 0.20) == pytest.approx(100.0)
    assert crossing_s(CURVE, 0.05) == 0.0
    assert crossing_s(CURVE, 0.41) is None  # censored


def test_the_first_crossing_counts_even_when_the_curve_falls_back():
    curve = [Point(0, 0.0, 0.1), Point(1, 10.0, 0.5), Point(2, 20.0, 0.2), Point(3, 30.0, 0.6)]
    assert crossing_s(curve, 0.3) == pytest.approx(5.0)


def test_accuracy_at_a_budget_past_the_end_is_the_final_accuracy():
    assert accuracy_at(CURVE, 50.0) == pytest.approx(0.15)
    assert accuracy_at(CURVE, 1e9) == 0.40


def test_a_censored_median_is_infinite_once_half_the_runs_are_censored():
    assert censored_median([1.0, 3.0, None]) == 3.0
    assert censored_median([1.0, None, None]) == INF
    assert censored_median([1.0, 3.0, 5.0, None]) == 4.0
    assert censored_median([1.0, 3.0, None, None]) == INF


def test_median_ratio_of_two_censored_modes_is_undefined_not_one():
    assert median_ratio([10.0, 20.0], [5.0, 10.0]) == pytest.approx(0.5)
    assert math.isnan(median_ratio([None, None], [None, None]))
    assert median_ratio([10.0, 20.0], [None, None]) == INF


def test_the_bootstrap_interval_holds_the_estimate_and_censoring_widens_it():
    sync = [100.0, 110.0, 95.0, 105.0]
    fast = [60.0, 66.0, 57.0, 63.0]
    tight = bootstrap([sync, fast], median_ratio, resamples=2000, seed=0)
    assert tight.estimate == pytest.approx(0.6)
    assert tight.low <= tight.estimate <= tight.high < 1.0
    censored = bootstrap([sync, [60.0, None, 57.0, None]], median_ratio, resamples=2000, seed=0)
    assert censored.high == INF  # resamples with most runs censored are not dropped
    again = bootstrap([sync, fast], median_ratio, resamples=2000, seed=0)
    assert (again.low, again.high) == (tight.low, tight.high)  # a fixed seed


def test_mean_difference_and_mean_of_refuse_missing_values():
    assert mean_difference([0.2, 0.4], [0.3, 0.5]) == pytest.approx(0.1)
    assert math.isnan(mean_of([0.2, None]))


def test_the_detectable_ratio_shrinks_with_more_runs_and_needs_a_spread():
    logs = [[math.log(100), math.log(110), math.log(95)], [math.log(60), math.log(70)]]
    four, sixteen = min_detectable_ratio(logs, 4), min_detectable_ratio(logs, 16)
    assert four is not None and sixteen is not None and four > sixteen > 1.0
    assert min_detectable_ratio([[1.0]], 4) is None


def test_steady_throughput_leaves_out_the_first_steps():
    metrics = [
        {"step": 1, "timing/step_s": 100.0, "throughput/samples": 10},
        {"step": 2, "timing/step_s": 50.0, "throughput/samples": 10},
        {"step": 3, "timing/step_s": 2.0, "throughput/samples": 10},
        {"step": 4, "timing/step_s": 3.0, "throughput/samples": 10},
    ]
    assert steady_samples_per_s(metrics) == pytest.approx(4.0)
    assert math.isnan(steady_samples_per_s(metrics[:2]))
