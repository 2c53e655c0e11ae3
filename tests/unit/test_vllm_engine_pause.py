"""The engine pause a vLLM rollout worker takes after the adapter probe, without an engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from recipe.workers.rollout.vllm_engine import VLLMEngineControl


class Control(VLLMEngineControl):
    """The engine half alone: no worker around it (nothing here generates)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    async def _generate_group(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing generates here")


def _engine(calls: list[tuple[str, str, bool]], *, scheduler: bool) -> SimpleNamespace:
    async def pause_generation(*, mode: str = "abort", clear_cache: bool = True) -> None:
        calls.append(("pause_generation", mode, clear_cache))

    async def pause_scheduler_async(*, mode: str, clear_cache: bool) -> None:
        calls.append(("scheduler", mode, clear_cache))

    engine = SimpleNamespace(pause_generation=pause_generation)
    if scheduler:
        engine.engine_core = SimpleNamespace(pause_scheduler_async=pause_scheduler_async)
    return engine


def test_the_scheduler_pauses_again_without_vllm_s_cache_clear_and_sleep():
    calls: list[tuple[str, str, bool]] = []
    asyncio.run(Control(_engine(calls, scheduler=True))._pause_idle_engine())
    assert calls == [("scheduler", "abort", False)]


def test_an_engine_without_a_scheduler_pause_is_paused_the_usual_way():
    calls: list[tuple[str, str, bool]] = []
    asyncio.run(Control(_engine(calls, scheduler=False))._pause_idle_engine())
    assert calls == [("pause_generation", "abort", True)]
