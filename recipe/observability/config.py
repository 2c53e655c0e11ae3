"""``logger.*``: where a run's metrics go and how often the console prints.

The backend names are declared here, with the config that chooses among them;
recipe/observability/backends.py registers one factory under each name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recipe.utils.config_check import require, require_choice, require_positive

BACKEND_NAMES = ("console", "jsonl", "wandb", "tensorboard")
WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    mode: str = "offline"
    """``offline`` (files under the run directory), ``online`` (needs a W&B API key) or
    ``disabled``."""
    entity: str | None = None
    """W&B team or user; None: the account's default entity."""

    def __post_init__(self) -> None:
        require_choice("logger.wandb.mode", self.mode, WANDB_MODES)


@dataclass
class LoggerConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks, any of ``console``, ``jsonl``, ``wandb``, ``tensorboard``."""
    project: str = "fully_async_rl"
    """Project name (wandb project; also recorded in the run config)."""
    experiment: str = "default"
    """Experiment name (wandb run name)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """wandb-only settings (``logger.wandb.*``)."""
    console_every: int = 10
    """Print a console line every N steps (steps divisible by N); the step bar shows every
    step's headline figures in between."""
    quiet: bool = False
    """Console prints nothing per step (for CI logs); other sinks are unaffected."""

    def __post_init__(self) -> None:
        require(not isinstance(self.backends, str), "logger.backends", self.backends, "a list")
        self.backends = list(self.backends)
        for name in self.backends:
            require_choice("logger.backends", name, BACKEND_NAMES)
        duplicates = sorted({n for n in self.backends if self.backends.count(n) > 1})
        require(not duplicates, "logger.backends", self.backends, "each backend at most once")
        require(bool(self.project), "logger.project", self.project, "a non-empty string")
        require(bool(self.experiment), "logger.experiment", self.experiment, "a non-empty string")
        require_positive("logger.console_every", self.console_every)
