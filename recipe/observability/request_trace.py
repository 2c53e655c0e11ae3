"""``RequestTrace``: an engine replica's generation requests and episodes on its trace tracks.

Lives in each rollout worker; ``RolloutReplicas.drain_trace`` pulls its slices into the
run's ``trace.json`` as process ``ENGINE_PID_BASE + r`` (trace.py).
"""

from __future__ import annotations

from typing import Any

from recipe.observability.trace import ENGINE_PID_BASE, EPISODE_TID_BASE, Tracer, now_us


class RequestTrace:
    """Generation requests of one engine replica, one slice each.

    A replica serves many requests at once, and slices on one track must not overlap, so each
    request takes the lowest free *slot* (track) while it runs. The replica's index is known
    only to the caller, so events get their pid when drained.
    """

    def __init__(self) -> None:
        self._tracer = Tracer(ENGINE_PID_BASE, None)  # pid and names are set per drain
        self._busy: set[int] = set()
        self._num_slots = 0
        self._episodes_busy: set[int] = set()
        self._num_episode_slots = 0

    def begin(self) -> tuple[float, int]:
        """Start of a request: (start time in us, its slot)."""
        slot = next(i for i in range(len(self._busy) + 1) if i not in self._busy)
        self._busy.add(slot)
        self._num_slots = max(self._num_slots, slot + 1)
        return now_us(), slot

    def end(self, slot: int) -> None:
        self._busy.discard(slot)

    def generated(self, request: Any, trajectories: list[Any], start_us: float, slot: int) -> None:
        """Record one finished (or paused) request: prompt uid, n, tokens, versions."""
        resumed = request.resume is not None
        done_before = {t.sample_index: t.num_response_tokens for t in request.resume or []}
        lengths = [t.num_response_tokens for t in trajectories]
        new = [t.num_response_tokens - done_before.get(t.sample_index, 0) for t in trajectories]
        versions = sorted({v for t in trajectories for v in t.model_versions})
        finish: dict[str, int] = {}
        for traj in trajectories:
            finish[traj.finish_reason] = finish.get(traj.finish_reason, 0) + 1
        args = {
            "prompt_uid": request.prompt_uid,
            "n": request.n,
            "new_tokens": sum(new),
            "tokens": sum(lengths),
            "new_lengths": new,
            "lengths": lengths,
            "versions": versions,
            "finish": finish,
            "resumed": resumed,
            "temperature": request.temperature,
        }
        name = "generate (resumed)" if resumed else "generate"
        cut = "aborted" in finish
        self._tracer.complete(
            name + (" [cut]" if cut else ""),
            start_us,
            now_us(),
            tid=slot + 1,
            cat="rollout",
            args=args,
        )

    # Multi-turn episodes: each takes an episode track for its life; its model turns and
    # environment steps follow one another there, so they never overlap on it.

    def begin_episode(self) -> int:
        """An episode starts: its track (the lowest free one)."""
        slot = next(i for i in range(len(self._episodes_busy) + 1) if i not in self._episodes_busy)
        self._episodes_busy.add(slot)
        self._num_episode_slots = max(self._num_episode_slots, slot + 1)
        return slot

    def end_episode(self, slot: int) -> None:
        self._episodes_busy.discard(slot)

    def episode_slice(
        self, name: str, start_us: float, end_us: float, slot: int, args: dict[str, Any]
    ) -> None:
        """One model turn (``turn``) or environment call (``env ...``) of an episode."""
        self._tracer.complete(
            name, start_us, end_us, tid=EPISODE_TID_BASE + slot, cat="agent", args=args
        )

    def drain(self, replica: int) -> list[dict[str, Any]]:
        """Buffered slices with pid ``ENGINE_PID_BASE + replica`` and the track names."""
        pid = ENGINE_PID_BASE + replica
        self._tracer.name_process(f"engine replica {replica}", pid=pid, sort_index=pid)
        for slot in range(self._num_slots):
            self._tracer.name_thread(slot + 1, f"slot {slot}", pid=pid)
        for slot in range(self._num_episode_slots):
            self._tracer.name_thread(EPISODE_TID_BASE + slot, f"episode {slot}", pid=pid)
        events = self._tracer.drain()
        for event in events:
            event["pid"] = pid
        return events
