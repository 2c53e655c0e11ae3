"""Waits on Ray actors that never answer end at their deadlines: fully_async's wait for a batch
(a queue with no groups, a rollouter whose engines hang) and the engines' load of a resumed
run's weights (seconds; no engine starts).

The engine-level version of these faults (a SIGSTOPped vLLM core) is the nightly
tests/integration/test_hangs.py, where the stop usually lands in a push instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fully_async_policy.driver.clients import QueueClient, RolloutClient
from fully_async_policy.driver.feed import RolloutFeed
from recipe.faults import RunFailure
from recipe.utils.weights_file import WeightsFile
from recipe.workers.rollout.client import ReplicaClient
from recipe.workers.rollout.replicas import RolloutReplicas
from tests.helpers.in_process import fully_async_config

pytestmark = pytest.mark.integration


class _Silent:
    """The queue and the rollouter at once: every wait hangs; the rollouter still says which
    replicas have groups generating (``answers=False``: it does not answer that either)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers

    async def get_batch(self, num_groups: int) -> None:
        await asyncio.sleep(3600)

    async def wait_replica_request(self) -> None:
        await asyncio.sleep(3600)

    async def run(self) -> None:
        await asyncio.sleep(3600)

    async def busy_replicas(self) -> list[int]:
        if not self.answers:
            await asyncio.sleep(3600)
        return [0, 2]


def _feed_waiting_on(silent, timeout_s: float) -> RolloutFeed:
    """The fully async trainer's feed (fully_async_policy/driver/feed.py) on the silent actor."""
    cfg = fully_async_config(**{"rollout.generation_timeout_s": timeout_s})
    tracer = SimpleNamespace(span=lambda *a, **k: contextlib.nullcontext())
    feed = RolloutFeed(
        cfg, RolloutClient(silent), QueueClient(silent), None, tracer=tracer, run_dir=Path(".")
    )  # type: ignore[arg-type]
    feed.start()
    return feed


@pytest.mark.parametrize(
    ("answers", "named"),
    [
        (True, "replica(s) 0, 2"),
        # nightly: it waits out the 10 s the trainer gives the rollouter to answer
        pytest.param(False, "replica(s) ?", marks=pytest.mark.nightly),
    ],
)
def test_a_batch_that_never_comes_stops_the_run_within_the_deadline_naming_the_replicas(
    ray_for_module, answers, named
):
    silent = ray_for_module.remote(_Silent).remote(answers)
    # The clock starts once the actor is up: a worker's start (seconds on a busy machine) is
    # not part of the wait under test.
    ray_for_module.get(silent.__ray_ready__.remote(), timeout=120)
    feed = _feed_waiting_on(silent, timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RunFailure) as caught:
        feed.take(4, version=0)
    took_s = time.monotonic() - start
    message = str(caught.value)
    assert "no batch of 4 prompt groups within rollout.generation_timeout_s=1 s" in message
    assert named in message and "hung engine process" in message
    # the deadline, plus at most the 10 s the trainer gives the rollouter to name replicas
    assert took_s < (4.0 if answers else 15.0), took_s
    ray_for_module.kill(silent)


class _Loader:
    """A rollout worker's weights load: done at once, or never (a hung engine)."""

    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs

    async def update_weights_from_file(
        self, path: str, version: int, *, sha256: str | None
    ) -> None:
        if self.hangs:
            await asyncio.sleep(3600)


@pytest.mark.timeout(120)
def test_a_resumed_runs_weights_load_that_never_ends_fails_within_the_deadline_naming_it(
    ray_for_module,
):
    loaders = [ray_for_module.remote(_Loader).remote(hangs) for hangs in (False, True)]
    ray_for_module.get([w.__ray_ready__.remote() for w in loaders], timeout=60)
    replicas = RolloutReplicas.__new__(RolloutReplicas)  # the actors above as its replicas
    replicas.workers = [ReplicaClient(loader) for loader in loaders]
    replicas.cfg = SimpleNamespace(start_timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RunFailure) as caught:
        replicas.update_weights_from_file(WeightsFile("/run/.weights/v3", 4, "ab12"), 3)
    assert time.monotonic() - start < 10
    assert str(caught.value).startswith(
        "rollout replica(s) 1 did not load the weights of version 3 within "
        "rollout.start_timeout_s=1 s"
    )
    for loader in loaders:
        ray_for_module.kill(loader)
