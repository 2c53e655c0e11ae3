"""``python -m recipe``: every mode, through the one entry of recipe/launch.py.

    python -m recipe [mode=sync|one_step_off|fully_async] [key=value ...]

``recipe_class`` is the table of modes; each recipe is imported only when its mode runs (each
pulls in Ray and torch, so a bad command line fails first, in seconds).
"""

from __future__ import annotations

from typing import Any

from recipe.launch import launch


def recipe_class(mode: str) -> Any:
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


def cli() -> None:
    """``python -m recipe [key=value ...]``."""
    launch(recipe_class)
