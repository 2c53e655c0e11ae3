"""The statistics of a time-to-accuracy study: per-run crossing times, censored runs kept,
bootstrap confidence intervals of the ratio, accuracy at fixed budgets, and the power.

Per run, from its evaluated snapshots ``(samples, clock_s, accuracy)`` (the initial weights at
0 s first):

    crossing_s(target)   the training clock at which the accuracy first reaches the target,
                         interpolated linearly between the two snapshots around it; None when
                         the run never reaches it (censored: kept, as +inf, never dropped)
    accuracy_at(budget)  the accuracy interpolated at ``budget`` seconds of training clock;
                         past the run's end, its final accuracy

Per mode (over its seeds): the median crossing time (+inf when more than half the runs are
censored). The headline is a mode's median over sync's median, with a percentile bootstrap
95% interval (runs resampled with replacement within each mode, ``resamples`` times, a fixed
seed): a resample whose ratio is undefined (both medians censored) counts as +inf, so
censoring widens the interval instead of hiding. Final accuracy and accuracy at each budget:
mean per mode with a bootstrap interval, and the difference to sync with its own interval.

Power: with the spread of log crossing times measured (pooled over modes) and n runs per mode,
the smallest ratio a two-sided test at 5% detects with 80% probability, exp((z_.975 + z_.8)
* s * sqrt(2 / n)), a normal approximation stated as such.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True, slots=True)
class Point:
    samples: int
    clock_s: float
    accuracy: float


def crossing_s(points: Sequence[Point], target: float) -> float | None:
    """Interpolated clock of the first reach of ``target``; None when never (censored)."""
    for i, point in enumerate(points):
        if point.accuracy >= target - 1e-12:
            if i == 0:
                return point.clock_s
            before = points[i - 1]
            share = (target - before.accuracy) / (point.accuracy - before.accuracy)
            return before.clock_s + share * (point.clock_s - before.clock_s)
    return None


def accuracy_at(points: Sequence[Point], budget_s: float) -> float:
    """Accuracy interpolated at ``budget_s`` of training clock; past the run's end, its final
    accuracy (the trained model exists from then on)."""
    for before, after in itertools.pairwise(points):
        if before.clock_s <= budget_s <= after.clock_s:
            span = after.clock_s - before.clock_s
            share = 0.0 if span <= 0 else (budget_s - before.clock_s) / span
            return before.accuracy + share * (after.accuracy - before.accuracy)
    return points[-1].accuracy


def censored_median(times: Sequence[float | None]) -> float:
    """Median with a censored run (None) as +inf."""
    values = sorted(INF if t is None else t for t in times)
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    low, high = values[mid - 1], values[mid]
    return INF if INF in (low, high) else (low + high) / 2


@dataclass(frozen=True, slots=True)
class Interval:
    estimate: float
    low: float
    high: float
    n_resamples: int

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


def bootstrap(
    groups: Sequence[Sequence[float | None]],
    statistic: Callable[..., float],
    *,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> Interval:
    """Percentile interval of ``statistic(*groups)``, each group resampled with replacement
    on its own; NaN results count as +inf (an undefined ratio is not a small one)."""
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        drawn = [[rng.choice(group) for _ in group] for group in groups]
        value = statistic(*drawn)
        values.append(INF if math.isnan(value) else value)
    values.sort()
    tail = (1.0 - level) / 2
    low = values[math.floor(tail * (resamples - 1))]
    high = values[math.ceil((1.0 - tail) * (resamples - 1))]
    return Interval(statistic(*groups), low, high, resamples)


def median_ratio(base: Sequence[float | None], other: Sequence[float | None]) -> float:
    """``other``'s censored median over ``base``'s (NaN when both are censored)."""
    a, b = censored_median(base), censored_median(other)
    if a == INF and b == INF:
        return math.nan
    if a == 0:
        return math.nan if b == 0 else INF
    return b / a


def mean_of(values: Sequence[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if len(present) == len(values) and present else math.nan


def mean_difference(base: Sequence[float | None], other: Sequence[float | None]) -> float:
    return mean_of(other) - mean_of(base)


def min_detectable_ratio(log_times: Sequence[Sequence[float]], n: int) -> float | None:
    """Smallest ratio detected at 5% (two-sided) with 80% power, from the pooled spread of
    log crossing times (module docstring); None without two uncensored runs in a mode."""
    spreads = [statistics.variance(g) for g in log_times if len(g) >= 2]
    if not spreads or n < 1:
        return None
    s = math.sqrt(statistics.fmean(spreads))
    z = statistics.NormalDist().inv_cdf
    return math.exp((z(0.975) + z(0.8)) * s * math.sqrt(2.0 / n))


def steady_samples_per_s(metrics: Sequence[dict[str, float]], skip_steps: int = 2) -> float:
    """Trained samples over step seconds after the first ``skip_steps`` steps (start-up,
    compilation and a filling pipeline excluded); NaN when the run is too short."""
    steps = [m for m in metrics if m.get("step", 0) > skip_steps and "timing/step_s" in m]
    seconds = sum(m["timing/step_s"] for m in steps)
    samples = sum(m.get("throughput/samples", 0.0) for m in steps)
    return samples / seconds if seconds > 0 else math.nan
