"""``python -m one_step_off [key=value ...]``: ``python -m recipe mode=one_step_off``.

The same entry, config tree and run directory as ``python -m recipe`` (recipe/launch.py); only
the mode preset is fixed (a ``mode=`` given on the command line is refused, not silently
overridden).
"""

from typing import Any

from recipe.launch import launch


def _recipe(mode: str) -> Any:
    from one_step_off.trainer import (
        OneStepOffTrainer,  # lazily: a bad command line fails before Ray and torch load
    )

    return OneStepOffTrainer


if __name__ == "__main__":
    launch(_recipe, mode="one_step_off", program="python -m one_step_off")
