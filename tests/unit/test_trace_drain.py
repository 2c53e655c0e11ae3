"""The fully async trainer's pull of the rollouter's trace events (``_pull_trace``), with a
fake rollouter and fake Ray refs: a drain that failed is raised once, and the next pull asks
for a new one instead of raising on the same ref for the rest of the run."""

from __future__ import annotations

import itertools

import pytest

from fully_async_policy.clients import RolloutClient
from fully_async_policy.trainer import FullyAsyncTrainer


class _Refs:
    """What ``rollouter.drain_trace.remote()`` hands out: numbered refs; ``bad`` ones fail."""

    def __init__(self, bad: set[int]) -> None:
        self.counter, self.bad = itertools.count(), bad
        self.drain_trace = self

    def remote(self) -> int:
        return next(self.counter)


def test_a_failed_drain_is_raised_once_and_the_next_pull_asks_again(monkeypatch):
    import ray

    rollouter = _Refs(bad={1})

    def fake_get(ref, timeout=None):
        if ref in rollouter.bad:
            raise RuntimeError(f"drain {ref} failed")
        return [{"name": f"event of drain {ref}"}]

    monkeypatch.setattr(ray, "wait", lambda refs, timeout=None: (refs, []))
    monkeypatch.setattr(ray, "get", fake_get)
    trainer = object.__new__(FullyAsyncTrainer)  # only the two fields _pull_trace uses
    trainer.rollouter, trainer._trace_ref = RolloutClient(rollouter), None
    assert trainer._pull_trace(wait=False) == []  # asks for drain 0
    assert trainer._pull_trace(wait=False) == [{"name": "event of drain 0"}]  # asks for 1
    with pytest.raises(RuntimeError, match="drain 1 failed"):
        trainer._pull_trace(wait=False)
    assert trainer._pull_trace(wait=False) == []  # asks for drain 2, not 1 again
    assert trainer._pull_trace(wait=True) == [
        {"name": "event of drain 2"}, {"name": "event of drain 3"}
    ]  # fmt: skip
