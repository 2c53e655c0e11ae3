"""The fully async recipe's checkpoint state on its own: the admission controller, the message
queue and the group codec survive a JSON round trip and then behave exactly like the
originals (same allowance, same release order, same staleness bound)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from fully_async_policy.admission import AdmissionController
from fully_async_policy.message_queue import MessageQueue
from fully_async_policy.messages import PromptGroup
from fully_async_policy.rollouter.snapshot import (
    decode_group,
    decode_partials,
    encode_group,
    encode_partials,
    merge_releases,
)
from recipe.protocol import Trajectory
from recipe.run.metrics import RunTotals


def _group(ticket: int, uid: str, window: int, versions=(0, 0)) -> PromptGroup:
    trajs = [
        Trajectory(uid, i, [1, 2], [3, 4], [-0.5, -0.25], list(versions), "stop", reward=1.0 * i)
        for i in range(2)
    ]
    return PromptGroup(ticket, window, trajs, num_resumes=1)


def _drive(ctrl: AdmissionController, rng: random.Random, live: list, steps: int) -> list:
    """Random admits, completions, re-admissions and window changes; returns what each call
    returned, so two controllers fed the same choices can be compared."""
    out = []
    trained = 0
    for _ in range(steps):
        action = rng.random()
        if action < 0.4 and ctrl.can_admit():
            ticket = ctrl.admit(f"p{ctrl.num_admitted}")
            live.append(ticket)
            out.append(("admit", ticket.ticket, ticket.window))
        elif action < 0.75 and live:
            ticket = live.pop(rng.randrange(len(live)))
            released = ctrl.complete(
                ticket.ticket, _group(ticket.ticket, ticket.uid, ticket.window)
            )
            trained += len(released)
            out.append(("complete", [g.ticket for g in released]))
        elif action < 0.8 and live:
            old = live.pop(rng.randrange(len(live)))
            new = ctrl.readmit(old.ticket, old.uid)
            live.append(new)
            out.append(("readmit", new.ticket))
        else:
            out.append(
                ("window", ctrl.open_window(ctrl.window + 1, min(trained, ctrl.num_admitted)))
            )
    return out


def test_a_restored_admission_controller_continues_exactly_like_the_original():
    original = AdmissionController(budget=6, window_demand=4, max_fresh=60)
    old = [original.admit(f"p{i}") for i in range(6)]
    for ticket in old[:4]:
        original.complete(ticket.ticket, _group(ticket.ticket, ticket.uid, 0))
    original.open_window(1, num_trained=4)
    new = [original.admit(f"p{6 + i}") for i in range(4)]
    # Window 1's first group finishes while window 0 has stragglers: it is held back.
    assert original.complete(new[0].ticket, _group(new[0].ticket, new[0].uid, 1)) == []
    live = [old[5], *new[1:], original.readmit(old[4].ticket, old[4].uid)]
    state = json.loads(json.dumps(original.state_dict(encode_group)))

    restored = AdmissionController(budget=6, window_demand=4, max_fresh=60)
    restored.load_state_dict(state, decode_group)
    restored_live = [t for t in restored.unreleased() if t.ticket in {x.ticket for x in live}]
    assert [(t.ticket, t.uid, t.window) for t in restored_live] == sorted(
        (t.ticket, t.uid, t.window) for t in live
    )
    # The same future choices give the same results on both.
    live = sorted(live, key=lambda t: t.ticket)
    expected = _drive(original, random.Random(1), live, 60)
    got = _drive(restored, random.Random(1), restored_live, 60)
    assert got == expected
    assert restored.admitted_uids == original.admitted_uids
    assert (restored.num_released, restored.num_readmitted) == (
        original.num_released,
        original.num_readmitted,
    )


def test_restoring_admission_refuses_another_budget():
    state = AdmissionController(budget=6, window_demand=4, max_fresh=None).state_dict()
    with pytest.raises(ValueError, match="admission budget=6 differs from this run's 8"):
        AdmissionController(budget=8, window_demand=4, max_fresh=None).load_state_dict(state)


def test_queue_snapshot_leaves_the_groups_in_place_in_order():
    async def scenario():
        queue = MessageQueue(capacity=4)
        for i in range(3):
            await queue.put(f"g{i}")
        snap = await queue.snapshot()
        return snap, await queue.get_batch(3), queue.stats()

    snap, batch, stats = asyncio.run(scenario())
    assert snap == batch == ["g0", "g1", "g2"]
    assert stats.num_consumed == 3  # the snapshot took nothing


def test_merging_queue_and_release_order_counts_a_group_that_was_put_in_between_once():
    a, b, c, d = (_group(t, f"p{t}", 0) for t in range(4))
    # Read first: releases [b, c, d]; then b landed in the queue [a, b].
    merged = merge_releases([a, b], [b, c, d])
    assert [g.ticket for g in merged] == [0, 1, 2, 3]


def test_groups_partials_and_totals_round_trip_through_json():
    group = _group(7, "u7", 2, versions=(1, 2))
    back = decode_group(json.loads(json.dumps(encode_group(group))))
    assert back == group and back.min_version == 1
    partials = [(AdmissionController(budget=2, window_demand=1, max_fresh=None).admit("u"), [])]
    partials[0][1].extend(group.trajectories)
    cut = Trajectory("u", 2, [1, 2], [3, 5], [-0.5, 0.0], [1, -1], "aborted", loss_mask=[1, 0])
    cut.agent_state = {"turn": [7], "counts": [1, 1, 1, 0, 0], "environment": {"calls": 1}}
    partials[0][1].append(cut)  # an episode cut for a checkpoint, with its state
    assert decode_partials(json.loads(json.dumps(encode_partials(partials)))) == partials
    totals = RunTotals()
    totals.add(group.trajectories, trainer_version=3)
    assert RunTotals.from_state(json.loads(json.dumps(totals.state_dict()))) == totals
