"""Config schema of the reward component (``reward.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from recipe.reward.custom import split_custom_fn_spec
from recipe.utils.config_check import ConfigError


@dataclass
class RewardConfig:
    custom_fn: str | None = None
    """``path/to/file.py:function`` or ``package.module:function`` scoring every data source.
    None: the built-in scorer registered for each record's ``data_source``."""

    def __post_init__(self) -> None:
        if self.custom_fn is None:
            return
        # Only the format is checked here; the file is loaded where the reward runs, which
        # may be another node with another working directory.
        try:
            split_custom_fn_spec(self.custom_fn)
        except ValueError as err:
            raise ConfigError(str(err)) from None
