"""Session fixtures shared by every test, and the rule that skips ``gpu`` tests without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The embedded default model, built once per cache (``$RECIPE_CACHE_DIR``) and reused."""
    from recipe.tiny import ensure_tiny_model

    return ensure_tiny_model()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # keep torch out of runs that do not need it
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
