"""Load a user reward function named by ``reward.custom_fn``.

Two spellings, as users of verl's ``custom_reward_function`` expect:

- ``path/to/file.py:function``: the file is loaded as a module (relative paths from the
  working directory); nothing needs to be installed.
- ``package.module:function``: imported the normal way (it must be on ``sys.path``).

Every failure is a ``ValueError`` that names ``reward.custom_fn`` and, for an import failure,
carries the original error text, since the user's file is where the fix is.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

KEY = "reward.custom_fn"
FORMAT_HINT = "'path/to/file.py:function' or 'package.module:function'"


def split_custom_fn_spec(spec: str) -> tuple[str, str]:
    """``(module_or_file, function_name)`` of ``spec``; ``ValueError`` naming the key if bad."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{KEY}={spec!r} is invalid: allowed {FORMAT_HINT}")
    # rpartition: the function name never holds ':', a (Windows) path may.
    target, _, fn_name = spec.rpartition(":")
    target, fn_name = target.strip(), fn_name.strip()
    if not target or not fn_name.isidentifier():
        raise ValueError(
            f"{KEY}={spec!r} is invalid: allowed {FORMAT_HINT} (function must be a Python name)"
        )
    return target, fn_name


def load_custom_fn(spec: str) -> Callable[..., Any]:
    """The callable named by ``spec`` (see module docstring)."""
    target, fn_name = split_custom_fn_spec(spec)
    module = _load_file(spec, target) if _is_file_target(target) else _import(spec, target)
    if not hasattr(module, fn_name):
        available = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_") and not isinstance(value, type)
        )
        raise ValueError(
            f"{KEY}={spec!r}: {target} has no attribute {fn_name!r} "
            f"(its functions: {', '.join(available) or 'none'})"
        )
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ValueError(f"{KEY}={spec!r}: {fn_name} is a {type(fn).__name__}, not callable")
    return fn


def _is_file_target(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def _load_file(spec: str, target: str) -> ModuleType:
    path = os.path.abspath(os.path.expanduser(target))
    if not os.path.isfile(path):
        raise ValueError(f"{KEY}={spec!r}: file not found: {path}")
    # A unique, stable module name per file: two files named reward.py must not collide, and
    # registering in sys.modules lets dataclasses/pickle inside the file resolve the module.
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    module_name = f"recipe_custom_reward_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{KEY}={spec!r}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise ValueError(
            f"{KEY}={spec!r}: importing {path} failed: {type(err).__name__}: {err}"
        ) from err
    return module


def _import(spec: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as err:
        raise ValueError(
            f"{KEY}={spec!r}: importing module {target!r} failed: {type(err).__name__}: {err}"
        ) from err
