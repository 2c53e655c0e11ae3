"""The one command-line entry every ``python -m`` of the project goes through.

    launch(recipe_for, mode=None)
      check the overrides (an unknown key, verl's name for a key, a value of the wrong type:
      recipe/utils/overrides.py)                                         bad: exit code 2
      Hydra composes configs/config.yaml (the mode preset picks the recipe) and the overrides
      load_config validates everything before Ray starts                bad: exit code 2
      recipe_for(cfg.mode)(cfg, run_dir) -> fit -> close (always)
      a fault that ended the run (recipe/faults.py): one line naming it  exit code 1

``recipe_for`` maps a mode to its recipe class: ``python -m recipe`` passes the table of every
mode (recipe/main.py); ``python -m one_step_off`` and ``python -m fully_async_policy`` fix
``mode`` and pass their own. Set ``RECIPE_DEBUG=1`` for full tracebacks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipe.config import RecipeConfig, load_config, register_configs
from recipe.faults import RunFailure
from recipe.model import model_provenance
from recipe.utils.overrides import check_command_line

register_configs()  # the schema node configs/config.yaml starts from
# Absolute: `python -m recipe` makes Hydra resolve a relative path as a Python package.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

RecipeFor = Callable[[str], Callable[[RecipeConfig, Path], Any]]
"""mode -> the recipe class (built with the config and the run directory; has fit, close)."""


def _debug() -> bool:
    return os.environ.get("RECIPE_DEBUG", "0") not in ("", "0")


def _exit_bad_input(exc: ValueError) -> NoReturn:
    """Bad input: one line and exit code 2 (``RECIPE_DEBUG=1``: the traceback)."""
    if _debug():
        raise exc
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def launch(recipe_for: RecipeFor, *, mode: str | None = None, program: str = "") -> None:
    """Run the command line (``sys.argv``) as described in the module docstring; ``mode``
    fixes the mode preset of ``program`` (a ``mode=`` on its command line is refused, not
    silently overridden)."""
    if mode is not None:
        if any(arg.startswith("mode=") for arg in sys.argv[1:]):
            _exit_bad_input(ValueError(f"{program} runs mode={mode}; drop the mode= key"))
        sys.argv.insert(1, f"mode={mode}")
    try:
        check_command_line(sys.argv[1:], RecipeConfig, CONFIG_DIR)
    except ValueError as exc:
        _exit_bad_input(exc)

    @hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="config")
    def main(dict_cfg: DictConfig) -> None:
        run(dict_cfg, recipe_for)

    main()


def save_run_config(cfg: RecipeConfig, path: Path) -> None:
    """The resolved config, plus ``model_provenance`` (package, version, sha256 of a built
    model's GGUF) when ``model.path`` names a built model, which is built now if need be."""
    record = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(record, dict)
    provenance = model_provenance(cfg.model)
    if provenance is not None:
        record["model_provenance"] = provenance
    OmegaConf.save(OmegaConf.create(record), path)


def run(dict_cfg: DictConfig, recipe_for: RecipeFor) -> None:
    """One run of the composed config ``dict_cfg`` (Hydra's run directory is current)."""
    try:
        # Bad input (config, model path, data, reward fn) surfaces here, before any training:
        # one line and exit code 2. Errors raised later are bugs and keep their traceback.
        cfg = load_config(dict_cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        save_run_config(cfg, run_dir / "config.yaml")
        recipe = recipe_for(cfg.mode)(cfg, run_dir)
    except ValueError as exc:
        _exit_bad_input(exc)
    failure: RunFailure | None = None
    try:
        recipe.fit()
    except RunFailure as exc:  # a fault ended the run: one line once everything is closed
        if _debug():
            raise
        failure = exc
    finally:
        recipe.close()
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        sys.exit(1)
