"""The registries of policy losses and advantage estimators: one line per config name.

Each line maps a name of ``algorithm.policy_loss`` / ``algorithm.adv_estimator`` to the
function that implements it, as ``package.module:function`` (imported on first use: the
config schema loads this module, and a bad command line must fail before torch is imported).
A config value that is no registered name may name a function of the user's, as
``reward.custom_fn`` does: ``path/to/file.py:function`` or ``package.module:function``, loaded
by the same loader (``recipe.utils.import_path``). Either way the function takes one typed
inputs dataclass::

    policy loss          fn(PolicyLossInputs) -> (loss, PolicyLossStats)   recipe/algo/losses.py
    advantage estimator  fn(AdvantageInputs) -> advantages (B,) float32    recipe/algo/advantages.py

Adding one: a function in a new file, and its line here (or no line: ``FILE.py:fn``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recipe.utils.config_check import ConfigError
from recipe.utils.import_path import FORMAT_HINT, load_attribute


@dataclass(frozen=True)
class Registry:
    """One plug-in family: its config key and its lines (module docstring)."""

    key: str
    entries: dict[str, str]
    """Config name -> ``package.module:function``."""

    def choices(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def check(self, value: str) -> None:
        """``ConfigError`` naming the key unless ``value`` is a registered name or loads as
        a function (``FILE.py:fn``: the file is loaded here, so a bad one stops the run at
        once; a registered one is imported only when called)."""
        if value in self.entries:
            return
        try:
            self.load(value)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def load(self, value: str) -> Callable[..., Any]:
        """The function of ``value`` (a registered name or ``FILE.py:fn``), loaded once;
        ``ValueError`` naming the key and the choices."""
        if value in self.entries:
            return _load_function(self.key, self.entries[value])
        if not isinstance(value, str) or ":" not in value:
            allowed = ", ".join(repr(c) for c in self.choices())
            hint = FORMAT_HINT.format(kind="function")
            raise ValueError(f"{self.key}={value!r} is invalid: allowed one of {allowed} or {hint}")
        return _load_function(self.key, value)


@functools.cache
def _load_function(key: str, spec: str) -> Callable[..., Any]:
    _, fn = load_attribute(key, spec, "function")
    if not callable(fn):
        raise ValueError(f"{key}={spec!r}: {type(fn).__name__} is not callable")
    return fn


POLICY_LOSS = Registry(
    "algorithm.policy_loss",
    {
        "ppo": "recipe.algo.policy_loss:ppo",
        "gspo": "recipe.algo.policy_loss:gspo",
        "cispo": "recipe.algo.policy_loss:cispo",
    },
)
ADV_ESTIMATOR = Registry(
    "algorithm.adv_estimator",
    {
        "grpo": "recipe.algo.advantages:grpo",
        "rloo": "recipe.algo.advantages:rloo",
    },
)
