"""Users' task shapes for tests/integration/test_task_shapes.py: data files in verl's row
schema as the GSM8K and MATH preprocessing scripts write them, reward functions as users
write them, and the tiny default model with a chat template added.

Rows carry what real files carry beside the prompt: ``ability``, an ``extra_info`` dict
(``split``, ``index``, the original ``question`` / ``answer``), a top-level ``index``.
Prompt lengths run from a few tokens (bare arithmetic) to several hundred (a word problem
after a long preamble), so one step's prompts exceed an engine step's token budget many
times over.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
PREAMBLE = (
    "Read the whole story before you answer. A small bakery opens at six; the baker writes "
    "every number in a ledger. "
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# MATH's `answer` field as the data sets store it, and the number it stands for.
MATH_ANSWERS = ["\\frac{1}{2}", "90^\\circ", "5\\text{ cm}", "\\sqrt{2}", "(3, -1)", "12", "50\\%"]


def gsm8k_row(rng: random.Random, index: int, *, chat: bool, long: bool) -> dict[str, Any]:
    """A GSM8K row as verl's gsm8k.py writes it (ground truth: the number after ####)."""
    a, b = rng.randint(12, 99), rng.randint(2, 9)
    question = (
        f"Natalia sold clips to {a} of her friends in April, and then she sold {b} times as "
        f"many clips in May. How many clips did Natalia sell altogether in April and May?"
    )
    if long:
        question = PREAMBLE + question
    answer = f"In May she sold {a}*{b} = {a * b} clips.\nAltogether {a}+{a * b} = {a + a * b}."
    content = f"{question} {GSM8K_INSTRUCTION}"
    prompt: Any = [{"role": "user", "content": content}] if chat else content
    return {
        "data_source": "openai/gsm8k",
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + a * b)},
        "extra_info": {
            "split": "train",
            "index": index,
            "answer": f"{answer}\n#### {a + a * b}",
            "question": question,
        },
        "index": index,
    }


def math_row(rng: random.Random, index: int) -> dict[str, Any]:
    """A MATH row as verl's math_dataset.py writes it (ground truth: the boxed answer)."""
    answer = MATH_ANSWERS[index % len(MATH_ANSWERS)]
    problem = f"Simplify the expression {rng.randint(2, 9)}/{rng.randint(2, 9)} and explain."
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index, "level": "Level 2", "type": "Algebra"},
    }


def short_row(rng: random.Random, index: int, data_source: str) -> dict[str, Any]:
    """A bare arithmetic prompt of ~5 tokens."""
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return {
        "data_source": data_source,
        "prompt": f"{a}+{b}=",
        "reward_model": {"ground_truth": str(a + b)},
        "extra_info": {"index": index},
    }


def gsm8k_rows(num: int, seed: int, *, chat: str = "all") -> list[dict[str, Any]]:
    """``num`` rows: GSM8K word problems (every third after a long preamble) and short
    sums. ``chat``: ``all`` rows as chat messages, ``none`` as plain strings, ``mixed``."""
    rng = random.Random(seed)
    rows = []
    for i in range(num):
        if i % 4 == 3:
            rows.append(short_row(rng, i, "openai/gsm8k"))
            continue
        as_chat = chat == "all" or (chat == "mixed" and i % 2 == 0)
        rows.append(gsm8k_row(rng, i, chat=as_chat, long=i % 3 == 0))
    return rows


def mixed_math_rows(num: int, seed: int) -> list[dict[str, Any]]:
    """MATH and GSM8K rows in one file, prompts as plain strings (the built-in scorers are
    picked per row by ``data_source``)."""
    rng = random.Random(seed)
    rows = []
    for i in range(num):
        if i % 4 == 3:
            rows.append(short_row(rng, i, "openai/gsm8k"))
            continue
        row = math_row(rng, i) if i % 2 else gsm8k_row(rng, i, chat=False, long=i % 4 == 0)
        row["prompt"] = (
            row["prompt"] if isinstance(row["prompt"], str) else (row["prompt"][0]["content"])
        )
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def with_chat_template(model_dir: Path, out_dir: Path) -> Path:
    """A copy of ``model_dir`` whose tokenizer has a chat template."""
    shutil.copytree(model_dir, out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return out_dir


# An environment file as a user writes one (recipe.agent): one check-back turn, then done;
# no reward of its own, so the reward function scores the episode.
CHECK_BACK_ENV = """
from recipe.agent import Environment, StepResult

class CheckBack(Environment):
    def __init__(self, as_chat=True):
        self.as_chat = as_chat

    async def reset(self, record):
        self.turns = 0
        return record.prompt

    async def step(self, action):
        self.turns += 1
        if self.turns >= 2:
            return StepResult(done=True, info={"checked": 1.0})
        text = "Check your answer; end with the number after ####."
        return StepResult(observation=[{"role": "user", "content": text}] if self.as_chat else text)
"""

# Reward files as users write them (verl's signature).
DICT_REWARD = """
import re

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = re.findall(r"-?\\d+", solution_str)
    correct = bool(numbers) and numbers[-1] == ground_truth
    return {"score": float(correct), "acc": float(correct), "has_number": float(bool(numbers)),
            "pred": numbers[-1] if numbers else None}
"""
ASYNC_REWARD = """
import asyncio

async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0.001)  # a remote judge
    return float(ground_truth in solution_str)
"""
LOOP_BOUND_REWARD = """
import asyncio

from recipe.reward import get_scorer

class Judge:  # a reward service's client: a lock and a queue bound to the loop that made them
    def __init__(self):
        self.lock, self.pending = asyncio.Lock(), asyncio.Queue()

    async def score(self, data_source, solution_str, ground_truth):
        async with self.lock:  # held across awaits, as a connection pool is
            await self.pending.put(solution_str)
            await asyncio.sleep(0.001)
            text = await self.pending.get()
        scorer = get_scorer(data_source)  # the built-in scorer of the row's data_source
        return scorer(data_source=data_source, solution_str=text, ground_truth=ground_truth)

judge = None

async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global judge
    judge = judge or Judge()  # made on the first call's loop and kept for the run
    return await judge.score(data_source, solution_str, ground_truth)
"""
RAISES_ON_ROW = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] == {row}:
        raise KeyError("no reference answer for this row")
    return 0.0
"""
RETURNS = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {value}
"""


def write_source(path: Path, source: str) -> Path:
    """A user's Python file (an environment) written to ``path``."""
    path.write_text(source)
    return path


def write_reward(path: Path, source: str) -> str:
    """The file and its ``reward.custom_fn`` spec."""
    path.write_text(source)
    return f"{path}:compute_score"
