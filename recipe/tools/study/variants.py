"""``python -m recipe.tools.study.variants BASE OTHER [out=FILE]``: two variants of one task
(full fine-tuning against LoRA, say), each a ``modes`` study's records, compared per mode at
equal trained samples.

BASE and OTHER are records folders of ``python -m recipe.tools.study.modes`` (``results.json``
and ``<mode>-seed<S>.json``). First the overrides that differ between them (what the
comparison varies; where the data files lie is left out), then one row per mode both hold:
each side's seeds and final accuracy, OTHER - BASE with a 95% interval, samples/s of each and
their ratio. The interval of the difference of means:

    one seed on a side   the evaluations' binomial noise only, sum of p(1-p)/m over a side's
                         runs / n^2 (m validation prompts), 1.96 standard errors
    seeds on both sides  t(0.975, Welch df) standard errors from the spread between seeds,
                         never narrower than the evaluations' own noise (1.96 standard
                         errors), which two seeds can understate by chance

``within`` when the interval holds 0. Runs that trained other numbers of samples are refused:
the comparison is at equal samples. ``out=FILE`` writes the table as JSON too. Bad input: one
``error:`` line, exit code 2.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.tools.cli import fail, parse_pairs
from recipe.tools.study.accuracy import RunRecord
from recipe.tools.study.modes import MODES, settings

# Two-sided 95% quantiles of Student's t by degrees of freedom (1-30); 1.96 beyond.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
Z_975 = 1.96


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    seeds: tuple[int, int]
    accuracy: tuple[float, float]
    difference: float
    interval: tuple[float, float]
    interval_from: str
    """``evaluation`` (binomial noise only) or ``seeds`` (the spread between seeds)."""
    samples_per_s: tuple[float, float]

    @property
    def within(self) -> bool:
        return self.interval[0] <= 0.0 <= self.interval[1]


def t_975(df: float) -> float:
    """Student's t two-sided 95% quantile at ``df`` degrees of freedom (rounded down)."""
    index = max(1, math.floor(df))
    return T_975[index - 1] if index <= len(T_975) else Z_975


def eval_variance(runs: list[RunRecord]) -> float:
    """Variance of the runs' mean final accuracy from their evaluations' binomial noise."""
    noise = (r.final_accuracy * (1 - r.final_accuracy) / max(r.val_prompts, 1) for r in runs)
    return sum(noise) / len(runs) ** 2


def compare(mode: str, base: list[RunRecord], other: list[RunRecord]) -> Row:
    """One mode's row: OTHER - BASE in final accuracy (module docstring)."""
    finals = [[r.final_accuracy for r in runs] for runs in (base, other)]
    difference = statistics.fmean(finals[1]) - statistics.fmean(finals[0])
    eval_half = Z_975 * math.sqrt(eval_variance(base) + eval_variance(other))
    half, source = eval_half, "evaluation"
    if min(len(base), len(other)) >= 2:
        seed_half = t_975(welch_df(finals)) * math.sqrt(sum(var_of_mean(f) for f in finals))
        if seed_half > eval_half:
            half, source = seed_half, "seeds"
    speeds = [statistics.fmean(r.samples_per_s for r in runs) for runs in (base, other)]
    return Row(
        mode=mode,
        seeds=(len(base), len(other)),
        accuracy=(statistics.fmean(finals[0]), statistics.fmean(finals[1])),
        difference=difference,
        interval=(difference - half, difference + half),
        interval_from=source,
        samples_per_s=(speeds[0], speeds[1]),
    )


def var_of_mean(values: list[float]) -> float:
    return statistics.variance(values) / len(values)


def welch_df(groups: list[list[float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a difference of two means (1 when both
    groups have no spread)."""
    parts = [var_of_mean(g) for g in groups]
    denominator = sum(p**2 / (len(g) - 1) for p, g in zip(parts, groups, strict=True))
    return sum(parts) ** 2 / denominator if denominator else 1.0


def load(records: Path) -> tuple[dict[str, str], dict[str, list[RunRecord]]]:
    """(the study's settings, its runs by mode); exit 2 when ``records`` is not a study's."""
    results = records / "results.json"
    if not results.is_file():
        fail(f"{records}: no results.json (a records folder of python -m recipe.tools.study.modes)")
    by_mode: dict[str, list[RunRecord]] = {}
    for path in sorted(records.glob("*-seed*.json")):
        mode = path.name.rpartition("-seed")[0]
        if mode in MODES:
            run = RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
            by_mode.setdefault(mode, []).append(run)
    overrides = json.loads(results.read_text(encoding="utf-8")).get("overrides", [])
    return settings(overrides), by_mode


def main(argv: list[str]) -> int:
    positional, pairs = parse_pairs(argv, __doc__, num_positional=2)
    if len(positional) < 2:
        fail("expected BASE OTHER: two records folders of python -m recipe.tools.study.modes")
    options = dict(pairs)
    if unknown := sorted(set(options) - {"out"}):
        fail(f"unknown keys {unknown}; known: out")
    (base_settings, base), (other_settings, other) = (load(Path(p)) for p in positional)
    modes = [m for m in MODES if m in base and m in other]
    if not modes:
        fail(f"no mode has runs in both {positional[0]} and {positional[1]}")
    for mode in modes:
        samples = {r.samples for r in base[mode] + other[mode]}
        if len(samples) > 1:
            fail(f"{mode}: the runs trained {sorted(samples)} samples; compare at equal samples")
    keys = sorted(base_settings.keys() | other_settings.keys())
    varied = {k: (base_settings.get(k), other_settings.get(k)) for k in keys
              if base_settings.get(k) != other_settings.get(k)}  # fmt: skip
    rows = [compare(m, base[m], other[m]) for m in modes]
    print_table(positional, varied, rows)
    if "out" in options:
        table = {"base": positional[0], "other": positional[1], "varied": varied,
                 "rows": [rounded(asdict(r) | {"within": r.within}) for r in rows]}  # fmt: skip
        Path(options["out"]).write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    return 0


def rounded(value: Any) -> Any:
    """``value`` with every float in it rounded to 4 decimals (for the JSON table)."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def print_table(names: list[str], varied: dict[str, tuple], rows: list[Row]) -> None:
    print(f"base {names[0]}, other {names[1]}")
    for key, (was, now) in varied.items():
        print(f"  {key}: {was or '(unset)'} -> {now or '(unset)'}")
    print(f"{'mode':12s} {'seeds':>5s} {'base acc':>8s} {'other':>6s} {'other-base [95%]':>25s} "
          f"{'from':>10s} {'samples/s':>13s} {'ratio':>6s}")  # fmt: skip
    for r in rows:
        diff = f"{r.difference:+.3f} [{r.interval[0]:+.3f}, {r.interval[1]:+.3f}]"
        verdict = "within" if r.within else ("higher" if r.difference > 0 else "lower")
        speed = f"{r.samples_per_s[0]:.1f} / {r.samples_per_s[1]:.1f}"
        print(f"{r.mode:12s} {r.seeds[0]:>2d}/{r.seeds[1]:<2d} {r.accuracy[0]:8.3f} "
              f"{r.accuracy[1]:6.3f} {diff:>25s} {r.interval_from:>10s} {speed:>13s} "
              f"{r.samples_per_s[1] / r.samples_per_s[0]:6.2f}  {verdict}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
