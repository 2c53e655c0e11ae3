"""Built-in rule-based scorers, with verl's reward-function signature.

Each scorer is ``fn(data_source, solution_str, ground_truth, extra_info=None) -> float`` and
returns 1.0 for a correct response and 0.0 otherwise; ``solution_str`` is the decoded response
only (no prompt, special tokens already skipped). They are pure functions: the registry
(``recipe.reward.registry``) maps data sources to them.

- ``arithmetic_score``: the synthetic task. The first number in the response must be the
  integer answer ("68" or " 68 " score 1, "6 8" or "68.5" score 0).
- ``math_score``: MATH-style; the last ``\\boxed{...}`` (nested braces allowed) against the
  ground truth after a light LaTeX normalisation, or equal as numbers. Deliberately light: no
  symbolic equivalence (``\\frac{2}{4}`` equals ``0.5``, but ``x+1`` does not equal ``1+x``).
- ``gsm8k_score``: strict GSM8K; the last ``#### <number>`` (commas and ``$`` removed).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_FIRST_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOXED_WORD = re.compile(r"\s+([^\s${}]+)")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_LATEX_SPACES = re.compile(r"\\[!,;:]")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC_SHORTHAND = re.compile(r"\\frac(\d)(\d)")
_FRAC = re.compile(r"(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}")
_GSM8K_ANSWER = re.compile(r"####\s*([-$0-9.,]+)")


def arithmetic_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    match = _FIRST_NUMBER.search(solution_str.strip())
    if match is None or "." in match.group():
        return 0.0
    try:
        return float(int(match.group()) == int(ground_truth.strip()))
    except ValueError:
        return float(match.group() == ground_truth.strip())


def math_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    predicted = last_boxed(solution_str)
    if predicted is None:
        return 0.0
    # Some datasets store the whole reference solution; its boxed answer is the ground truth.
    truth = last_boxed(ground_truth)
    return float(answers_match(predicted, ground_truth if truth is None else truth))


def gsm8k_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    matches = _GSM8K_ANSWER.findall(solution_str)
    if not matches:
        return 0.0
    predicted = _clean_gsm8k_number(matches[-1])
    truth = _clean_gsm8k_number(ground_truth)
    if not predicted:
        return 0.0
    pred_value, truth_value = _to_number(predicted), _to_number(truth)
    if pred_value is not None and truth_value is not None:
        return float(pred_value == truth_value)
    return float(predicted == truth)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed 5``), else None."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(command) :]
    if not rest.lstrip().startswith("{"):
        # "\boxed 5": the argument runs to the next space or math delimiter.
        word = _BOXED_WORD.match(rest)
        return word.group(1) if word else None
    rest = rest.lstrip()
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced: the response was cut off inside the box


def normalize_math_answer(answer: str) -> str:
    """Light LaTeX normalisation: spacing, ``\\left``/``\\right``, ``\\dfrac``, ``\\frac12``."""
    answer = _LEFT_RIGHT.sub("", answer)
    answer = _LATEX_SPACES.sub("", answer)
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = _FRAC_SHORTHAND.sub(r"\\frac{\1}{\2}", answer)
    answer = "".join(answer.split())
    return answer.strip("$").rstrip(".")


def answers_match(predicted: str, truth: str) -> bool:
    predicted, truth = normalize_math_answer(predicted), normalize_math_answer(truth)
    if not predicted:
        return False
    if predicted == truth:
        return True
    pred_value, truth_value = _to_number(predicted), _to_number(truth)
    return pred_value is not None and pred_value == truth_value


def _to_number(text: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}``; None otherwise."""
    frac = _FRAC.fullmatch(text)
    if frac is not None:
        numerator, denominator = _to_number(frac.group(2)), _to_number(frac.group(3))
        if numerator is None or not denominator:
            return None
        value = numerator / denominator
        return -value if frac.group(1) else value
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _clean_gsm8k_number(text: str) -> str:
    return text.strip().replace(",", "").replace("$", "").rstrip(".")
