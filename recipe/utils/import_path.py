"""Load a user object (a function, a class) named in the config by an import path.

Two spellings, as users of verl's ``custom_reward_function`` expect:

- ``path/to/file.py:name``: the file is loaded as a module (relative paths from the working
  directory); nothing needs to be installed.
- ``package.module:name``: imported the normal way (it must be on ``sys.path``).

Every failure is a ``ValueError`` that names the config key and, for an import failure,
carries the original error text, since the user's file is where the fix is.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

FORMAT_HINT = "'path/to/file.py:{kind}' or 'package.module:{kind}'"


def split_spec(key: str, spec: str, kind: str = "name") -> tuple[str, str]:
    """``(module_or_file, attribute)`` of ``spec``; ``ValueError`` naming ``key`` if bad."""
    hint = FORMAT_HINT.format(kind=kind)
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"{key}={spec!r} is invalid: allowed {hint}")
    # rpartition: the attribute never holds ':', a (Windows) path may.
    target, _, name = spec.rpartition(":")
    target, name = target.strip(), name.strip()
    if not target or not name.isidentifier():
        raise ValueError(
            f"{key}={spec!r} is invalid: allowed {hint} ({kind} must be a Python name)"
        )
    return target, name


def load_attribute(key: str, spec: str, kind: str = "name") -> tuple[ModuleType, Any]:
    """``(module, attribute)`` named by ``spec``; the error lists the module's public names
    of that kind (functions for ``kind="function"``, classes for ``kind="class"``)."""
    target, name = split_spec(key, spec, kind)
    module = (
        _load_file(key, spec, target) if _is_file_target(target) else _import(key, spec, target)
    )
    if not hasattr(module, name):
        want_class = kind == "class"
        available = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value)
            and not attr.startswith("_")
            and isinstance(value, type) == want_class
        )
        plural = "classes" if want_class else "functions"
        raise ValueError(
            f"{key}={spec!r}: {target} has no attribute {name!r} "
            f"(its {plural}: {', '.join(available) or 'none'})"
        )
    return module, getattr(module, name)


def _is_file_target(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def _load_file(key: str, spec: str, target: str) -> ModuleType:
    path = os.path.abspath(os.path.expanduser(target))
    if not os.path.isfile(path):
        raise ValueError(f"{key}={spec!r}: file not found: {path}")
    # A unique, stable module name per file: two files named reward.py must not collide, and
    # registering in sys.modules lets dataclasses/pickle inside the file resolve the module.
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    module_name = f"recipe_user_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{key}={spec!r}: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise ValueError(
            f"{key}={spec!r}: importing {path} failed: {type(err).__name__}: {err}"
        ) from err
    return module


def _import(key: str, spec: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as err:
        raise ValueError(
            f"{key}={spec!r}: importing module {target!r} failed: {type(err).__name__}: {err}"
        ) from err
