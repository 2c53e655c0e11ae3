"""The fully async trainer's pull of the rollouter's trace events (``RolloutFeed.pull_trace``),
with a fake rollouter and its own waits: a drain that failed is raised once, and the next pull
asks for a new one instead of raising on the same ref for the rest of the run."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.feed import RolloutFeed
from recipe.config import load_config
from recipe.observability.trace import Tracer


class _Refs:
    """What ``rollouter.drain_trace.remote()`` hands out: numbered refs; ``bad`` ones fail."""

    def __init__(self, bad: set[int]) -> None:
        self.counter, self.bad = itertools.count(), bad
        self.drain_trace = self

    def remote(self) -> int:
        return next(self.counter)


class _Waits:
    """Every ref is ready; getting a ``bad`` one raises."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def get(self, ref: int, *, timeout: float | None = None) -> Any:
        if ref in self.bad:
            raise RuntimeError(f"drain {ref} failed")
        return [{"name": f"event of drain {ref}"}]

    def first_ready(self, refs: list[int], *, timeout: float | None) -> list[int]:
        return list(refs)


def test_a_failed_drain_is_raised_once_and_the_next_pull_asks_again():
    bad = {1}
    rollouter = RolloutClient(_Refs(bad), _Waits(bad))
    cfg = load_config(OmegaConf.create({"mode": "fully_async"}))
    feed = RolloutFeed(
        cfg, rollouter, QueueClient(None), None, tracer=Tracer(0, None), run_dir=Path(".")
    )  # type: ignore[arg-type]
    assert feed.pull_trace(wait=False) == []  # asks for drain 0
    assert feed.pull_trace(wait=False) == [{"name": "event of drain 0"}]  # asks for 1
    with pytest.raises(RuntimeError, match="drain 1 failed"):
        feed.pull_trace(wait=False)
    assert feed.pull_trace(wait=False) == []  # asks for drain 2, not 1 again
    assert feed.pull_trace(wait=True) == [
        {"name": "event of drain 2"}, {"name": "event of drain 3"}
    ]  # fmt: skip
