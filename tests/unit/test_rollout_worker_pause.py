"""A rollout worker's pause as its callers meet it (recipe/workers/rollout/base.py): a
``generate`` call that arrives while the worker is paused waits for the resume, unless
``cut_episodes`` (the run stopping) ends the wait or the call is ``cut_if_paused`` (the fully
async rollouter with partial rollout), which return the group unstarted at once.
Ray does not order an async actor's calls, so a group sent before a stop's pause may arrive
after it; the stop must not wait for a resume that comes only after the group."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from fully_async_policy.rollouter.pause_policy import PausePolicy
from recipe.workers.rollout.requests import GenerationRequest, GroupRequest
from tests.helpers.fake_engines import ScriptedWorker
from tests.helpers.in_process import fully_async_config

REQUEST = GenerationRequest("p0", [5, 6], n=3, max_tokens=8)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_a_call_that_arrives_during_a_pause_waits_for_the_resume():
    async def scenario():
        worker = ScriptedWorker()
        await worker.pause()
        call = asyncio.create_task(worker.generate(REQUEST))
        await asyncio.sleep(0.05)
        assert not call.done() and worker.num_requests == 0  # waiting, not generating
        await worker.resume()
        return await call

    trajs = _run(scenario())
    assert [t.sample_index for t in trajs] == [0, 1, 2]
    assert all(t.finish_reason in ("stop", "length") and t.response_ids for t in trajs)


def test_a_cut_returns_waiting_and_later_calls_unstarted_until_the_resume():
    async def scenario():
        worker = ScriptedWorker()
        first = await worker.generate(REQUEST)  # some finished responses to resume from
        await worker.pause()
        waiting = asyncio.create_task(worker.generate(REQUEST))
        await asyncio.sleep(0.05)
        await worker.cut_episodes()
        cut = await waiting
        partial = [first[0], dataclasses.replace(first[1], finish_reason="aborted")]
        resumed = GenerationRequest("p0", [5, 6], n=2, max_tokens=8, resume=partial[::-1])
        later = await worker.generate(resumed)  # after the cut, before the resume: at once
        await worker.resume()
        again = await worker.generate(REQUEST)
        return worker, cut, partial, later, again

    worker, cut, partial, later, again = _run(scenario())
    assert [t.sample_index for t in cut] == [0, 1, 2]
    assert all(t.finish_reason == "aborted" and not t.response_ids for t in cut)
    assert all(t.prompt_ids == [5, 6] and t.prompt_uid == "p0" for t in cut)
    assert later == partial  # what it resumes, as it was, ordered by sample index
    assert worker.num_requests == 2  # the first call and the last: the cut ones generated nothing
    assert all(t.finish_reason != "aborted" for t in again)


def test_a_call_the_pause_overtook_comes_back_unstarted_when_its_caller_resumes_cut_groups():
    async def scenario():
        worker = ScriptedWorker()
        await worker.pause()
        cut = dataclasses.replace(REQUEST, cut_if_paused=True)
        unstarted = await worker.generate(cut)  # at once: no resume comes first
        waiting = asyncio.create_task(worker.generate(REQUEST))  # a caller that waits
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await worker.resume()
        return worker, unstarted, await waiting, await worker.generate(cut)

    worker, unstarted, waited, running = _run(scenario())
    assert all(t.finish_reason == "aborted" and not t.response_ids for t in unstarted)
    assert all(t.finish_reason != "aborted" for t in waited + running)
    assert worker.num_requests == 2  # the waiting call and the one on a running worker


@pytest.mark.parametrize("partial", [True, False])
def test_the_rollouter_asks_for_the_cut_only_where_its_pause_cuts_groups(partial):
    """Partial rollout cuts groups at a pause: an overtaken call is cut too. Draining waits for
    every group before pausing (none can be overtaken), and episodes wait in the workers."""
    cfg = fully_async_config(**{"async_training.partial_rollout": partial})
    policy = PausePolicy.of(cfg)
    assert policy is (PausePolicy.CUT if partial else PausePolicy.DRAIN)
    assert policy.cuts_overtaken_calls is partial
    assert not PausePolicy.KEEP_EPISODES.cuts_overtaken_calls
    asked = GroupRequest("p0", [5, 6], 0, 2, 1.0, cut_if_paused=partial)
    assert asked.to_request(cfg.rollout).cut_if_paused is partial
