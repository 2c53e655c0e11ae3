"""``MessageQueue``: the bounded, blocking, never-dropping hand-off from rollouter to trainer.

    rollouter --put(group)--> [ g0 g1 g2 ... ]  (size <= capacity) --get_batch(k)--> trainer
               waits while full                                      waits for k groups

Runs as an async Ray actor (``make_message_queue``); the class itself is plain asyncio so it
is tested without Ray. States and invariant::

    OPEN --close()--> CLOSED
      put:       OPEN: waits while size == capacity, then appends (True); CLOSED: False
      get_batch: waits until k groups are there (returns them) or the queue is CLOSED with
                 fewer than k left (returns EndOfStream; ``drain()`` hands those out)

    Invariant: size <= capacity, and num_produced == num_consumed + size. Nothing is ever
    evicted: a put waits instead (backpressure), so a group leaves the queue only through
    get_batch or drain, in the order it was put (FIFO).

The capacity is the admission budget of one version window, which bounds the groups alive
between admission and training, so in steady state admission (not this queue) is what holds
the rollouter back; the blocking put is the guarantee that holds even if admission is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fully_async_policy.messages import EndOfStream, PromptGroup, QueueStats
from recipe.workers.cluster import on_driver_node

if TYPE_CHECKING:
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)

Item = TypeVar("Item")


class MessageQueue(Generic[Item]):
    """FIFO of bounded size with a blocking put, a whole-batch get and an explicit close.
    The recipe's items are ``PromptGroup``s (``make_message_queue``)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"MessageQueue capacity={capacity}: allowed >= 1")
        self._capacity = capacity
        self._items: deque[Item] = deque()
        self._closed = False
        # One condition for both directions: every state change (put, get, close) notifies all.
        self._changed = asyncio.Condition()
        self._max_size = 0
        self._num_produced = 0
        self._num_consumed = 0
        self._num_blocked_puts = 0
        self._max_put_wait_s = 0.0
        self._total_get_wait_s = 0.0

    async def put(self, item: Item) -> bool:
        """Append ``item``, waiting while the queue is full. False (item not taken) once the
        queue is closed, also when it closes during the wait."""
        start = time.perf_counter()
        async with self._changed:
            if len(self._items) >= self._capacity and not self._closed:
                self._num_blocked_puts += 1
            await self._changed.wait_for(lambda: self._closed or len(self._items) < self._capacity)
            self._max_put_wait_s = max(self._max_put_wait_s, time.perf_counter() - start)
            if self._closed:
                return False
            self._items.append(item)
            self._num_produced += 1
            self._max_size = max(self._max_size, len(self._items))
            self._changed.notify_all()
            return True

    async def get_batch(self, num_items: int) -> list[Item] | EndOfStream:
        """The next ``num_items`` groups in put order, waiting until they are all there; an
        ``EndOfStream`` once the queue is closed with fewer left."""
        if not 1 <= num_items <= self._capacity:
            raise ValueError(
                f"get_batch(num_items={num_items}): allowed 1..capacity={self._capacity}"
            )
        start = time.perf_counter()
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or len(self._items) >= num_items)
            self._total_get_wait_s += time.perf_counter() - start
            if len(self._items) < num_items:
                return EndOfStream(num_left=len(self._items))
            batch = [self._items.popleft() for _ in range(num_items)]
            self._num_consumed += num_items
            self._changed.notify_all()
            return batch

    async def drain(self) -> list[Item]:
        """Take every group left (end-of-run accounting); does not wait."""
        async with self._changed:
            items = list(self._items)
            self._items.clear()
            self._num_consumed += len(items)
            self._changed.notify_all()
            return items

    async def snapshot(self) -> list[Item]:
        """The groups in the queue, in order, left in place (for a checkpoint)."""
        async with self._changed:
            return list(self._items)

    async def close(self) -> None:
        """No more puts; wakes every waiter (puts return False, short gets EndOfStream).
        Idempotent."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    def stats(self) -> QueueStats:
        return QueueStats(
            size=len(self._items),
            capacity=self._capacity,
            max_size=self._max_size,
            num_produced=self._num_produced,
            num_consumed=self._num_consumed,
            num_blocked_puts=self._num_blocked_puts,
            max_put_wait_s=self._max_put_wait_s,
            total_get_wait_s=self._total_get_wait_s,
            closed=self._closed,
        )


def make_message_queue(capacity: int) -> ActorHandle[MessageQueue[PromptGroup]]:
    """The rollouter-to-trainer ``MessageQueue`` of ``PromptGroup``s as an async Ray actor (no
    CPU reserved: it holds small scored groups), on the driver's node."""
    import ray

    queue: Any = ray.remote(num_cpus=0)(MessageQueue)
    return queue.options(scheduling_strategy=on_driver_node()).remote(capacity)
