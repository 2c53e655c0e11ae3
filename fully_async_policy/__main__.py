"""``python -m fully_async_policy [key=value ...]``: ``python -m recipe mode=fully_async``.

The same entry, config tree and run directory as ``python -m recipe`` (recipe/launch.py); only
the mode preset is fixed (a ``mode=`` given on the command line is refused, not silently
overridden).
"""

from typing import Any

from recipe.launch import launch


def _recipe(mode: str) -> Any:
    from fully_async_policy.main import (
        FullyAsyncRecipe,  # lazily: a bad command line fails before Ray and torch load
    )

    return FullyAsyncRecipe


if __name__ == "__main__":
    launch(_recipe, mode="fully_async", program="python -m fully_async_policy")
