"""Build the train and validation prompt sets from ``data.*``.

``data.source`` (``DataConfig.resolved_source``) picks the train set: files in verl's row
schema (``recipe.data.loaders``), the synthetic ``data.task``, or a reasoning-gym task
(``recipe.data.reasoning_gym``). ``data.val_files``, when set, is the validation set whatever
the source. Otherwise a generated train set comes with a held-out generated validation set
(the synthetic tasks are disjoint by construction; reasoning-gym's val set drops the train
set's questions, logged), and train files mean no validation: nothing is held out of the
user's train set behind their back, and a warning says so.
"""

from __future__ import annotations

import logging

from recipe.data.config import DataConfig
from recipe.data.loaders import load_records
from recipe.data.reasoning_gym import drop_train_questions, make_reasoning_gym_sets
from recipe.protocol import PromptRecord

logger = logging.getLogger(__name__)


def build_datasets(cfg: DataConfig) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Return ``(train, val)`` prompt records for ``cfg``; ``val`` may be empty."""
    source = cfg.resolved_source
    generated_val = not cfg.val_files and source != "files"
    if source == "files":
        train = load_records(list(cfg.train_files), split="train", prompt_key=cfg.prompt_key)
        train = _first(train, cfg.train_max_samples, "data.train_max_samples")
    elif source == "reasoning_gym":  # imports reasoning-gym, an optional extra
        # Both sets from one generator process (recipe/data/reasoning_gym_entries.py).
        sizes = {"train": cfg.num_train_prompts}
        if generated_val:
            sizes["val"] = cfg.num_val_prompts
        sets = make_reasoning_gym_sets(cfg.reasoning_gym, sizes)
        train = sets["train"]
    else:
        train = _synthetic(cfg, split="train", num=cfg.num_train_prompts)
    if cfg.val_files:
        val = load_records(list(cfg.val_files), split="val", prompt_key=cfg.prompt_key)
        val = _first(val, cfg.val_max_samples, "data.val_max_samples")
    elif source == "files":
        logger.warning(
            "data.train_files is set but data.val_files is empty: no validation set, val/* "
            "metrics will be absent (nothing is held out of the train files)"
        )
        val = []
    elif source == "reasoning_gym":
        val = drop_train_questions(sets["val"], train)
    else:
        val = _synthetic(cfg, split="val", num=cfg.num_val_prompts)
    logger.info("datasets: %d train prompts, %d val prompts", len(train), len(val))
    return train, val


def _first(records: list[PromptRecord], limit: int, key: str) -> list[PromptRecord]:
    """The first ``limit`` records (-1: all), the cut logged with the key that made it."""
    if limit == -1 or limit >= len(records):
        return records
    logger.info("%s=%d: %d of %d rows kept", key, limit, limit, len(records))
    return records[:limit]


def _synthetic(cfg: DataConfig, *, split: str, num: int) -> list[PromptRecord]:
    # Imported here so that file-based runs never pay for (or depend on) the generators.
    if cfg.task == "arithmetic":
        from recipe.data.arithmetic import make_arithmetic_records

        return make_arithmetic_records(num, difficulty=cfg.difficulty, seed=cfg.seed, split=split)
    if cfg.task == "calculator":
        from recipe.data.calculator import make_calculator_records

        return make_calculator_records(
            num,
            difficulty=cfg.difficulty,
            num_operands=cfg.num_operands,
            seed=cfg.seed,
            split=split,
        )
    # DataConfig validates data.task; reaching here means a task was added there only.
    raise ValueError(f"data.task={cfg.task!r} has no generator in recipe.data.dataset")
