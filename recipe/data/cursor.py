"""The exactly-once prompt cursor: which prompt is handed out next.

Prompts are handed out in a seeded order, epoch by epoch; each epoch is a fresh permutation
of the whole train set. The cursor's state is two integers (epoch, offset), so it is cheap to
checkpoint and a resumed run continues exactly where it stopped: no prompt is handed out
twice in an epoch and none is skipped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from recipe.protocol import PromptRecord


@dataclass(slots=True)
class CursorState:
    epoch: int = 0
    """Epochs completed."""
    offset: int = 0
    """Prompts handed out in the current epoch."""


class PromptCursor:
    """Hands out prompts in a seeded per-epoch order, exactly once per epoch."""

    def __init__(self, records: Sequence[PromptRecord], *, seed: int, shuffle: bool = True):
        if not records:
            raise ValueError("the train set is empty: nothing to hand out")
        self._records = list(records)
        self._seed = seed
        self._shuffle = shuffle
        self.state = CursorState()
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self._records)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._records)))
        if self._shuffle:
            random.Random(self._seed * 1_000_003 + epoch).shuffle(order)
        return order

    @property
    def num_handed_out(self) -> int:
        return self.state.epoch * len(self._records) + self.state.offset

    def next(self) -> PromptRecord:
        if self.state.offset == len(self._records):
            self.state = CursorState(epoch=self.state.epoch + 1, offset=0)
            self._order = self._epoch_order(self.state.epoch)
        record = self._records[self._order[self.state.offset]]
        self.state.offset += 1
        return record

    def take(self, num_prompts: int) -> list[PromptRecord]:
        return [self.next() for _ in range(num_prompts)]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "offset": self.state.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = CursorState(epoch=int(state["epoch"]), offset=int(state["offset"]))
        self._order = self._epoch_order(self.state.epoch)
