"""Command-line overrides of ``python -m recipe``, checked before Hydra composes them.

Hydra composes the config before ``main`` runs and answers a bad override with a multi-line
message and exit code 1. ``check_command_line`` runs first and turns every bad override into
one ``OverrideError`` (a ``ValueError``: one line on stderr, exit code 2, like the rest of the
bad-input checks):

    argv --Hydra's argparser--> overrides --OverridesParser--> Override objects
      our keys:  unknown key     --> verl's name? (recipe.utils.verl_keys) else closest keys
                 known key       --> value assigned to the typed schema (wrong type, list)
                 mode=<preset>   --> one of the presets in configs/mode/
      the rest:  a compose of the whole config (Hydra's own keys, ``+``/``++``/``~``, sweeps
                 without --multirun ...) whose failure is condensed to one line

Hydra's keys (``hydra.*``, ``hydra/...``) and what ``+``, ``++`` and ``~`` may do stay
Hydra's rules; only its refusal is reworded. Keys under a ``dict`` or ``Any`` field of the
schema are free-form and left to Hydra too. Command lines that change the config tree
(``--config-path``, ``--config-name``, ``--config-dir``, ``--experimental-rerun``) or only ask
for help are left to Hydra unchecked; with ``--multirun`` the compose step is skipped (sweeps
cannot compose). The argv parser is Hydra's own (``hydra._internal.utils``, what
``hydra.main`` runs), so flags are read exactly as Hydra reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from collections.abc import Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from recipe.utils.verl_keys import verl_hint

MAX_SUGGESTIONS = 3
"""Closest keys named for an unknown key."""
LEAF_BONUS = 0.25
"""Ranks ``actor.lr`` above ``trainer.seed`` for ``trainer.lr``, not above ``logger.backends``
for ``logger.backend``."""
GRAMMAR_URL = "https://hydra.cc/docs/advanced/override_grammar/basic"
_UNCHECKED_FLAGS = (  # attributes of Hydra's parsed argv; any set: Hydra alone reads it
    "help",
    "hydra_help",
    "shell_completion",
    "config_path",
    "config_name",
    "config_dir",
    "experimental_rerun",
    "info",
)


class OverrideError(ValueError):
    """A command-line override Hydra would refuse. The message names the key."""


def schema_keys(schema: type, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of a dataclass schema (sections too) -> its type annotation."""
    keys: dict[str, Any] = {}
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        key = prefix + field.name
        keys[key] = hints[field.name]
        if dataclasses.is_dataclass(hints[field.name]):
            keys.update(schema_keys(hints[field.name], key + "."))
    return keys


def closest_keys(key: str, known: Sequence[str]) -> list[str]:
    """Up to ``MAX_SUGGESTIONS`` known keys close to ``key`` (by similarity of the dotted
    key, a key with the same last part ranked up); never a section that contains ``key``."""
    leaf = key.rsplit(".", 1)[-1]
    by_leaf: dict[str, list[str]] = {}
    for k in known:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    close_leaves = difflib.get_close_matches(leaf, list(by_leaf), n=MAX_SUGGESTIONS, cutoff=0.75)
    candidates = {k for name in close_leaves for k in by_leaf[name]}
    candidates.update(difflib.get_close_matches(key, known, n=MAX_SUGGESTIONS, cutoff=0.6))
    candidates = {k for k in candidates if not key.startswith(k + ".")}

    def rank(k: str) -> float:
        same_leaf = k.rsplit(".", 1)[-1] == leaf
        return difflib.SequenceMatcher(None, key, k).ratio() + LEAF_BONUS * same_leaf

    return sorted(candidates, key=rank, reverse=True)[:MAX_SUGGESTIONS]


def check_command_line(argv: Sequence[str], schema: type, config_dir: Path) -> None:
    """Raise ``OverrideError`` for the first override of ``argv`` (``sys.argv[1:]`` of a Hydra
    app over ``schema``, presets in ``config_dir``) that Hydra would refuse."""
    args = _parse_hydra_args(argv)
    if args is None or any(getattr(args, flag) for flag in _UNCHECKED_FLAGS):
        return
    parser = OverridesParser.create()
    overrides = []
    for line in args.overrides:
        try:
            overrides.append(parser.parse_override(line))
        except HydraException as exc:
            reason = _one_line(exc, with_cause=False)
            raise OverrideError(f"{line!r} is not an override: {reason} ({GRAMMAR_URL})") from exc
    _OverrideChecker(schema, config_dir).check_all(overrides)
    if not args.multirun:
        _compose(config_dir, args.overrides)


def _parse_hydra_args(argv: Sequence[str]) -> argparse.Namespace | None:
    """Hydra's own command-line parser (what ``hydra.main`` runs); None when it refuses
    ``argv`` or only prints its version, which Hydra then does itself."""
    from hydra._internal.utils import get_args_parser

    if "--version" in argv:
        return None
    parser = get_args_parser()

    def refuse(message: str) -> typing.NoReturn:
        raise argparse.ArgumentError(None, message)

    parser.error = refuse  # type: ignore[method-assign]
    try:
        return parser.parse_args(list(argv))
    except argparse.ArgumentError:
        return None


class _OverrideChecker:
    """Checks overrides of our own keys against the typed schema, in command-line order."""

    def __init__(self, schema: type, config_dir: Path) -> None:
        self.keys = schema_keys(schema)
        self.root = OmegaConf.structured(schema)
        """The schema's defaults; each checked value is assigned here, as Hydra does."""
        self.groups = {d.name: d for d in config_dir.iterdir() if d.is_dir()}
        """Config groups (``mode``): their values are preset names, not schema values."""

    def check_all(self, overrides: Sequence[Override]) -> None:
        for override in overrides:
            key = override.key_or_group
            if override.is_hydra_override() or override.package is not None:
                continue
            if self._free_form(key):
                continue
            if key in self.groups:
                self._check_group(override)
            elif key not in self.keys:
                self._unknown_key(override)
            elif not (override.is_delete() or override.is_sweep_override()):
                self._check_value(override)

    def _free_form(self, key: str) -> bool:
        """``key`` lies under a field typed ``dict`` or ``Any``, whose keys the schema lacks."""
        parts = key.split(".")
        for end in range(1, len(parts)):
            annotation = self.keys.get(".".join(parts[:end]))
            if annotation is Any or dict in (annotation, typing.get_origin(annotation)):
                return True
        return False

    def _check_group(self, override: Override) -> None:
        options = sorted(p.stem for p in self.groups[override.key_or_group].glob("*.yaml"))
        value = override.value()
        if override.is_sweep_override() or override.is_delete() or value in options:
            return
        allowed = ", ".join(repr(o) for o in options)
        raise OverrideError(
            f"{override.key_or_group}={value!r} is invalid: allowed one of {allowed}"
        )

    def _unknown_key(self, override: Override) -> None:
        key = override.key_or_group
        hint = verl_hint(key, _value_text(override), self.keys)
        if hint is not None:
            raise OverrideError(hint)
        suggestions = closest_keys(key, list(self.keys))
        if suggestions:
            where = "did you mean " + ", ".join(suggestions) + "?"
        else:
            sections = [k for k in self.keys if "." not in k]
            where = "the top-level keys are " + ", ".join(sections)
        raise OverrideError(
            f"unknown key {key!r} in {override.input_line!r}: {where} "
            "(python -m recipe --cfg job lists every key)"
        )

    def _check_value(self, override: Override) -> None:
        key = override.key_or_group
        try:
            OmegaConf.update(self.root, key, override.value(), merge=True)
        except OmegaConfBaseException as exc:
            expected = _type_name(self.keys[key])
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise OverrideError(
                f"{key}={override.value()!r} is invalid: expected {expected} ({reason})"
            ) from exc


def _type_name(annotation: Any) -> str:
    """``int | None`` -> 'an integer or null', ``list[str]`` -> 'a list, like [a,b]' ..."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, UnionType):
        args = typing.get_args(annotation)
        names = [_type_name(a) for a in args if a is not NoneType]
        return " or ".join(names) + (" or null" if NoneType in args else "")
    if origin in (list, tuple):
        return "a list, like [a,b]"
    if dataclasses.is_dataclass(annotation):
        return "a section, like {key: value}"
    scalars: dict[Any, str] = {int: "an integer", float: "a number", bool: "true or false",
                               str: "a string"}  # fmt: skip
    return scalars.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _value_text(override: Override) -> str:
    """The value as typed on the command line (``a.b=VALUE``)."""
    line = override.input_line or ""
    return line.split("=", 1)[1] if "=" in line else ""


def _compose(config_dir: Path, overrides: list[str]) -> None:
    """Compose the whole config as ``hydra.main`` will; a failure becomes one line."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise OverrideError(_one_line(exc)) from exc


def _one_line(exc: BaseException, *, with_cause: bool = True) -> str:
    """Hydra's multi-line message and its cause's first line, on one line."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    text = " ".join(ln for ln in lines if ln and not ln.startswith("See https://hydra.cc"))
    cause = exc.__cause__
    if with_cause and cause is not None and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0]})"
    return text
