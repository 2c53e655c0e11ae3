"""The tiny model warm-started on calculator episodes: ``model.tiny_warm_start=calculator``.

Built on first use from the arithmetic tiny model (``ensure_tiny_model``), in a child process
with the same pinned numerics, and cached in its own folder (named by the fingerprint of
``CalculatorSpec`` and of the base model's spec)::

    tiny arithmetic model -> SFT on reference episodes of the calculator task's ``sft`` split
      (loss on the model turns and their eos only; prompts and tool answers are context)
      -> greedy + sampled episodes on ``val`` with the real tool -> HF directory + tiny_meta.json

The episodes are those the built-in environment runs (``recipe.data.calculator``): calls of one
operation each, answered by the tool, then the final answer. The SFT is stopped early, as the
base model's is, so that episodes still fail often (a miscopied operand, a call skipped, an
answer before the last call) and GRPO groups have reward variance from step 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.calculator import calculator_step, make_calculator_records, transcript
from recipe.protocol import PromptRecord
from recipe.tiny.arithmetic import TinySpec, ensure_tiny_model
from recipe.tiny.cache import (
    builder_main,
    check_build_env,
    ensure_cached,
    read_tiny_meta,
    save_built_model,
)
from recipe.tiny.train import generate_ids, sft_loop

logger = logging.getLogger(__name__)

BUILDER_VERSION = 1
BASE_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True, slots=True)
class CalculatorSpec:
    """Every constant of the calculator warm start; with the base's, it names the folder."""

    difficulty: int = 2
    """Digits per operand (``data.difficulty``'s default)."""
    num_operands: int = 3
    """Operands per problem (``data.num_operands``'s default)."""
    sft_num_records: int = 2048
    """Reference episodes of the ``sft`` split trained on."""
    sft_steps: int = 200
    """Optimizer steps; calibrated so greedy val accuracy stays well below 1."""
    sft_batch_size: int = 128
    """Episodes per optimizer step."""
    sft_lr: float = 3e-3
    """AdamW learning rate after a linear warm-up."""
    sft_warmup_steps: int = 10
    """Linear warm-up length in optimizer steps."""
    seed: int = 0
    """Seed of the data order and of the sampled eval."""
    eval_num_prompts: int = 256
    """``val`` prompts of the eval (seed 1, as ``data.seed``)."""
    eval_num_samples: int = 4
    """Sampled episodes per prompt at temperature 1 for the reward-variance check."""

    @property
    def max_turns(self) -> int:
        """Model turns of an episode: one call per operation, the answer, one spare (the
        ``env=calculator`` preset's ``max_assistant_turns``)."""
        return self.num_operands + 1

    @property
    def turn_tokens(self) -> int:
        """Tokens of the longest model turn: a call on the largest running value, with eos."""
        largest = self.num_operands * (10**self.difficulty - 1)
        return len(str(largest)) + 1 + self.difficulty + 1

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(
            [BUILDER_VERSION, TinySpec().fingerprint, dataclasses.asdict(self)], sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def dir_name(self) -> str:
        return f"tiny-qwen2-calculator-v{BUILDER_VERSION}-{self.fingerprint}"


def ensure_calculator_model(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """Path of the cached calculator warm start, built on first use (the base model too)."""
    base = ensure_tiny_model(cache_dir)
    return ensure_cached(
        CalculatorSpec().dir_name,
        "recipe.tiny.calculator",
        cache_dir,
        force=force,
        builder_args=("--base", str(base)),
    )


def encode_episodes(records: list[PromptRecord], tokenizer: Any) -> tuple[Any, Any, Any]:
    """Right-padded ``(input_ids, labels, attention_mask)`` of the reference episodes; each
    segment is tokenised on its own, as the rollout appends it, and labels keep only the
    model turns and the eos ending each."""
    import torch

    eos = tokenizer.eos_token_id
    rows: list[tuple[list[int], list[int]]] = []
    for record in records:
        ids: list[int] = []
        labels: list[int] = []
        for text, is_model in transcript(record):
            seg = tokenizer.encode(text, add_special_tokens=False) + ([eos] if is_model else [])
            ids += seg
            labels += seg if is_model else [-100] * len(seg)
        rows.append((ids, labels))
    max_len = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), max_len), tokenizer.pad_token_id, dtype=torch.long)
    label_ids = torch.full_like(input_ids, -100)
    attention_mask = torch.zeros_like(input_ids)
    for i, (ids, labels) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        label_ids[i, : len(ids)] = torch.tensor(labels)
        attention_mask[i, : len(ids)] = 1
    return input_ids, label_ids, attention_mask


def run_episodes(
    model: Any,
    tokenizer: Any,
    records: list[PromptRecord],
    *,
    max_turns: int,
    turn_tokens: int,
    generator: Any = None,
) -> list[bool]:
    """Whether each record's episode ends with the right answer: model turns decoded greedily
    (``generator`` None) or sampled, answered by the calculator tool, as the environment does."""
    eos = tokenizer.eos_token_id
    contexts = [tokenizer.encode(str(r.prompt), add_special_tokens=False) for r in records]
    correct = [False] * len(records)
    active = list(range(len(records)))
    for _ in range(max_turns):
        turns = generate_ids(
            model,
            [contexts[i] for i in active],
            eos=eos,
            max_new_tokens=turn_tokens,
            generator=generator,
        )
        still: list[int] = []
        for i, turn in zip(active, turns, strict=True):
            if turn is None:
                continue  # no eos within the turn budget: the episode ends unanswered
            step = calculator_step(tokenizer.decode(turn))
            if step.answer is not None:
                correct[i] = str(step.answer) == records[i].ground_truth
                continue
            assert step.observation is not None
            observation = tokenizer.encode(step.observation, add_special_tokens=False)
            contexts[i] = [*contexts[i], *turn, eos, *observation]
            still.append(i)
        active = still
    return correct


def evaluate(spec: CalculatorSpec, model: Any, tokenizer: Any) -> dict[str, Any]:
    """Greedy and sampled episode accuracy on ``val`` (and the share of prompts whose sampled
    episodes disagree: the GRPO signal)."""
    import torch

    records = make_calculator_records(
        spec.eval_num_prompts,
        difficulty=spec.difficulty,
        num_operands=spec.num_operands,
        seed=1,
        split="val",
    )
    budget = {"max_turns": spec.max_turns, "turn_tokens": spec.turn_tokens}
    greedy = run_episodes(model, tokenizer, records, **budget)
    n = spec.eval_num_samples
    sampled = run_episodes(
        model,
        tokenizer,
        [r for r in records for _ in range(n)],
        generator=torch.Generator().manual_seed(spec.seed),
        **budget,
    )
    num_right = [sum(sampled[i * n : (i + 1) * n]) for i in range(len(records))]
    return {
        "eval_num_prompts": len(records),
        "greedy_val_accuracy": round(sum(greedy) / len(records), 4),
        "sampled_val_accuracy": round(sum(num_right) / (n * len(records)), 4),
        "sampled_mixed_fraction": round(sum(0 < k < n for k in num_right) / len(records), 4),
    }


def build(spec: CalculatorSpec, base: Path, out_dir: Path) -> None:
    """Continue ``base``'s SFT on calculator episodes; write the model and its record."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    started = time.perf_counter()
    logger.info("building the calculator warm start in %s (one-time)", out_dir)
    cpu_capability = check_build_env(logger, "calculator warm start")
    for name in BASE_FILES:
        shutil.copy2(base / name, out_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        model = Qwen2ForCausalLM.from_pretrained(base, dtype=torch.float32)
        records = make_calculator_records(
            spec.sft_num_records,
            difficulty=spec.difficulty,
            num_operands=spec.num_operands,
            seed=spec.seed,
            split="sft",
        )
        sft = sft_loop(
            model,
            encode_episodes(records, tokenizer),
            steps=spec.sft_steps,
            batch_size=spec.sft_batch_size,
            lr=spec.sft_lr,
            warmup_steps=spec.sft_warmup_steps,
            seed=spec.seed,
        )
        evals = evaluate(spec, model, tokenizer)
    meta = {
        "builder_version": BUILDER_VERSION,
        "fingerprint": spec.fingerprint,
        "spec": dataclasses.asdict(spec),
        "base": read_tiny_meta(base)["fingerprint"],
        **sft,
        **evals,
    }
    meta = save_built_model(model, out_dir, meta, started=started, cpu_capability=cpu_capability)
    logger.info(
        "built the calculator warm start: greedy val accuracy %.3f, sampled %.3f "
        "(mixed groups %.2f), %.1fs",
        meta["greedy_val_accuracy"],
        meta["sampled_val_accuracy"],
        meta["sampled_mixed_fraction"],
        meta["build_seconds"],
    )


def main(argv: list[str] | None = None) -> None:
    builder_main(
        argv,
        prog="python -m recipe.tiny.calculator",
        description="Build (once) and show the tiny model warm-started on calculator episodes.",
        ensure=ensure_calculator_model,
        build=lambda args: build(CalculatorSpec(), args.base, args.build_into),
        child_args=("--base",),
    )


if __name__ == "__main__":
    main()
