"""Config schema of the data component (``data.*``).

Where prompts come from is ``data.source``:

    auto           files when data.train_files is set, else the synthetic data.task (default)
    files          data.train_files / data.val_files in verl's row schema
    synthetic      the built-in generator named by data.task
    reasoning_gym  a reasoning-gym task (data.reasoning_gym.*; pip install the [reasoning] extra)

``auto`` keeps the behaviour of configs written before ``data.source`` existed; the explicit
values make a run fail at startup instead of quietly falling back to another source.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from recipe.data.reasoning_gym import ReasoningGymConfig, check_reasoning_gym_config
from recipe.utils.config_check import require, require_choice, require_positive

logger = logging.getLogger(__name__)

TASKS = ("arithmetic", "calculator")
SOURCES = ("auto", "files", "synthetic", "reasoning_gym")
NUM_TRAIN_PROMPTS = 8000
NUM_VAL_PROMPTS = 256


@dataclass
class DataConfig:
    source: str = "auto"
    """Where prompts come from: ``auto``, ``files``, ``synthetic`` or ``reasoning_gym`` (see
    the module docstring)."""
    train_files: list[str] = field(default_factory=list)
    """Parquet/jsonl files in verl's row schema. Empty (``source=auto``): the synthetic
    ``task`` is used."""
    val_files: list[str] = field(default_factory=list)
    """Validation files in the same schema, the validation set whatever the source. Empty: a
    held-out generated set when the train set is generated, else no validation (warned)."""
    task: str = "arithmetic"
    """Synthetic task of ``source=synthetic`` (and ``auto`` without files): ``arithmetic``
    (``a+b=``, one answer) or ``calculator`` (multi-step problems for the calculator
    environment, ``env=calculator``)."""
    difficulty: int = 2
    """Synthetic task difficulty: the number of digits of each operand (1-6)."""
    num_operands: int = 3
    """Operands per problem of the ``calculator`` task (2-8)."""
    num_train_prompts: int = NUM_TRAIN_PROMPTS
    """Size of a generated train set (synthetic task or reasoning-gym), in prompts."""
    num_val_prompts: int = NUM_VAL_PROMPTS
    """Size of a generated validation set (prompts), disjoint from the train set (reasoning-gym:
    before its repeats of train questions are dropped)."""
    train_max_samples: int = -1
    """Train on the first N rows of ``data.train_files`` only (their order in the files);
    -1: all of them. verl's key."""
    val_max_samples: int = -1
    """Validate on the first N rows of ``data.val_files`` only; -1: all. A fixed subset,
    so runs of one study validate on the same prompts. verl's key."""
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
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    """The reasoning-gym task of ``source=reasoning_gym``."""

    def __post_init__(self) -> None:
        require_choice("data.source", self.source, SOURCES)
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
        for key in ("train_max_samples", "val_max_samples"):
            value = getattr(self, key)
            require(value == -1 or value > 0, f"data.{key}", value, "-1 (all rows) or > 0")
        require_positive("data.train_batch_size", self.train_batch_size)
        require_positive("data.max_prompt_length", self.max_prompt_length)
        require(bool(self.prompt_key), "data.prompt_key", self.prompt_key, "a column name")
        self._check_source()

    @property
    def resolved_source(self) -> str:
        """``files``, ``synthetic`` or ``reasoning_gym``: ``source`` with ``auto`` resolved."""
        if self.source != "auto":
            return self.source
        return "files" if self.train_files else "synthetic"

    def _check_source(self) -> None:
        source = self.resolved_source
        if source == "files":
            require(
                bool(self.train_files),
                "data.train_files",
                self.train_files,
                "at least one file with data.source=files",
            )
        elif self.train_files:
            _warn_ignored("data.train_files", source)
        if source == "reasoning_gym":
            check_reasoning_gym_config(
                self.reasoning_gym,
                num_train=self.num_train_prompts,
                num_val=self.num_val_prompts,
            )
        elif self.reasoning_gym.dataset:
            _warn_ignored("data.reasoning_gym.dataset", source)
        if source == "files" and self.num_train_prompts != NUM_TRAIN_PROMPTS:
            _warn_ignored("data.num_train_prompts", source, "data.train_max_samples")
        if self.val_files and self.num_val_prompts != NUM_VAL_PROMPTS:
            _warn_ignored("data.num_val_prompts", "data.val_files", "data.val_max_samples")


def _warn_ignored(key: str, source: str, instead: str = "") -> None:
    """``source``: a ``data.source`` value, or the key whose presence makes ``key`` moot."""
    where = source if source.startswith("data.") else f"data.source={source}"
    hint = f" ({instead}=N keeps the first N rows)" if instead else ""
    logger.warning("%s has no effect with %s; it is ignored%s", key, where, hint)
