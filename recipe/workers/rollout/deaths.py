"""How a rollout replica died: one classifier for every recipe.

A replica is dead when its actor died (``RayActorError``: ``actor_death``), or when it is
alive and fails ``check_health`` because its engine process died (``failed_health_check``,
with the engine's own root error from its log when there is one). A replica whose restart
dies of the same error before completing a response is not restarted again
(``ReplicaDeath.repeats``). ``replica_death`` asks a replica and judges: the one
classifier, awaited by the fully async supervisor, run to completion by ``RolloutReplicas``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from recipe.faults import describe_death, is_actor_death
from recipe.utils.ray_errors import error_line
from recipe.workers.rollout.engine_log import describe_engine_failure

if TYPE_CHECKING:
    from recipe.workers.rollout.client import ReplicaClient

T = TypeVar("T")

HEALTH_TIMEOUT_S = 10.0
"""A replica that does not answer a health check in this time is busy, not judged dead."""


@dataclass(frozen=True, slots=True)
class ReplicaDeath:
    """How a rollout replica died."""

    reason: str
    """One line for logs and errors."""
    error: str | None = None
    """Its engine's root error (``"Type: message"``), when the engine's log has one."""
    num_finished: int | None = None
    """Responses the dead worker completed; None when unknown (its actor is gone)."""

    def repeats(self, previous_error: str | None) -> bool:
        """The restart of a replica that died of ``previous_error`` died of it again
        before completing a single response."""
        return self.error is not None and self.error == previous_error and self.num_finished == 0


def actor_death(exc: BaseException) -> ReplicaDeath | None:
    """The replica's death when ``exc``, raised by a call on it, says its actor is gone."""
    return ReplicaDeath(describe_death(exc)) if is_actor_death(exc) else None


def failed_health_check(health: BaseException, failure: dict[str, Any] | None) -> ReplicaDeath:
    """The death of a replica whose ``check_health`` raised ``health`` (not a timeout):
    its actor is gone, or its engine is; ``failure`` is what the live actor's
    ``engine_failure()`` returned (None when it did not answer)."""
    death = actor_death(health)
    if death is not None:
        return death
    failure = failure or {}
    reason = describe_engine_failure(failure, error_line(health))
    return ReplicaDeath(reason, failure.get("error"), failure.get("num_finished"))


async def replica_death(replica: ReplicaClient, exc: BaseException | None) -> ReplicaDeath | None:
    """Why ``replica`` is dead (None: it is not): ``exc``, raised by a call on it, says its
    actor is gone, or (``exc`` None or of another kind) it fails ``check_health``, with its
    engine's log read when the actor is alive. A replica that does not answer within
    ``HEALTH_TIMEOUT_S`` is busy or hung, not judged dead."""
    death = None if exc is None else actor_death(exc)
    if death is not None:
        return death
    try:
        await _within(replica.check_health())
    except TimeoutError:  # Ray's GetTimeoutError is one
        return None
    except Exception as health:
        failure = None
        if not is_actor_death(health):  # the actor is alive: its engine's log says more
            try:
                failure = await _within(replica.engine_failure())
            except Exception:  # the actor went too: no more to say than the health check
                failure = None
        return failed_health_check(health, failure)
    return None


async def _within(ref: Awaitable[T]) -> T:
    async def awaited() -> T:
        return await ref

    return await asyncio.wait_for(awaited(), HEALTH_TIMEOUT_S)
