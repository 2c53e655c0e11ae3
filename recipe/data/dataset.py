"""Build the train and validation prompt sets from ``data.*``.

Files win over the synthetic task: ``data.train_files`` / ``data.val_files`` are loaded in
verl's row schema (``recipe.data.loaders``); without train files the synthetic task
(``data.task``) generates both sets, disjoint by construction. Train files without val files
mean no validation: nothing is held out of the user's train set behind their back, and a
warning says so.
"""

from __future__ import annotations

import logging

from recipe.data.config import DataConfig
from recipe.data.loaders import load_records
from recipe.protocol import PromptRecord

logger = logging.getLogger(__name__)


def build_datasets(cfg: DataConfig) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Return ``(train, val)`` prompt records for ``cfg``; ``val`` may be empty."""
    if cfg.train_files:
        train = load_records(list(cfg.train_files), split="train", prompt_key=cfg.prompt_key)
    else:
        train = _synthetic(cfg, split="train", num=cfg.num_train_prompts)
    if cfg.val_files:
        val = load_records(list(cfg.val_files), split="val", prompt_key=cfg.prompt_key)
    elif cfg.train_files:
        logger.warning(
            "data.train_files is set but data.val_files is empty: no validation set, val/* "
            "metrics will be absent (nothing is held out of the train files)"
        )
        val = []
    else:
        val = _synthetic(cfg, split="val", num=cfg.num_val_prompts)
    logger.info("datasets: %d train prompts, %d val prompts", len(train), len(val))
    return train, val


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
