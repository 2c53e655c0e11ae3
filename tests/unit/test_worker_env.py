"""``worker_env`` (recipe/run/placement.py): the environment every Ray worker inherits."""

from __future__ import annotations

import pytest

from recipe.run.placement import worker_env


def test_workers_keep_vllms_warnings_by_default(monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "unset by the test")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    assert worker_env()["VLLM_LOGGING_LEVEL"] == "WARNING"


@pytest.mark.parametrize("level", ["DEBUG", "ERROR"])
def test_a_vllm_logging_level_the_user_set_is_the_workers(monkeypatch, level):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    assert worker_env()["VLLM_LOGGING_LEVEL"] == level
