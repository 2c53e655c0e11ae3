"""Built-in rule-based scorers, with verl's reward-function signature.

Each scorer is ``fn(data_source, solution_str, ground_truth, extra_info=None) -> float`` and
returns 1.0 for a correct response and 0.0 otherwise; ``solution_str`` is the decoded response
only (no prompt, special tokens already skipped). They are pure functions: the registry
(``recipe.reward.registry``) maps data sources to them.

- ``arithmetic_score``: the synthetic task. The first number in the response must be the
  integer answer ("68" or " 68 " score 1, "6 8" or "68.5" score 0).
- ``calculator_score``: the calculator task (``recipe.data.calculator``). The text after the
  last newline must be the bare integer answer: ``"41"``, or an episode's model turns (joined
  by newlines) ``"12+34\\n46-5\\n41"``, score 1; a call or ``"41 apples"`` score 0. The built-in
  calculator environment rewards its episodes itself; this scores single-turn responses and
  episodes of other agent loops.
- ``math_score``: MATH; the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces allowed;
  verl finds a last ``\\fbox`` but then scores it 0) against the ground truth (the dataset's
  ``answer``, or a whole ``solution`` whose last box is taken), by the MATH benchmark's
  normalisation plus numeric equality: ``recipe.reward.math_normalize`` lists the rules and
  where they deliberately differ from verl's ``math.compute_score``. No box, or a box cut off
  before its closing brace, scores 0.
- ``gsm8k_score``: GSM8K, strict by default as verl's ``gsm8k.compute_score(method="strict")``:
  the number after the last ``####`` in the response, else 0 however right the text is. The
  ground truth is the bare number (verl's preprocessed rows) or the dataset's whole ``answer``
  field, whose last ``#### n`` is taken. Deliberately more lenient than verl on how the number
  is written, never on its value: equal values match (``72.00`` = ``72``; verl compares
  strings); ``$72``, a trailing ``72.`` and any spaces or tabs (or none) after ``####`` are
  accepted. The whole response is searched (some verl versions read only its last 300
  characters).
  ``method="flexible"`` takes the last number of the response instead, as verl's flexible mode.
  ``method="answer"`` takes the response's final answer in whichever form it gives one: the
  last number inside its last ``\\boxed{...}``, else the number after its last ``####``, else
  its last number; as a ``reward.custom_fn``: ``recipe.reward.scorers:gsm8k_answer_score``
  (for models that box their answers, as Qwen2.5's instruct models do, whatever the prompt asks).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from recipe.reward.math_normalize import answers_match, normalize_math_answer

__all__ = [
    "answers_match",
    "arithmetic_score",
    "calculator_score",
    "gsm8k_answer_score",
    "gsm8k_score",
    "last_boxed",
    "math_score",
    "normalize_math_answer",
]

_FIRST_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_BOXED_WORD = re.compile(r"\s+([^\s${}]+)")
# GSM8K's number: optional sign and "$", digits with thousands commas, optional decimals.
_GSM8K_NUMBER = r"[-$]{0,2}\d[\d,]*(?:\.\d+)?"
_GSM8K_ANSWER = re.compile(r"####[ \t]*(" + _GSM8K_NUMBER + ")")
_ANY_NUMBER = re.compile(_GSM8K_NUMBER)
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GSM8K_METHODS = ("strict", "flexible", "answer")


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


def calculator_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    answer = solution_str.rsplit("\n", 1)[-1].strip()
    return float(answer.isdigit() and answer == ground_truth.strip())


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
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    *,
    method: str = "strict",
) -> float:
    """``method``: "strict" (verl's default) or "flexible"; see the module doc."""
    if method not in _GSM8K_METHODS:
        raise ValueError(f"gsm8k_score method={method!r}; expected one of {_GSM8K_METHODS}")
    if method == "strict":
        matches = _GSM8K_ANSWER.findall(solution_str)
    elif method == "flexible":
        matches = _ANY_NUMBER.findall(solution_str)
    elif (boxed := last_boxed(solution_str)) is not None:  # answer, boxed
        matches = _ANY_NUMBER.findall(boxed)
    else:  # answer, unboxed: "####" first, else the last number
        matches = _GSM8K_ANSWER.findall(solution_str) or _ANY_NUMBER.findall(solution_str)
    if not matches:
        return 0.0
    predicted, truth = _clean_gsm8k_number(matches[-1]), _gsm8k_truth(ground_truth)
    pred_value, truth_value = _gsm8k_value(predicted), _gsm8k_value(truth)
    if pred_value is not None and truth_value is not None:
        return float(pred_value == truth_value)
    return float(predicted == truth)


def gsm8k_answer_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """``gsm8k_score(method="answer")`` in the signature ``reward.custom_fn`` calls."""
    return gsm8k_score(data_source, solution_str, ground_truth, extra_info, method="answer")


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


def _gsm8k_truth(ground_truth: str) -> str:
    """The bare answer: ``ground_truth`` itself, or the last ``#### n`` of a whole answer field."""
    if "####" not in ground_truth:
        return _clean_gsm8k_number(ground_truth)
    matches = _GSM8K_ANSWER.findall(ground_truth)
    if not matches:
        raise ValueError(
            f"GSM8K ground truth has '####' but no number after it: {ground_truth[-80:]!r}; "
            "pass the bare number or the dataset's answer field ending in '#### <number>'"
        )
    return _clean_gsm8k_number(matches[-1])


def _clean_gsm8k_number(text: str) -> str:
    return text.strip().replace(",", "").replace("$", "").rstrip(".")


def _gsm8k_value(text: str) -> Fraction | None:
    return Fraction(text) if _PLAIN_NUMBER.fullmatch(text) else None
