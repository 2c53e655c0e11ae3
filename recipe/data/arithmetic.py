"""The synthetic arithmetic task: ``"23+45="`` -> ``"68"``, the default dataset of the recipe.

Why this task: its reward is exact and free to compute, its difficulty is one knob (digits per
operand), and a model of a few hundred thousand parameters learns it on a CPU, so the whole
RL loop can run and converge in tests and on a laptop.

Problems are ``a+b`` and ``a-b`` with operands in ``[0, 10**difficulty)``; subtraction keeps
``a >= b`` so every answer is a non-negative integer. Each problem belongs to exactly one
split, chosen by a stable hash of its text (independent of the seed), so ``train``, ``val`` and
``sft`` (the warm-start set of ``recipe.tiny``) never share a problem, whatever seeds they use.
The seed only chooses which problems of the split are drawn and in what order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from recipe.protocol import PromptRecord

DATA_SOURCE = "arithmetic"
SPLITS = ("train", "val", "sft")
MIN_DIFFICULTY, MAX_DIFFICULTY = 1, 6

# Cumulative share of the problem space per split, in SPLITS order. Train gets most; val needs
# at least the default 256 prompts at difficulty 2 (it gets ~750 there).
_SPLIT_CUTOFFS = (0.80, 0.85, 1.0)
# Up to this many problems the space is enumerated, so "too few problems" is exact.
_ENUMERATE_LIMIT = 200_000
# Above it, draws are rejected when already taken; allow at most this share of the split so
# rejection sampling stays fast.
_MAX_DRAWN_SHARE = 0.5
# Config key named in errors, per split.
_NUM_KEYS = {"train": "data.num_train_prompts", "val": "data.num_val_prompts", "sft": "num"}


def split_of(problem: str) -> str:
    """The split a problem text belongs to (stable across processes and Python versions)."""
    digest = hashlib.blake2b(problem.encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    for split, cutoff in zip(SPLITS, _SPLIT_CUTOFFS, strict=True):
        if u < cutoff:
            return split
    return SPLITS[-1]


def problem_space_size(difficulty: int) -> int:
    """Distinct problems of all splits: every ``a+b`` plus every ``a-b`` with ``a >= b``."""
    n = 10**difficulty
    return n * n + n * (n + 1) // 2


def sft_text(record: PromptRecord) -> str:
    """The supervised target of a record: prompt followed by its answer (no eos)."""
    if not isinstance(record.prompt, str):
        raise TypeError(f"record {record.uid}: arithmetic prompts are plain strings")
    return record.prompt + record.ground_truth


def check_split_and_difficulty(split: str, difficulty: int) -> None:
    """``ValueError`` naming the argument when ``split`` or ``difficulty`` is out of range
    (shared by the synthetic tasks)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: allowed one of {', '.join(SPLITS)}")
    if not MIN_DIFFICULTY <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(
            f"data.difficulty={difficulty!r} is invalid: allowed an integer in "
            f"{MIN_DIFFICULTY}..{MAX_DIFFICULTY}"
        )


def _check_args(num: int, difficulty: int, split: str) -> None:
    check_split_and_difficulty(split, difficulty)
    if num < 0:
        raise ValueError(f"{_NUM_KEYS[split]}={num!r} is invalid: allowed a number >= 0")


def _split_capacity(difficulty: int, split: str) -> int:
    """How many problems may be drawn from a split without replacement."""
    total = problem_space_size(difficulty)
    if total <= _ENUMERATE_LIMIT:
        return sum(1 for text, _ in _enumerate(difficulty) if split_of(text) == split)
    lo = 0.0 if split == SPLITS[0] else _SPLIT_CUTOFFS[SPLITS.index(split) - 1]
    share = _SPLIT_CUTOFFS[SPLITS.index(split)] - lo
    return int(total * share * _MAX_DRAWN_SHARE)


def _enumerate(difficulty: int) -> Iterator[tuple[str, int]]:
    n = 10**difficulty
    for a in range(n):
        for b in range(n):
            yield f"{a}+{b}=", a + b
            if a >= b:
                yield f"{a}-{b}=", a - b


def _draw(rng: random.Random, difficulty: int) -> tuple[str, int]:
    # Operators are equally likely (not weighted by their share of the space), so subtraction
    # is as common as addition while it has problems left.
    n = 10**difficulty
    a, b = rng.randrange(n), rng.randrange(n)
    if rng.random() < 0.5:
        return f"{a}+{b}=", a + b
    a, b = max(a, b), min(a, b)
    return f"{a}-{b}=", a - b


def make_arithmetic_records(
    num: int, *, difficulty: int, seed: int, split: str
) -> list[PromptRecord]:
    """``num`` distinct problems of ``split``, deterministic for (num, difficulty, seed, split).

    A shorter list is a prefix of a longer one with the same arguments. Raises ``ValueError``
    when the split holds fewer than ``num`` problems at this difficulty.
    """
    _check_args(num, difficulty, split)
    capacity = _split_capacity(difficulty, split)
    if num > capacity:
        raise ValueError(
            f"{_NUM_KEYS[split]}={num} is too large for data.difficulty={difficulty}: the "
            f"{split!r} split of the arithmetic task has {capacity} usable distinct problems; "
            "lower the count or raise the difficulty"
        )
    # A string seed is hashed with SHA-512 by random.seed, so the stream is the same in every
    # process regardless of PYTHONHASHSEED.
    rng = random.Random(f"arithmetic/{difficulty}/{seed}/{split}")
    seen: set[str] = set()
    records: list[PromptRecord] = []
    while len(records) < num:
        text, answer = _draw(rng, difficulty)
        if text in seen or split_of(text) != split:
            continue
        seen.add(text)
        records.append(
            PromptRecord(
                uid=f"{split}-{len(records):06d}",
                prompt=text,
                ground_truth=str(answer),
                data_source=DATA_SOURCE,
                extra_info={"difficulty": difficulty, "seed": seed, "split": split},
            )
        )
    return records
