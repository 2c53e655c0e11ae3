"""How often an LLM judge agrees with a rule scorer: pure statistics over judged responses, so
they are tested without an engine (``python -m recipe.tools.study.judge_agreement`` runs them).

    JudgedResponse (rule reward, judge score | judge error), one per sampled response
      --labels--> rule: correct when reward > 0.5; judge: passes when score >= threshold
      --summarize--> n, agreement (95% Wilson interval), Cohen's kappa and the AUC (95%
                     bootstrap intervals), confusion matrix, the judge's mean score on
                     rule-correct and rule-wrong responses, the responses the judge could
                     not score

The rule's label. The built-in scorers give 0 or 1, where ``reward > 0.5`` is exactly
``reward >= 1.0``. A fractional rule (reasoning-gym's partial credit) or a shaped reward (an
overlong penalty subtracted from a right answer's 1) counts as correct past half credit:
the label asks "did the rule say right", not "did it give full marks".

A response the judge could not score (its ``JudgeError``) has no judge label: it is left out
of every figure but ``num_errors`` and ``errors``, which count and name it; it is never a
judge score of 0.

AUC needs no threshold: the chance that a rule-correct response gets a higher judge score than
a rule-wrong one, a tie counting half (the Mann-Whitney statistic over n_correct * n_wrong
pairs); 0.5 is a judge that cannot tell them apart, whatever its threshold or the share it
passes. Its 95% interval is a percentile bootstrap over the responses, resamples without
both classes counted and left out.

Kappa is undefined when both labelings put every response in one class (chance agreement
is 1): the point estimate is None then, and bootstrap resamples where it is undefined are
counted and left out of the interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RULE_CORRECT_ABOVE = 0.5
"""A rule reward above this is a correct response (module docstring)."""
Z_95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95% interval."""
BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the kappa interval."""


@dataclass(frozen=True, slots=True)
class JudgedResponse:
    """One sampled response with its rule reward and the judge's verdict on it (a row of
    ``judged.jsonl``)."""

    uid: str
    """The prompt's uid."""
    sample_index: int
    """The response's index within its group."""
    rule_reward: float
    """The run's rule reward of the response."""
    score: float | None
    """The judge's pointwise score in [0, 1]; None when it could not score it."""
    error: str | None = None
    """The judge's error when it could not score the response (``score`` is None)."""

    @property
    def rule_correct(self) -> bool:
        return self.rule_reward > RULE_CORRECT_ABOVE


@dataclass(frozen=True, slots=True)
class Confusion:
    """Counts of (rule label, judge label) over the scored responses."""

    both_correct: int
    """The rule says correct, the judge passes it."""
    rule_only: int
    """The rule says correct, the judge fails it."""
    judge_only: int
    """The rule says wrong, the judge passes it."""
    both_wrong: int
    """The rule says wrong, the judge fails it."""

    @property
    def n(self) -> int:
        return self.both_correct + self.rule_only + self.judge_only + self.both_wrong

    @property
    def agreements(self) -> int:
        return self.both_correct + self.both_wrong

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "rule_correct": {"judge_pass": self.both_correct, "judge_fail": self.rule_only},
            "rule_wrong": {"judge_pass": self.judge_only, "judge_fail": self.both_wrong},
        }


def confusion(rule: Sequence[bool], judge: Sequence[bool]) -> Confusion:
    """The confusion matrix of paired labels."""
    pairs = list(zip(rule, judge, strict=True))
    return Confusion(
        both_correct=sum(r and j for r, j in pairs),
        rule_only=sum(r and not j for r, j in pairs),
        judge_only=sum(j and not r for r, j in pairs),
        both_wrong=sum(not r and not j for r, j in pairs),
    )


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n`` (``n`` >= 1)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval({successes}, {n}): expected 0 <= successes <= n, n >= 1")
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # The bounds at 0 and n are exactly 0 and 1 (rounding would leave 1 - 1e-16).
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def cohens_kappa(table: Confusion) -> float | None:
    """Cohen's kappa of a 2x2 table: (observed - chance agreement) / (1 - chance); None
    when chance agreement is 1 (both labelings constant and equal) or the table is empty."""
    n = table.n
    if n == 0:
        return None
    rule_yes = table.both_correct + table.rule_only
    judge_yes = table.both_correct + table.judge_only
    chance = (rule_yes * judge_yes + (n - rule_yes) * (n - judge_yes)) / (n * n)
    if chance >= 1.0:
        return None
    return (table.agreements / n - chance) / (1 - chance)


def bootstrap_kappa(
    rule: Sequence[bool], judge: Sequence[bool], *, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float | None, float | None, int]:
    """The 95% percentile interval of kappa over ``resamples`` resamples of the pairs (with
    replacement, ``seed``-ed); (low, high, resamples where kappa is undefined). (None, None,
    k) when fewer than two resamples give a kappa."""
    r = np.asarray(rule, dtype=bool)
    j = np.asarray(judge, dtype=bool)
    n = len(r)
    if n == 0:
        return None, None, resamples
    index = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    rr, jj = r[index], j[index]  # (resamples, n)
    observed = (rr == jj).mean(axis=1)
    rule_yes, judge_yes = rr.mean(axis=1), jj.mean(axis=1)
    chance = rule_yes * judge_yes + (1 - rule_yes) * (1 - judge_yes)
    defined = chance < 1.0 - 1e-12
    kappas = (observed[defined] - chance[defined]) / (1 - chance[defined])
    undefined = int(resamples - defined.sum())
    if len(kappas) < 2:
        return None, None, undefined
    low, high = float(np.percentile(kappas, 2.5)), float(np.percentile(kappas, 97.5))
    return low, high, undefined


def auc(right: Sequence[float], wrong: Sequence[float]) -> float | None:
    """P(a ``right`` score > a ``wrong`` one) + half P(equal) over all pairs; None when either
    is empty."""
    if not len(right) or not len(wrong):
        return None
    ordered = np.sort(np.asarray(right, dtype=float))
    w = np.asarray(wrong, dtype=float)
    above = len(ordered) - np.searchsorted(ordered, w, side="right")
    equal = np.searchsorted(ordered, w, side="right") - np.searchsorted(ordered, w, side="left")
    return float((above + 0.5 * equal).sum() / (len(ordered) * len(w)))


def bootstrap_auc(
    correct: Sequence[bool],
    scores: Sequence[float],
    *,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> tuple[float | None, float | None, int]:
    """The 95% percentile interval of ``auc`` over ``resamples`` resamples of the responses
    (with replacement, ``seed``-ed); (low, high, resamples without both classes). (None, None,
    k) when fewer than two resamples give an AUC."""
    c = np.asarray(correct, dtype=bool)
    s = np.asarray(scores, dtype=float)
    if len(c) == 0:
        return None, None, resamples
    index = np.random.default_rng(seed).integers(0, len(c), size=(resamples, len(c)))
    values = [auc(s[i][c[i]], s[i][~c[i]]) for i in index]
    defined = [v for v in values if v is not None]
    undefined = resamples - len(defined)
    if len(defined) < 2:
        return None, None, undefined
    return float(np.percentile(defined, 2.5)), float(np.percentile(defined, 97.5)), undefined


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    judged: Sequence[JudgedResponse],
    threshold: float,
    *,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict[str, Any]:
    """The agreement figures of ``judged`` (module docstring) as a JSON-ready dict."""
    scored = [r for r in judged if r.score is not None]
    failed = [r for r in judged if r.score is None]
    rule = [r.rule_correct for r in scored]
    judge = [r.score is not None and r.score >= threshold for r in scored]
    table = confusion(rule, judge)
    right = [r.score for r in scored if r.rule_correct and r.score is not None]
    wrong = [r.score for r in scored if not r.rule_correct and r.score is not None]
    mean_right, mean_wrong = _mean(right), _mean(wrong)
    low, high, undefined = bootstrap_kappa(rule, judge, seed=seed, resamples=resamples)
    auc_low, auc_high, auc_undefined = bootstrap_auc(
        rule, [r.score for r in scored if r.score is not None], seed=seed, resamples=resamples
    )
    return {
        "num_sampled": len(judged),
        "n": table.n,
        "num_errors": len(failed),
        "rule_label": f"reward > {RULE_CORRECT_ABOVE}",
        "judge_label": f"score >= {threshold}",
        "rule_correct_share": _mean([float(x) for x in rule]),
        "agreement": table.agreements / table.n if table.n else None,
        "agreement_ci95": list(wilson_interval(table.agreements, table.n)) if table.n else None,
        "kappa": cohens_kappa(table),
        "kappa_ci95": None if low is None else [low, high],
        "kappa_bootstrap": {"resamples": resamples, "seed": seed, "undefined": undefined},
        "auc": auc(right, wrong),
        "auc_ci95": None if auc_low is None else [auc_low, auc_high],
        "auc_bootstrap": {"resamples": resamples, "seed": seed, "undefined": auc_undefined},
        "confusion": table.as_dict(),
        "judge_mean_score_rule_correct": mean_right,
        "judge_mean_score_rule_wrong": mean_wrong,
        "judge_mean_score_gap": (
            None if mean_right is None or mean_wrong is None else mean_right - mean_wrong
        ),
        "errors": [
            {"uid": r.uid, "sample_index": r.sample_index, "error": r.error} for r in failed
        ],
    }


def format_table(summary: dict[str, Any]) -> str:
    """The short printed table of ``summarize``'s figures (and of the judge's ``judge/*``
    metrics under ``judge_metrics``, when the summary holds them)."""

    def num(value: float | None, spec: str = ".3f") -> str:
        return "-" if value is None else format(value, spec)

    def interval(bounds: list[float] | None) -> str:
        return "" if bounds is None else f"  [{bounds[0]:.3f}, {bounds[1]:.3f}]"

    c = summary["confusion"]
    lines = [
        f"judged {summary['n']} of {summary['num_sampled']} ({summary['num_errors']} errors); "
        f"rule: {summary['rule_label']}, judge: {summary['judge_label']}",
        f"agreement  {num(summary['agreement'])}{interval(summary['agreement_ci95'])}",
        f"kappa      {num(summary['kappa'])}{interval(summary['kappa_ci95'])}",
        f"AUC        {num(summary.get('auc'))}{interval(summary.get('auc_ci95'))}",
        f"{'':14}{'judge pass':>12}{'judge fail':>12}",
    ]
    for label in ("rule_correct", "rule_wrong"):
        row = c[label]
        lines.append(f"{label.replace('_', ' '):14}{row['judge_pass']:>12}{row['judge_fail']:>12}")
    lines.append(
        f"judge mean score: rule correct {num(summary['judge_mean_score_rule_correct'])}, "
        f"rule wrong {num(summary['judge_mean_score_rule_wrong'])}, "
        f"gap {num(summary['judge_mean_score_gap'], '+.3f')}"
    )
    metrics = summary.get("judge_metrics") or {}
    if metrics:
        lines.append(
            f"judge calls {metrics['judge/calls']:.0f}: parse failures "
            f"{metrics['judge/parse_failures']:.0f}, retries {metrics['judge/retries']:.0f}, "
            f"failures {metrics['judge/failures']:.0f}, latency p50 "
            f"{metrics['judge/latency_p50_s']:.3f} s, p99 {metrics['judge/latency_p99_s']:.3f} s"
        )
    return "\n".join(lines)
