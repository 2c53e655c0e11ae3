"""Checkpoint state of the fully async recipe: what exists only in memory between two syncs.

A checkpoint is taken at a sync boundary: after the push, before ``end_sync`` resumes
generation. Nothing generates then, so the rollouter's whole state is

    cursor            where fresh prompts continue (epoch, offset)
    admission         window, allowance, counters, live tickets, held (finished) groups
    partials          groups cut by the pause: tokens, per-token versions and log-probs so far
                      (multi-turn episodes cut for the checkpoint also carry their agent
                      state: counters and the environment's ``state_dict``)
    restart           prompts whose episodes were in flight and cannot be saved (their
                      environment has no state hooks): admitted again on resume
    num_resumes       pauses each partial group went through
    deferred          re-admissions waiting for the window to open
    releases          finished groups not yet trained: the message queue's contents, then
                      the release order's (deduplicated by ticket: a put may land between
                      the two reads)
    rng               the rollouter process's RNG

and the trainer's is its step, version, trained prompt uids and run totals. A resumed run
loads both and replays ``end_sync(version)``: the window opens with the restored counters,
the partials resume on the same weights, the queue refills in its old order, so every
admitted prompt is trained once and the staleness bound (admission.py) holds across it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fully_async_policy.admission import AdmissionController, Ticket
from fully_async_policy.messages import PromptGroup
from recipe.checkpoint.codec import decode_trajectory, encode_trajectory
from recipe.data.cursor import PromptCursor
from recipe.protocol import Trajectory


def encode_ticket(ticket: Ticket) -> list[Any]:
    return [ticket.ticket, ticket.uid, ticket.window]


def decode_ticket(data: list[Any]) -> Ticket:
    number, uid, window = data
    return Ticket(int(number), str(uid), int(window))


def encode_group(group: PromptGroup) -> dict[str, Any]:
    return {
        "ticket": group.ticket,
        "window": group.window,
        "num_resumes": group.num_resumes,
        "trajectories": [encode_trajectory(t) for t in group.trajectories],
    }


def decode_group(data: dict[str, Any]) -> PromptGroup:
    trajs = [decode_trajectory(t) for t in data["trajectories"]]
    return PromptGroup(data["ticket"], data["window"], trajs, data["num_resumes"])


def merge_releases(queued: list[PromptGroup], releases: list[PromptGroup]) -> list[PromptGroup]:
    """Finished, untrained groups in the order the trainer gets them: the queue's, then the
    release order's not already in the queue (read first, so a put may have landed since)."""
    in_queue = {g.ticket for g in queued}
    return list(queued) + [g for g in releases if g.ticket not in in_queue]


def encode_partials(partials: list[tuple[Ticket, list[Any]]]) -> list[list[Any]]:
    return [[encode_ticket(t), [encode_trajectory(x) for x in trajs]] for t, trajs in partials]


def decode_partials(data: list[list[Any]]) -> list[tuple[Ticket, list[Any]]]:
    return [(decode_ticket(t), [decode_trajectory(x) for x in trajs]) for t, trajs in data]


@dataclass
class StreamBook:
    """The rollouter's bookkeeping between syncs: everything of the module docstring's list
    but the RNG (``state_dict`` also takes what only a sync can read: the queue's contents and
    the groups still generating)."""

    cursor: PromptCursor
    admission: AdmissionController[PromptGroup]
    partials: list[tuple[Ticket, list[Trajectory]]] = field(default_factory=list)
    """Groups cut by a pause, resumed at ``end_sync``."""
    num_resumes: dict[int, int] = field(default_factory=dict)
    """Pauses each partial group went through, by ticket."""
    deferred: list[Ticket] = field(default_factory=list)
    """Re-admissions that came while admission was held; started at ``end_sync``."""
    releases: deque[PromptGroup] = field(default_factory=deque)
    """Finished groups in release order, not yet put into the queue."""

    def state_dict(
        self,
        queued: list[PromptGroup],
        seen: list[PromptGroup],
        restart: list[Ticket],
        judging: Sequence[tuple[Ticket, list[Trajectory]]] = (),
    ) -> dict[str, Any]:
        """The checkpoint's state: ``queued``, the queue's contents, read after ``seen`` (the
        releases before that read; a put may land between the two); ``restart``: the tickets
        of groups still generating (episodes that cannot be saved); ``judging``: groups
        generated and awaiting their reward, kept as partials (a resume passes them through
        the engines unchanged and scores them again)."""
        pending = {g.ticket: g for g in [*seen, *self.releases]}
        return {
            "cursor": self.cursor.state_dict(),
            "admission": self.admission.state_dict(encode_group),
            "partials": encode_partials([*self.partials, *judging]),
            "num_resumes": {str(k): v for k, v in self.num_resumes.items()},
            "deferred": [encode_ticket(t) for t in self.deferred],
            "restart": [encode_ticket(t) for t in restart],
            "releases": [encode_group(g) for g in merge_releases(queued, list(pending.values()))],
        }

    def load_state_dict(self, state: dict[str, Any]) -> list[Ticket]:
        """Load ``state_dict``'s output; the ``restart`` prompts are admitted again (deferred:
        they start at ``end_sync``). Returns those restarted tickets."""
        self.cursor.load_state_dict(state["cursor"])
        self.admission.load_state_dict(state["admission"], decode_group)
        self.partials = decode_partials(state["partials"])
        self.num_resumes = {int(k): v for k, v in state["num_resumes"].items()}
        self.deferred = [decode_ticket(t) for t in state["deferred"]]
        self.releases = deque(decode_group(g) for g in state["releases"])
        restart = [decode_ticket(t) for t in state.get("restart", [])]
        for ticket in restart:
            self.deferred.append(self.admission.readmit(ticket.ticket, ticket.uid))
        return restart
