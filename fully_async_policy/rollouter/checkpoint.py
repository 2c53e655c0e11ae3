"""The rollouter's checkpoint: ``take_snapshot`` inside a sync, ``load_snapshot`` before ``run()``.

Checkpoints use a sync's pause (sync.py): the snapshot, taken after the push and before
``end_sync``, is then the rollouter's whole state (what it holds: snapshot.py); the trainer
writes it under the checkpoint (``ROLLOUTER_STATE_FILE``). A resumed run's rollouter loads it
before ``run()``, and the trainer replays ``end_sync`` as after the push the checkpoint
followed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fully_async_policy.deadlines import bounded
from fully_async_policy.messages import ROLLOUTER_STATE_FILE
from fully_async_policy.rollouter.snapshot import StreamBook
from fully_async_policy.rollouter.states import RolloutState
from fully_async_policy.rollouter.sync import RolloutSync
from recipe.checkpoint.rng import capture_rng, restore_rng
from recipe.checkpoint.store import RUN_STATE_DIR

if TYPE_CHECKING:
    from fully_async_policy.rollouter.clients import QueueProducer

logger = logging.getLogger(__name__)


async def take_snapshot(
    sync: RolloutSync, queue: QueueProducer, *, cut_episodes: bool
) -> dict[str, Any]:
    """The rollouter's checkpoint state (snapshot.py), taken while PAUSED for a sync, after
    the push and before ``end_sync``. Single responses: nothing generates (admission is held,
    partials wait for ``end_sync``), so it is complete. Episodes (``rollout.multi_turn``) go on
    in the workers through a sync (their environment steps are never cut; the push resumed
    the engines). When their environment saves its state (``cut_episodes``), the engines are
    paused again and each episode is cut where it next waits for them (after the environment
    step it may be in: at most ``step_timeout_s``); its group comes back as a partial carrying
    that state, resumed at ``end_sync`` like any partial. Else their groups are recorded as
    ``restart``: a resume admits those prompts again, generated from scratch, while this run
    goes on with them.

    Consistency: no put into the queue starts while the queue is read, and everything else is
    read in one go after it, so a group that finishes meanwhile is either in ``restart`` (still
    generating then) or among the releases, never both or neither."""
    stream, book = sync.stream, sync.book
    if cut_episodes:
        # The push resumed the engines (admission stays held until end_sync): pause them
        # again so that every episode comes to wait for them, then cut it there.
        await sync.replicas.pause_all()
        await sync.replicas.cut_episodes_all()
        what = f"snapshot: {len(stream.in_flight)} prompt groups of episodes being cut"
        await bounded(stream.quiet(), sync.deadlines.cut_back, what)
    if sync.state is not RolloutState.PAUSED:
        raise RuntimeError(f"snapshot() while {sync.state.name}: take it inside a sync")
    if stream.num_generating and not sync.pause_policy.keeps_episodes:
        raise RuntimeError(f"snapshot() with {stream.num_generating} groups generating")
    async with stream.puts_held():
        seen = list(book.releases)  # the head may be put (and popped) meanwhile
        read = queue.snapshot()
        queued = await bounded(read, sync.deadlines.answer, "snapshot: reading the queue")
        live = {t.ticket: t for t in sync.admission.unreleased()}
        restart = [live[k] for k in sorted(set(stream.in_flight) - set(stream.judging))]
        judging = [stream.judging[k] for k in sorted(stream.judging)]
        return book.state_dict(queued, seen, restart, judging) | {"rng": capture_rng()}


def load_snapshot(book: StreamBook, checkpoint: str) -> None:
    """Load ``take_snapshot``'s state from ``checkpoint`` into ``book`` and this process's
    RNG (before ``run()``)."""
    path = Path(checkpoint) / RUN_STATE_DIR / ROLLOUTER_STATE_FILE
    state = json.loads(path.read_text(encoding="utf-8"))
    restart = book.load_state_dict(state)
    restore_rng(state["rng"])
    if restart:
        logger.info(
            "%d prompt groups were generating episodes at the checkpoint; episodes are "
            "not resumed mid-way, so these prompts start again from scratch (counted in "
            "prompts/readmitted)",
            len(restart),
        )
    logger.info(
        "rollouter restored: %d admitted, %d partial groups, %d finished groups to train",
        book.admission.num_admitted,
        len(book.partials),
        len(book.releases),
    )
