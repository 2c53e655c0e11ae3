"""The calculator task: multi-step arithmetic answered with a one-operation calculator tool.

A problem chains ``data.num_operands`` operands with ``+`` and ``-``, e.g. ``"12+34-5="``
(answer ``41``); every running value stays non-negative. An episode, token for token::

    12+34-5=   12+34<eos>   =46\\n   46-5<eos>   =41\\n   41<eos>
    prompt     model: call  tool     model: call  tool    model: answer

A model turn is either a call, one operation ``A+B`` or ``A-B`` on non-negative integers,
answered by the tool with ``=VALUE`` and a newline, or a bare integer, the final answer.
Anything else gets ``=error`` back (a tool error). ``calculator_step`` is that tool, shared
by the built-in environment (``recipe.agent.builtin.Calculator``), the warm start that
teaches the tiny model the format (``recipe.tiny_calculator``) and its evaluation, so all
three see the same observations.

Problems are split by the same stable text hash as the arithmetic task
(``recipe.data.arithmetic.split_of``), so ``train``, ``val`` and ``sft`` never share one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from recipe.data.arithmetic import check_split_and_difficulty, split_of
from recipe.protocol import PromptRecord

DATA_SOURCE = "calculator"
MIN_OPERANDS, MAX_OPERANDS = 2, 8
_CALL = re.compile(r"(\d+)([+-])(\d+)")
_ANSWER = re.compile(r"\d+")
# Draws per wanted problem before the split is declared too small for the request.
_MAX_DRAWS_PER_PROBLEM = 50
_NUM_KEYS = {"train": "data.num_train_prompts", "val": "data.num_val_prompts", "sft": "num"}


@dataclass(frozen=True, slots=True)
class CalculatorStep:
    """The tool's reading of one model turn."""

    answer: int | None = None
    """The final answer, when the turn is a bare integer."""
    observation: str | None = None
    """What the tool answers a call (or a malformed turn) with."""
    error: bool = False
    """The turn was neither a call nor an answer."""


def calculator_step(action: str) -> CalculatorStep:
    """The calculator tool applied to one model turn (see the module docstring)."""
    text = action.strip()
    if _ANSWER.fullmatch(text):
        return CalculatorStep(answer=int(text))
    call = _CALL.fullmatch(text)
    if call is None:
        return CalculatorStep(observation="=error\n", error=True)
    a, op, b = int(call.group(1)), call.group(2), int(call.group(3))
    return CalculatorStep(observation=f"={a + b if op == '+' else a - b}\n")


def operands_of(prompt: str) -> tuple[list[int], list[str]]:
    """``"12+34-5="`` -> ``([12, 34, 5], ["+", "-"])``."""
    parts = re.split(r"([+-])", prompt.rstrip("="))
    return [int(p) for p in parts[0::2]], parts[1::2]


def transcript(record: PromptRecord) -> list[tuple[str, bool]]:
    """The reference episode of a problem as ``(text, is_model_turn)`` segments, the prompt
    first; each model turn is followed by eos when tokenised (the caller adds it)."""
    if not isinstance(record.prompt, str):
        raise TypeError(f"record {record.uid}: calculator prompts are plain strings")
    values, ops = operands_of(record.prompt)
    segments: list[tuple[str, bool]] = [(record.prompt, False)]
    running = values[0]
    for op, value in zip(ops, values[1:], strict=True):
        call = f"{running}{op}{value}"
        step = calculator_step(call)
        assert step.observation is not None
        segments += [(call, True), (step.observation, False)]
        running = running + value if op == "+" else running - value
    segments.append((str(running), True))
    return segments


def _draw(rng: random.Random, difficulty: int, num_operands: int) -> tuple[str, int]:
    n = 10**difficulty
    running = rng.randrange(n)
    text = str(running)
    for _ in range(num_operands - 1):
        if rng.random() < 0.5:
            value = rng.randrange(n)
            running, text = running + value, f"{text}+{value}"
        else:
            value = rng.randrange(min(running, n - 1) + 1)
            running, text = running - value, f"{text}-{value}"
    return f"{text}=", running


def make_calculator_records(
    num: int, *, difficulty: int, num_operands: int, seed: int, split: str
) -> list[PromptRecord]:
    """``num`` distinct problems of ``split``, deterministic for the arguments (a shorter
    list is a prefix of a longer one). ``ValueError`` when the split is too small."""
    check_split_and_difficulty(split, difficulty)
    if not MIN_OPERANDS <= num_operands <= MAX_OPERANDS:
        raise ValueError(
            f"data.num_operands={num_operands!r} is invalid: allowed an integer in "
            f"{MIN_OPERANDS}..{MAX_OPERANDS}"
        )
    rng = random.Random(f"calculator/{difficulty}/{num_operands}/{seed}/{split}")
    seen: set[str] = set()
    records: list[PromptRecord] = []
    for _ in range(_MAX_DRAWS_PER_PROBLEM * max(num, 1)):
        if len(records) == num:
            return records
        text, answer = _draw(rng, difficulty, num_operands)
        if text in seen or split_of(text) != split:
            continue
        seen.add(text)
        records.append(
            PromptRecord(
                uid=f"{split}-calc-{len(records):06d}",
                prompt=text,
                ground_truth=str(answer),
                data_source=DATA_SOURCE,
                extra_info={"difficulty": difficulty, "num_operands": num_operands, "seed": seed},
            )
        )
    if len(records) == num:
        return records
    raise ValueError(
        f"{_NUM_KEYS[split]}={num} is too large for data.difficulty={difficulty} and "
        f"data.num_operands={num_operands}: only {len(records)} distinct {split!r} calculator "
        "problems were found; lower the count or raise the difficulty"
    )
