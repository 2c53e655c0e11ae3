"""``python -m recipe``: config -> build -> run -> close.

``cli`` first checks the command-line overrides (an unknown key, verl's name for a key, a
value of the wrong type: recipe/utils/overrides.py), then Hydra composes
``configs/config.yaml`` (the mode preset picks the recipe) and the overrides; ``load_config``
validates everything before Ray starts, so a bad value fails in seconds with one line naming
the key (exit code 2; an unwritable run directory too, see recipe/utils/output_dir.py). A
fault that ends a started run (recipe/faults.py) prints one line saying what failed and where
to resume from (exit code 1). Set ``RECIPE_DEBUG=1`` for full tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from recipe.config import RecipeConfig, load_config, register_configs
from recipe.faults import RunFailure
from recipe.utils.overrides import check_command_line

logger = logging.getLogger(__name__)

register_configs()
# Absolute: `python -m recipe` makes Hydra resolve a relative path as a Python package.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def recipe_class(mode: str):
    """The recipe class of a mode (imported lazily: each pulls in Ray and torch)."""
    if mode == "sync":
        from recipe.sync_trainer import SyncTrainer

        return SyncTrainer
    if mode == "one_step_off":
        from one_step_off.trainer import OneStepOffTrainer

        return OneStepOffTrainer
    if mode == "fully_async":
        from fully_async_policy.main import FullyAsyncRecipe

        return FullyAsyncRecipe
    raise ValueError(f"mode={mode!r}: allowed 'sync', 'one_step_off', 'fully_async'")


def _debug() -> bool:
    return os.environ.get("RECIPE_DEBUG", "0") not in ("", "0")


def _exit_bad_input(exc: ValueError) -> NoReturn:
    """Bad input: one line and exit code 2 (``RECIPE_DEBUG=1``: the traceback)."""
    if _debug():
        raise exc
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


def cli() -> None:
    """``python -m recipe [key=value ...]``: the overrides are checked before Hydra runs."""
    try:
        check_command_line(sys.argv[1:], RecipeConfig, CONFIG_DIR)
    except ValueError as exc:
        _exit_bad_input(exc)
    main()


@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="config")
def main(dict_cfg: DictConfig) -> None:
    try:
        # Bad input (config, model path, data, reward fn) surfaces here, before any training:
        # one line and exit code 2. Errors raised later are bugs and keep their traceback.
        cfg = load_config(dict_cfg)
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml", resolve=True)
        recipe = recipe_class(cfg.mode)(cfg, run_dir)
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


if __name__ == "__main__":
    cli()
