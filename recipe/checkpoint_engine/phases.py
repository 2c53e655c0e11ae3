"""Driver-side waiting for one sync phase: results by peer, or an error naming who failed.

Every call of a phase is a Ray ObjectRef keyed by a peer name (``trainer rank 0``,
``rollout replica 1``). The first failure raises at once (peers blocked with the failed one
would otherwise hold the caller until the deadline); the deadline raises naming every peer
that has not answered. A peer's own ``WeightSyncError`` keeps its phase and its more precise
peer name (e.g. which receiver rank and what it waited for).
"""

from __future__ import annotations

import time
from typing import Any

from recipe.checkpoint_engine.base import WeightSyncError
from recipe.utils.ray_errors import remote_cause

SENDER = "trainer rank 0"
NO_ANSWER = "no answer within"
"""How a phase's deadline error begins (``WeightSyncError.detail``)."""


def replica_peer(index: int) -> str:
    return f"rollout replica {index}"


def wait_phase(phase: str, calls: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Results of Ray ``calls`` (peer name -> ObjectRef) by peer; the first failure, or the
    deadline, raises ``WeightSyncError`` naming the phase, the peer and who is still busy."""
    import ray

    end = time.monotonic() + timeout_s
    pending = {ref: peer for peer, ref in calls.items()}
    results: dict[str, Any] = {}
    while pending:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(
                phase, ", ".join(pending.values()), f"{NO_ANSWER} {timeout_s:.1f} s"
            )
        done, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
        for ref in done:
            peer = pending.pop(ref)
            try:
                results[peer] = ray.get(ref)
            except Exception as exc:  # re-raised naming the phase and peer
                raise _phase_error(phase, peer, exc, list(pending.values())) from exc
    return results


def _phase_error(phase: str, peer: str, exc: BaseException, busy: list[str]) -> WeightSyncError:
    cause = remote_cause(exc)
    still = f" (still busy: {', '.join(busy)})" if busy else ""
    if isinstance(cause, WeightSyncError):
        error_cls = type(cause)
        return error_cls(cause.phase, f"{peer} / {cause.peer}", cause.detail + still)
    detail = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
    return WeightSyncError(phase, peer, detail + still)
