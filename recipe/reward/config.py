"""Config schema of the reward component (``reward.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recipe.reward.custom import split_custom_fn_spec
from recipe.reward.judge.config import JudgeConfig
from recipe.utils.config_check import ConfigError


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment: a response within ``len`` tokens of
    ``rollout.response_length`` loses up to ``penalty_factor`` reward, linearly in how far
    into that buffer it reaches (logged as ``reward/overlong_penalty``)."""

    enable: bool = False
    """Shape rewards by response length."""
    len: int = 0
    """Tokens before ``rollout.response_length`` where the penalty ramps from 0."""
    penalty_factor: float = 1.0
    """The penalty of a response that uses the whole budget."""

    def __post_init__(self) -> None:
        if self.enable and self.len <= 0:
            raise ConfigError(
                f"reward.overlong_buffer.len={self.len!r} is invalid: allowed > 0 with "
                "reward.overlong_buffer.enable=true"
            )
        if self.penalty_factor < 0:
            raise ConfigError(
                f"reward.overlong_buffer.penalty_factor={self.penalty_factor!r} is invalid: "
                "allowed >= 0"
            )

    def penalty(self, num_tokens: int, max_tokens: int) -> float:
        """The (non-positive) reward change of a response of ``num_tokens`` tokens."""
        exceed = num_tokens - (max_tokens - self.len)
        return min(-exceed / self.len * self.penalty_factor, 0.0)


@dataclass
class RewardConfig:
    custom_fn: str | None = None
    """``path/to/file.py:function`` or ``package.module:function`` scoring every data source.
    None: the built-in scorer registered for each record's ``data_source``."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment (off by default)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """An LLM judge that scores responses (off unless ``reward.judge.model`` or
    ``reward.judge.base_url`` is set)."""

    def __post_init__(self) -> None:
        if self.custom_fn is None:
            return
        # Only the format is checked here; the file is loaded where the reward runs, which
        # may be another node with another working directory.
        try:
            split_custom_fn_spec(self.custom_fn)
        except ValueError as err:
            raise ConfigError(str(err)) from None
