"""MATH answer normalisation and comparison, as the MATH benchmark grades, plus numeric equality.

The MATH benchmark (Hendrycks et al.) counts an answer as right when it equals the reference
after a string normalisation (``strip_string`` / ``is_equiv``); verl's MATH scorer uses the same
rule. This module implements that normalisation in its own code:

    raw answer --> spacing, \\left/\\right, dfrac/tfrac, degrees, $, trailing unit, \\text{..}, %
               --> "x =" prefix, thousands commas of a lone number, spaces, trailing "."
               --> \\sqrt2, \\frac12, \\frac1{72}, a/b, .5 written in full
               --> equal as strings, as choice letters, as exact numbers, or as tuples

Deliberate differences from the benchmark's rule (and so from verl); all but the last accept a
correct answer that the string rule scores 0:

- numeric equality: ``10`` = ``10.0``, ``\\frac{2}{4}`` = ``0.5``, ``1,000`` = ``1000`` (the
  benchmark equates only the literal ``0.5`` with ``\\frac{1}{2}``); a comma followed by a space
  separates a list, so ``10, 100`` is not ``10100``;
- ``\\text``, ``\\textbf``, ``\\mbox``, ``\\mathrm`` groups unwrapped (``\\text{(B)}`` = ``(B)``);
  a trailing unit is dropped with or without the space (``12 \\text{inches}``);
- plain ``$`` and ``%``, ``\\,`` ``\\;`` ``\\quad`` spacing, ``\\displaystyle`` and a trailing
  ``.`` removed (the benchmark removes ``\\$``, ``\\%``, ``\\!`` and spaces only);
- a multiple-choice letter equals its parenthesised form: ``B`` = ``(B)`` = ``\\text{(B)}``;
- tuples and intervals compare element-wise with these rules: ``(0.5, 2)`` = ``(\\frac12, 2)``;
- only a *trailing* ``\\text{ unit}`` is dropped: the benchmark cuts everything after the first
  ``\\text{ ``, so it scores ``3 \\text{ and } 4`` right against ``3``; we score it 0.

Still no symbolic equivalence: ``x+1`` is not ``1+x`` and ``2\\sqrt{2}`` is not ``\\sqrt{8}``.
"""

from __future__ import annotations

import re
from fractions import Fraction

_ESCAPED_COMMAND = re.compile(r"\\\\(?=[A-Za-z%$])")  # "\\frac" from double-escaped JSON
# Not after a backslash: "\\ " is a matrix row break, not a space.
_SPACING = re.compile(r"(?<!\\)\\(?:[!,;:> ]|q?quad(?![A-Za-z]))|~")
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg|displaystyle)(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])")
_TEXT_COMMANDS = r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm)"
# A unit is a trailing text group of words after a value: "5\text{ cm}", "3 \mbox{inches}^2".
_TRAILING_UNIT = re.compile(
    r"(?P<value>\S.*?)\s*\\(?:text|textrm|textnormal|mbox)\s*\{\s*[A-Za-z][A-Za-z\s.]*\}"
    r"\s*(?:\^\s*\{?\s*[23]\s*\}?)?\s*$",
    re.DOTALL,
)
_TEXT_WRAPPER = re.compile(_TEXT_COMMANDS + r"\s*\{([^{}]*)\}")
_LEADING_VARIABLE = re.compile(r"[A-Za-z][A-Za-z0-9]?\s*=\s*")
_SQRT_SHORTHAND = re.compile(r"\\sqrt([^{\\\[])")
_FRAC_TWO_TOKENS = re.compile(r"\\frac([^{\\])([^{\\])")
_FRAC_FIRST_TOKEN = re.compile(r"\\frac([^{\\])(?=\{)")
_FRAC_SECOND_TOKEN = re.compile(r"\\frac(\{[^{}]*\})([^{\\])")
_INTEGER_RATIO = re.compile(r"(-?\d+)/(\d+)")
_BARE_DECIMAL = re.compile(r"(?<![\w}.])\.(?=\d)")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"([-+]?)\\frac\{([^{}]+)\}\{([^{}]+)\}")
_CHOICE = re.compile(r"\(([A-E])\)|([A-E])")
_BRACKETS = {"(": ")", "[": "]"}


def normalize_math_answer(answer: str) -> str:
    """The answer in the canonical form compared by ``answers_match`` (see the module doc)."""
    return _normalize(answer, lone_thousands=True)


def answers_match(predicted: str, truth: str) -> bool:
    """Whether ``predicted`` is the ``truth`` answer by the MATH rules of the module doc."""
    pred_form, truth_form = normalize_math_answer(predicted), normalize_math_answer(truth)
    if not pred_form:
        return False
    if _equivalent(pred_form, truth_form):
        return True
    # The benchmark keeps every comma: there "10,100" is the list "10, 100", not 10100.
    return _normalize(predicted, lone_thousands=False) == _normalize(truth, lone_thousands=False)


def _normalize(answer: str, *, lone_thousands: bool) -> str:
    """``normalize_math_answer``; ``lone_thousands`` drops the commas of a lone ``1,000``."""
    answer = _ESCAPED_COMMAND.sub(r"\\", answer)
    answer = _SPACING.sub(" ", answer)
    answer = _SIZING.sub("", answer)
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = _DEGREES.sub("", answer)
    answer = answer.replace("\\$", "").replace("$", "")
    answer = _strip_text(answer)
    answer = answer.replace("\\%", "").replace("%", "").replace("{,}", ",").strip()
    variable = _LEADING_VARIABLE.match(answer)
    if variable is not None and answer.count("=") == 1:
        answer = answer[variable.end() :]
    # Told apart before the spaces go: "1,000" is a number, "10, 100" a list of two.
    if lone_thousands and _THOUSANDS.fullmatch(answer.rstrip(".")):
        answer = answer.replace(",", "")
    answer = "".join(answer.split()).rstrip(".").replace("\\\\", "\\")
    return _fix_shorthands(answer)


def _strip_text(answer: str) -> str:
    """Drop a trailing unit, then unwrap the remaining text groups (innermost first)."""
    unit = _TRAILING_UNIT.fullmatch(answer.strip().rstrip("."))
    if unit is not None:
        answer = unit.group("value")
    while True:
        unwrapped = _TEXT_WRAPPER.sub(r"\1", answer)
        if unwrapped == answer:
            return answer
        answer = unwrapped


def _fix_shorthands(answer: str) -> str:
    """Brace-less LaTeX arguments and plain-text numbers in the forms the reference uses."""
    answer = _SQRT_SHORTHAND.sub(r"\\sqrt{\1}", answer)
    answer = _FRAC_TWO_TOKENS.sub(r"\\frac{\1}{\2}", answer)
    answer = _FRAC_FIRST_TOKEN.sub(r"\\frac{\1}", answer)
    answer = _FRAC_SECOND_TOKEN.sub(r"\\frac\1{\2}", answer)
    answer = _BARE_DECIMAL.sub("0.", answer)
    ratio = _INTEGER_RATIO.fullmatch(answer)
    if ratio is not None:
        answer = f"\\frac{{{ratio.group(1)}}}{{{ratio.group(2)}}}"
    return answer


def _equivalent(predicted: str, truth: str) -> bool:
    """Equality of two normalised answers: as strings, choices, numbers, or tuples."""
    if predicted == truth:
        return True
    pred_choice, truth_choice = _CHOICE.fullmatch(predicted), _CHOICE.fullmatch(truth)
    if pred_choice is not None and truth_choice is not None:
        return _choice_letter(pred_choice) == _choice_letter(truth_choice)
    pred_value, truth_value = _to_number(predicted), _to_number(truth)
    if pred_value is not None or truth_value is not None:
        return pred_value == truth_value
    return _tuples_match(predicted, truth)


def _choice_letter(match: re.Match[str]) -> str:
    return match.group(1) or match.group(2)


def _to_number(text: str) -> Fraction | None:
    """Exact value of an integer, decimal, ``a/b`` or ``\\frac{a}{b}``; else None."""
    frac = _FRAC.fullmatch(text)
    if frac is not None:
        numerator, denominator = _to_number(frac.group(2)), _to_number(frac.group(3))
        if numerator is None or not denominator:
            return None
        value = numerator / denominator
        return -value if frac.group(1) == "-" else value
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except ZeroDivisionError:
        return None


def _tuples_match(predicted: str, truth: str) -> bool:
    """``(a, b]``-style answers: same brackets, same length, every element equivalent."""
    if len(predicted) < 2 or len(truth) < 2:
        return False
    if predicted[0] != truth[0] or predicted[-1] != truth[-1]:
        return False
    if predicted[0] not in _BRACKETS or predicted[-1] not in _BRACKETS.values():
        return False
    pred_items, truth_items = _split_top_level(predicted[1:-1]), _split_top_level(truth[1:-1])
    if len(pred_items) < 2 or len(pred_items) != len(truth_items):
        return False
    return all(_equivalent(p, t) for p, t in zip(pred_items, truth_items, strict=True))


def _split_top_level(text: str) -> list[str]:
    """``text`` split at commas outside braces and brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items
