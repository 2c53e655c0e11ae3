"""Load a user reward function named by ``reward.custom_fn``.

Two spellings, as users of verl's ``custom_reward_function`` expect:

- ``path/to/file.py:function``: the file is loaded as a module (relative paths from the
  working directory); nothing needs to be installed.
- ``package.module:function``: imported the normal way (it must be on ``sys.path``).

Every failure is a ``ValueError`` that names ``reward.custom_fn`` and, for an import failure,
carries the original error text, since the user's file is where the fix is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recipe.utils.import_path import load_attribute, split_spec

KEY = "reward.custom_fn"


def split_custom_fn_spec(spec: str) -> tuple[str, str]:
    """``(module_or_file, function_name)`` of ``spec``; ``ValueError`` naming the key if bad."""
    return split_spec(KEY, spec, "function")


def load_custom_fn(spec: str) -> Callable[..., Any]:
    """The callable named by ``spec`` (see module docstring)."""
    _, fn = load_attribute(KEY, spec, "function")
    if not callable(fn):
        name = spec.rpartition(":")[2].strip()
        raise ValueError(f"{KEY}={spec!r}: {name} is a {type(fn).__name__}, not callable")
    return fn
