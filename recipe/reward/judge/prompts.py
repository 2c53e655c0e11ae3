"""The judge's prompts: the built-in templates of each mode and their rendering.

A template is ``str.format`` text. Its placeholders are ``{prompt}``, ``{ground_truth}``,
``{score_min}``, ``{score_max}`` and the mode's responses: ``{response}`` (pointwise) or
``{response_a}`` and ``{response_b}`` (pairwise); a literal brace is written ``{{`` or ``}}``.
Rendering formats the template once with the values as they are, so a response that holds
braces (code, JSON, a forged ``{ground_truth}``) is shown verbatim and never expanded.

The verdict each built-in template asks for is what ``recipe.reward.judge.verdicts`` parses:
a last line ``Score: N`` (pointwise) or ``Winner: A`` / ``Winner: B`` (pairwise).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from recipe.protocol import ChatMessages

MODES = ("pointwise", "pairwise")
COMMON_PLACEHOLDERS = ("prompt", "ground_truth", "score_min", "score_max")
RESPONSE_PLACEHOLDERS = {"pointwise": ("response",), "pairwise": ("response_a", "response_b")}
"""The placeholders each mode's template must hold (and may, beside the common ones)."""

POINTWISE_TEMPLATE = """\
You are a strict grader. Judge the response to the task below against the reference answer.

[Task]
{prompt}

[Reference answer]
{ground_truth}

[Response]
{response}

Grade the response's correctness first: a final answer that disagrees with the reference \
answer scores at most {score_min}, whatever else it does well. Among correct responses, \
reward clear and complete reasoning; penalise errors, padding and unsupported claims.

Explain your judgement in a few sentences, then end with one line of the form
Score: N
where N is a number from {score_min} (worst) to {score_max} (best)."""

PAIRWISE_TEMPLATE = """\
You are a strict grader. Compare two responses to the task below, using the reference answer.

[Task]
{prompt}

[Reference answer]
{ground_truth}

[Response A]
{response_a}

[Response B]
{response_b}

Prefer the response whose final answer agrees with the reference answer; if both or neither \
do, prefer the clearer, more complete and more correct reasoning. The order in which the \
responses are shown and their lengths must not influence you.

Explain your judgement in a few sentences, then end with one line of the form
Winner: A
or
Winner: B"""


POINTWISE_CORRECTION = """\
I cannot read a score in your reply. End your reply with one line of the form
Score: N
where N is a single number from {score_min} to {score_max}. Reply with that one line only."""

PAIRWISE_CORRECTION = """\
I cannot read a verdict in your reply. End your reply with one line that is either
Winner: A
or
Winner: B
Reply with that one line only."""


MAX_CHOICES = 101
"""The most verdicts a constrained correction chooses among (a 0-100 rubric's)."""


@dataclass(frozen=True, slots=True)
class Correction:
    """The follow-up turn after a reply whose verdict ``verdicts`` cannot read."""

    text: str
    """What the judge is told: the form the mode's verdict takes (and a score's scale)."""
    choices: tuple[str, ...] | None
    """The verdicts its reply is constrained to where the backend constrains decoding: the
    pairwise winners, or every whole score of a rubric with whole bounds at most
    ``MAX_CHOICES`` apart; None otherwise (a fractional scale is told, not constrained)."""


def correction(mode: str, score_min: float, score_max: float) -> Correction:
    """The follow-up turn of ``mode`` (``Correction``). Told alone, a small judge that wrote
    ``Score: 97`` of 10 mostly writes it again; constrained, its reply is a verdict."""
    if mode == "pairwise":
        return Correction(PAIRWISE_CORRECTION, ("Winner: A", "Winner: B"))
    text = POINTWISE_CORRECTION.format(
        score_min=format_number(score_min), score_max=format_number(score_max)
    )
    whole = float(score_min).is_integer() and float(score_max).is_integer()
    if not whole or score_max - score_min >= MAX_CHOICES:
        return Correction(text, None)
    scores = range(int(score_min), int(score_max) + 1)
    return Correction(text, tuple(f"Score: {n}" for n in scores))


def builtin_template(mode: str) -> str:
    """The built-in template of ``mode`` (``pointwise`` or ``pairwise``)."""
    return POINTWISE_TEMPLATE if mode == "pointwise" else PAIRWISE_TEMPLATE


def template_problem(text: str, mode: str) -> str | None:
    """What is wrong with template ``text`` for ``mode``, worded to follow "allowed"; None
    when it is fine."""
    needed = RESPONSE_PLACEHOLDERS[mode]
    allowed = (*COMMON_PLACEHOLDERS, *needed)
    allowed_text = "placeholders " + ", ".join("{" + name + "}" for name in allowed)
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as err:
        return f"str.format text ({err}; write a literal brace as {{{{ or }}}})"
    names = set()
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in allowed or spec or conversion:
            shown = (
                "{"
                + name
                + ("!" + conversion if conversion else "")
                + (":" + spec if spec else "")
                + "}"
            )
            return f"{allowed_text} only, each bare; it has {shown}"
        names.add(name)
    missing = [name for name in needed if name not in names]
    if missing:
        return f"a {mode} template with " + " and ".join("{" + n + "}" for n in missing)
    return None


def render_prompt(prompt: str | ChatMessages) -> str:
    """A record's prompt as text: a string as it is, chat messages as ``role: content``
    lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)


def render_pointwise(
    template: str,
    prompt: str | ChatMessages,
    response: str,
    ground_truth: str,
    score_min: float,
    score_max: float,
) -> str:
    """The judge's request for one response."""
    return _render(template, prompt, ground_truth, score_min, score_max, response=response)


def render_pairwise(
    template: str,
    prompt: str | ChatMessages,
    response_a: str,
    response_b: str,
    ground_truth: str,
    score_min: float,
    score_max: float,
) -> str:
    """The judge's request for one pair, ``response_a`` shown first."""
    return _render(
        template,
        prompt,
        ground_truth,
        score_min,
        score_max,
        response_a=response_a,
        response_b=response_b,
    )


def _render(
    template: str,
    prompt: str | ChatMessages,
    ground_truth: str,
    score_min: float,
    score_max: float,
    **responses: str,
) -> str:
    """``template`` with every placeholder filled once (a value's braces stay as written)."""
    return template.format_map(
        {
            "prompt": render_prompt(prompt),
            "ground_truth": ground_truth,
            "score_min": format_number(score_min),
            "score_max": format_number(score_max),
            **responses,
        }
    )


def format_number(value: float) -> str:
    """``10.0`` as ``10``, ``2.5`` as ``2.5``: how a rubric writes its bounds."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
