"""The judge's counters and its ``judge/*`` metrics: what a ``Judge`` records per call
attempt, drained once per step (latency p50/p99 by the nearest-rank rule)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JudgeStats:
    """Counters of judge calls (attempts) since the last drain; ``queue_depth`` is live."""

    latencies_s: list[float] = field(default_factory=list)
    """Seconds of each call from its start (after the concurrency bound) to its end."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_failures: int = 0
    """Replies with no readable verdict."""
    retries: int = 0
    """Attempts after a first one."""
    failures: int = 0
    """Calls that raised or timed out."""
    queue_depth: int = 0
    """Calls waiting for the concurrency bound now."""
    queue_depth_max: int = 0
    """The most calls seen waiting for the concurrency bound at once."""

    def waiting(self, change: int) -> None:
        """A call starts (+1) or stops (-1) waiting for the concurrency bound."""
        self.queue_depth += change
        self.queue_depth_max = max(self.queue_depth_max, self.queue_depth)

    def metrics(self) -> dict[str, float]:
        """The ``judge/*`` metrics; empty when no call was made."""
        if not self.latencies_s:
            return {}
        latencies = sorted(self.latencies_s)
        return {
            "judge/calls": float(len(latencies)),
            "judge/latency_p50_s": nearest_rank(latencies, 0.5),
            "judge/latency_p99_s": nearest_rank(latencies, 0.99),
            "judge/prompt_tokens": float(self.prompt_tokens),
            "judge/completion_tokens": float(self.completion_tokens),
            "judge/parse_failures": float(self.parse_failures),
            "judge/retries": float(self.retries),
            "judge/failures": float(self.failures),
            "judge/queue_depth_max": float(self.queue_depth_max),
        }


def nearest_rank(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile of non-empty ``sorted_values`` by the nearest-rank rule."""
    rank = max(1, -(-q * len(sorted_values) // 1))
    return sorted_values[int(rank) - 1]
