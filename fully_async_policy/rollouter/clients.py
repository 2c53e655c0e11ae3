"""Typed client of the message queue, used by the rollouter actor (its producer end).

A Ray handle dispatches any attribute name and its results are untyped; ``QueueProducer``
names each call the rollouter makes on the ``MessageQueue`` actor (message_queue.py), with
its arguments and what the awaited reference resolves to, so a renamed method is a type error
rather than a failure in another process. Each method starts the call and returns its
ObjectRef; the caller awaits it under its own deadline (stream.py, checkpoint.py). The
trainer's end of the same queue is ``QueueClient`` (driver/clients.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fully_async_policy.messages import PromptGroup

if TYPE_CHECKING:
    from ray import ObjectRef


class QueueProducer:
    """The rollouter's calls on the ``MessageQueue`` actor ``handle``."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def put(self, group: PromptGroup) -> ObjectRef[bool]:
        """Put ``group`` once there is room; resolves False when the queue was closed."""
        return self.handle.put.remote(group)

    def snapshot(self) -> ObjectRef[list[PromptGroup]]:
        """The groups queued now, in order (a checkpoint reads them)."""
        return self.handle.snapshot.remote()

    def close(self) -> ObjectRef[None]:
        """Close the queue: the trainer's batch wait ends at once."""
        return self.handle.close.remote()
