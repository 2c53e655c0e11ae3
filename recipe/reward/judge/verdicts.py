"""Reading a judge's verdict from its reply. Pure functions that never raise: a reply they
cannot read gives None, which the judge retries.

Score (pointwise), ``parse_score``:
  1. the number after the last word ``score`` (any case) on the same line, within 30
     characters: ``Score: 7``, ``score = 7.5``, ``**Score:** 8/10`` (8), ``Final score -2``;
  2. else the last number anywhere in the reply;
  3. the number must lie in [score_min, score_max] (else None); it is returned normalised to
     [0, 1]: (n - score_min) / (score_max - score_min).
  Numbers are decimal (``7``, ``-2``, ``7.5``), ASCII digits only.

Winner (pairwise), ``parse_winner``:
  1. the last ``winner`` (any case) followed by ``A``, ``B`` or ``tie``, with colons, ``=``,
     dashes, brackets, markdown ``*``/``_``, ``is`` and a ``Response``/``Assistant`` word
     tolerated between: ``Winner: A``, ``**Winner:** B``, ``The winner is Response B``,
     ``winner = [[a]]``, ``Winner: a tie`` (tie);
  2. else a last non-empty line that is just ``A`` or ``B`` once markdown, brackets and a
     full stop are stripped (``B``, ``**A**``, ``[[B]]``);
  3. else None.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"[-+]?[0-9]+(?:\.[0-9]+)?"
_SCORE = re.compile(rf"\bscore\b[^0-9\n]{{0,30}}?(?P<n>{_NUMBER})", re.IGNORECASE)
_ANY_NUMBER = re.compile(_NUMBER)
_WINNER = re.compile(
    r"\bwinner\b(?:[\s*_:=\-\[(]|\bis\b)*(?:(?:response|assistant)[\s*_:]*)?"
    r"(?:a\s+(?=tie\b))?(?P<w>tie|a|b)\b",
    re.IGNORECASE,
)
_LINE_DECORATION = "*_[]() .`'\"\t"


def parse_score(text: str, score_min: float, score_max: float) -> float | None:
    """The reply's score normalised to [0, 1], or None (module docstring's rules)."""
    matches = list(_SCORE.finditer(text))
    if matches:
        raw = matches[-1].group("n")
    else:
        numbers = _ANY_NUMBER.findall(text)
        if not numbers:
            return None
        raw = numbers[-1]
    value = float(raw)
    if not math.isfinite(value) or not score_min <= value <= score_max:
        return None
    return (value - score_min) / (score_max - score_min)


def parse_winner(text: str) -> str | None:
    """``"A"``, ``"B"`` or ``"tie"`` from the reply, or None (module docstring's rules)."""
    matches = list(_WINNER.finditer(text))
    if matches:
        word = matches[-1].group("w").lower()
        return "tie" if word == "tie" else word.upper()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        last = lines[-1].strip(_LINE_DECORATION).upper()
        if last in ("A", "B"):
            return last
    return None
