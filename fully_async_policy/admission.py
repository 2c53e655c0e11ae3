"""Admission control of the fully async rollouter: how many prompts may start, and in which
order finished groups go to the trainer. Pure bookkeeping (no Ray, no engines), so the
arithmetic is unit tested on its own.

Terms: T = ``trigger_parameter_sync_step``, R = prompts per local step
(``ppo_mini_batch_size * require_batches``), W = T * R prompts trained per version window,
B = floor((1 + staleness_threshold) * W) the admission budget of a window.

Rules::

    open_window(v, trained)   live = admitted - trained          (admitted, not yet trained)
                              allowance(v) = max(0, B - live)     "B minus what is carried over"
    admit(uid)                one fresh prompt, labelled window v, while allowance > 0
    readmit(ticket)           the prompt again, labelled the current window; it takes the old
                              ticket's place, so it needs no allowance and never starves
    complete(ticket, group)   -> groups releasable now, in release order
    filter(ticket)            the group was filtered (dynamic sampling, zero reward variance):
                              the ticket retires unreleased and gives its slot back
                              (allowance + 1), so the window still fills W trainable groups

Release order: a group of window w is released only when every ticket of the windows before
w is released (within a window: completion order). The trainer therefore trains groups in
window order, which gives the staleness bound::

    a group labelled v has at most (v * W + B - 1) trained groups before it (every one
    labelled <= v), so it is trained at version u <= v + floor((B - 1) / W), and its
    oldest token is >= v. Hence  staleness = u - min_version <= floor((B - 1) / W)
    (= 0 for staleness_threshold 0, = 1 for 0 < threshold <= 1, ~ceil(threshold) beyond).

What each step of a window trains follows from the same order. The B - W groups carried over
into window v are the ones of window v - 1 that finished last, and they are released first.
With T = 2 and staleness_threshold = 0.5 (B - W = R, the defaults) every window's first step
trains the previous window's R late finishers (staleness 1, the longest groups, cut by the
push if they were still generating), its second step the window's own R early finishers
(staleness 0). Where the longer answers are the worse ones (cut at the length limit) the
training reward zigzags from step to step (``python -m recipe.tools.study.zigzag RUN_DIR``
measures it). Each window still trains the same groups; shuffling them across its steps
removed the zigzag, changed neither training reward nor validation accuracy at equal samples,
and doubled the trainer's wait (the first step then waits for the window's early finishers),
so the order stays.

No deadlock: at every window start live + allowance >= B >= W, i.e. the trainer's W groups of
the window are admitted; a re-admission replaces its ticket, so it keeps that true.

Filtered groups keep the bound. Take live = admitted - trained - filtered (tickets that may
still be trained). At a window's start live + allowance = B; admit moves one unit from
allowance to live, filter one from live back to allowance, training removes one from live.
So live + allowance <= B throughout the window, and the groups labelled <= v that are ever
trained number at most v * W (trained before window v) + B (live at any point of window v,
each filtered one having left live before its slot was reused): the count above holds.
Filtered prompts do not use up the run's fresh prompts either (``fresh_left``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from recipe.utils.config_check import require_positive

Item = TypeVar("Item")
"""What a finished ticket hands back in release order (the rollouter's ``PromptGroup``)."""


def _same(item: Any) -> Any:
    return item


@dataclass(slots=True)
class Ticket:
    """One admission of one prompt."""

    ticket: int
    """Unique id (re-admissions get a new one)."""
    uid: str
    """The prompt's uid."""
    window: int
    """Version window it was admitted in."""


def window_budget(prompts_per_step: int, sync_every_steps: int, staleness_threshold: float) -> int:
    """B = floor((1 + staleness_threshold) * T * R) prompts per version window."""
    require_positive("prompts per local step", prompts_per_step)
    require_positive("async_training.trigger_parameter_sync_step", sync_every_steps)
    demand = prompts_per_step * sync_every_steps
    # The epsilon keeps e.g. (1 + 0.1) * 10 = 11.000000000000002 -> 11, not a float artefact.
    return max(demand, math.floor((1.0 + staleness_threshold) * demand + 1e-9))


class AdmissionController(Generic[Item]):
    """Window budget, tickets and release order (see the module docstring for the rules)."""

    def __init__(self, *, budget: int, window_demand: int, max_fresh: int | None) -> None:
        """``budget``: B; ``window_demand``: W; ``max_fresh``: fresh prompts in the whole run
        (None: unlimited)."""
        if budget < window_demand:
            raise ValueError(f"admission budget {budget} < window demand {window_demand}")
        self.budget = budget
        self.window_demand = window_demand
        self.max_fresh = max_fresh
        self.window = 0
        self.allowance = budget
        self.num_readmitted = 0
        self.num_released = 0
        self.admitted_uids: list[str] = []
        self.filtered_uids: list[str] = []
        """Prompts whose groups were filtered (each also in ``admitted_uids``)."""
        self.num_filtered_in_window = 0
        """Groups filtered since the current window opened."""
        self._next_ticket = 0
        self._tickets: dict[int, Ticket] = {}  # admitted, not released, not retired
        self._unreleased: dict[int, int] = defaultdict(int)  # window -> tickets in _tickets
        self._held: dict[int, list[tuple[int, Item]]] = defaultdict(list)  # finished, waiting

    @property
    def staleness_bound(self) -> int:
        """Max versions between a trained group's oldest token and the trainer's weights."""
        return (self.budget - 1) // self.window_demand

    @property
    def num_admitted(self) -> int:
        return len(self.admitted_uids)

    @property
    def num_filtered(self) -> int:
        return len(self.filtered_uids)

    def fresh_left(self) -> int | None:
        """Fresh prompts the run may still admit; a filtered one does not count."""
        if self.max_fresh is None:
            return None
        return self.max_fresh - (self.num_admitted - self.num_filtered)

    def open_window(self, version: int, num_trained: int) -> int:
        """Start window ``version`` after the trainer trained ``num_trained`` groups; returns
        the new allowance."""
        if version < self.window:
            raise ValueError(f"open_window({version}) after window {self.window}: must not go back")
        live = self.num_admitted - num_trained - self.num_filtered
        if live < 0:
            raise ValueError(f"trained {num_trained} groups but only {self.num_admitted} admitted")
        self.window = version
        self.allowance = max(0, self.budget - live)
        self.num_filtered_in_window = 0
        return self.allowance

    def can_admit(self) -> bool:
        left = self.fresh_left()
        return self.allowance > 0 and (left is None or left > 0)

    def admit(self, uid: str) -> Ticket:
        """A fresh prompt in the current window; ``can_admit()`` must be True."""
        if not self.can_admit():
            raise RuntimeError(f"admit({uid!r}) without allowance: call can_admit() first")
        self.allowance -= 1
        self.admitted_uids.append(uid)
        return self._issue(uid)

    def readmit(self, ticket: int, uid: str) -> Ticket:
        """The prompt of ``ticket`` again, in the current window (its trajectory got too old).
        ``ticket`` may be unreleased (retired here) or already handed to the trainer."""
        old = self._tickets.pop(ticket, None)
        if old is not None:
            self._unreleased[old.window] -= 1
            self._held[old.window] = [(t, g) for t, g in self._held[old.window] if t != ticket]
        self.num_readmitted += 1
        return self._issue(uid)

    def _issue(self, uid: str) -> Ticket:
        new = Ticket(self._next_ticket, uid, self.window)
        self._next_ticket += 1
        self._tickets[new.ticket] = new
        self._unreleased[new.window] += 1
        return new

    def complete(self, ticket: int, item: Item) -> list[Item]:
        """``ticket``'s group is finished; returns every group releasable now, in order."""
        if ticket not in self._tickets:
            raise ValueError(f"ticket {ticket} is not admitted or already released")
        self._held[self._tickets[ticket].window].append((ticket, item))
        return self._releasable()

    def filter(self, ticket: int) -> list[Item]:
        """``ticket``'s finished group was filtered: retired unreleased, recorded, its slot
        given back; returns the groups releasable now (it may have held a window back)."""
        old = self._tickets.pop(ticket, None)
        if old is None:
            raise ValueError(f"ticket {ticket} is not admitted or already released")
        self._unreleased[old.window] -= 1
        self.filtered_uids.append(old.uid)
        self.num_filtered_in_window += 1
        self.allowance += 1
        return self._releasable()

    def _releasable(self) -> list[Item]:
        out: list[Item] = []
        for window in sorted(w for w, n in self._unreleased.items() if n > 0):
            for ticket, item in self._held.pop(window, []):
                del self._tickets[ticket]
                self._unreleased[window] -= 1
                out.append(item)
            if self._unreleased[window] > 0:
                break  # later windows wait for this one's stragglers
        self.num_released += len(out)
        return out

    def unreleased(self) -> list[Ticket]:
        """Tickets admitted but not yet released, oldest first."""
        return sorted(self._tickets.values(), key=lambda t: t.ticket)

    # ---- checkpoints ------------------------------------------------------------------------

    def state_dict(self, encode_item: Callable[[Item], Any] = _same) -> dict[str, Any]:
        """Every counter, live ticket and held group, as JSON-able values (held groups through
        ``encode_item``). ``budget`` and ``window_demand`` are recorded to check a resume."""
        return {
            "budget": self.budget,
            "window_demand": self.window_demand,
            "window": self.window,
            "allowance": self.allowance,
            "num_readmitted": self.num_readmitted,
            "num_released": self.num_released,
            "admitted_uids": list(self.admitted_uids),
            "filtered_uids": list(self.filtered_uids),
            "num_filtered_in_window": self.num_filtered_in_window,
            "next_ticket": self._next_ticket,
            "tickets": [[t.ticket, t.uid, t.window] for t in self._tickets.values()],
            "held": [
                [window, [[ticket, encode_item(item)] for ticket, item in items]]
                for window, items in sorted(self._held.items())
                if items
            ],
        }

    def load_state_dict(
        self, state: dict[str, Any], decode_item: Callable[[Any], Item] = _same
    ) -> None:
        """Continue from ``state_dict()``'s values; ValueError when budget or window demand
        differ (the run's batch or staleness settings changed since)."""
        for key in ("budget", "window_demand"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the checkpoint's admission {key}={state[key]} differs from this run's "
                    f"{getattr(self, key)}: keep actor.ppo_mini_batch_size, async_training.* "
                    "as they were to resume"
                )
        self.window, self.allowance = state["window"], state["allowance"]
        self.num_readmitted, self.num_released = state["num_readmitted"], state["num_released"]
        self.admitted_uids = list(state["admitted_uids"])
        self.filtered_uids = list(state.get("filtered_uids", []))
        self.num_filtered_in_window = state.get("num_filtered_in_window", 0)
        self._next_ticket = state["next_ticket"]
        self._tickets = {n: Ticket(n, uid, w) for n, uid, w in state["tickets"]}
        self._unreleased = defaultdict(int)
        for ticket in self._tickets.values():
            self._unreleased[ticket.window] += 1
        self._held = defaultdict(list)
        for window, items in state["held"]:
            self._held[window] = [(ticket, decode_item(item)) for ticket, item in items]
