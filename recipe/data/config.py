"""Config schema of the data component (``data.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recipe.utils.config_check import require, require_choice, require_positive

TASKS = ("arithmetic", "calculator")


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Parquet/jsonl files in verl's row schema. Empty: the synthetic ``task`` is used."""
    val_files: list[str] = field(default_factory=list)
    """Validation files in the same schema. Empty: a held-out synthetic set when the train set
    is synthetic too, else no validation (warned)."""
    task: str = "arithmetic"
    """Synthetic task used when no files are given: ``arithmetic`` (``a+b=``, one answer) or
    ``calculator`` (multi-step problems for the calculator environment, ``env=calculator``)."""
    difficulty: int = 2
    """Synthetic task difficulty: the number of digits of each operand (1-6)."""
    num_operands: int = 3
    """Operands per problem of the ``calculator`` task (2-8)."""
    num_train_prompts: int = 8000
    """Size of the synthetic train set (prompts)."""
    num_val_prompts: int = 256
    """Size of the synthetic validation set (prompts), disjoint from the train set."""
    seed: int = 1
    """Seed of the synthetic sets and of the prompt order."""
    shuffle: bool = True
    """Shuffle the prompt order each epoch (seeded)."""
    train_batch_size: int = 32
    """Prompts per trainer step in the sync and one_step_off modes."""
    max_prompt_length: int = 256
    """Prompts longer than this (tokens) fail at load time with the row named."""
    prompt_key: str = "prompt"
    """Column holding the prompt (chat messages or a plain string)."""

    def __post_init__(self) -> None:
        require_choice("data.task", self.task, TASKS)
        require(1 <= self.difficulty <= 6, "data.difficulty", self.difficulty, "an integer in 1..6")
        require(
            2 <= self.num_operands <= 8,
            "data.num_operands",
            self.num_operands,
            "an integer in 2..8",
        )
        require_positive("data.num_train_prompts", self.num_train_prompts)
        require_positive("data.num_val_prompts", self.num_val_prompts)
        require_positive("data.train_batch_size", self.train_batch_size)
        require_positive("data.max_prompt_length", self.max_prompt_length)
        require(bool(self.prompt_key), "data.prompt_key", self.prompt_key, "a column name")
