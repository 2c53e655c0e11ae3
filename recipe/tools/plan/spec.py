"""What ``recipe.tools.plan.sim`` simulates and what it reports: ``Workload`` (what a run does
and what its pieces cost), ``Layout`` (mode, resources, async knobs), ``SimResult``."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

MODES = ("sync", "one_step_off", "fully_async")


@dataclass(frozen=True)
class Workload:
    """What a run does and what its pieces cost at the measured scale (seconds, tokens)."""

    n: int
    """Responses per prompt (a group)."""
    prompts_per_step: int
    """R: prompts the trainer trains per step."""
    lengths: tuple[int, ...]
    """Response lengths (tokens) to draw from, with replacement."""
    engine_tps: float
    """Tokens/s of one engine replica when it runs many sequences (its throughput)."""
    train_s_per_sample: float
    """Trainer seconds per response (old log-probs, update), at ``trainer_scale`` 1."""
    sync_s: float
    """One weight push with the engines paused."""
    seq_tps: float = math.inf
    """Tokens/s of one sequence running alone (decode latency bound)."""
    prefill_tokens: float = 0.0
    """Fixed work per sequence in tokens (prompt, scheduling); paid again on a resume."""
    max_num_seqs: int = 256
    """Sequences one engine runs at once."""
    step_overhead_s: float = 0.0
    """Trainer seconds per step that do not scale with the batch (scoring, batching)."""
    contention: float = 1.0
    """Slowdown of both sides while both compute (1: separate devices)."""

    def __post_init__(self) -> None:
        checks = {
            "n": self.n >= 1,
            "prompts_per_step": self.prompts_per_step >= 1,
            "lengths": len(self.lengths) > 0 and min(self.lengths) >= 0,
            "engine_tps": self.engine_tps > 0,
            "seq_tps": self.seq_tps > 0,
            "train_s_per_sample": self.train_s_per_sample >= 0,
            "sync_s": self.sync_s >= 0,
            "prefill_tokens": self.prefill_tokens >= 0,
            "max_num_seqs": self.max_num_seqs >= 1,
            "step_overhead_s": self.step_overhead_s >= 0,
            "contention": self.contention >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"Workload: invalid {', '.join(bad)} ({self})")


@dataclass(frozen=True)
class Layout:
    """How the pipeline is set up: mode, resources, async knobs."""

    mode: str
    engines: int = 1
    """Engine replicas generating (sync: the colocated ones)."""
    trainer_scale: float = 1.0
    """Trainer speed relative to the measurement (e.g. trainer GPUs / measured GPUs)."""
    staleness_threshold: float = 0.5
    steps_per_sync: int = 1
    """T (fully_async; the other modes push every step)."""
    partial_rollout: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Layout.mode={self.mode!r}: allowed {', '.join(MODES)}")
        if self.engines < 1 or self.trainer_scale <= 0 or self.steps_per_sync < 1:
            raise ValueError(f"Layout: engines >= 1, trainer_scale > 0, T >= 1 needed ({self})")
        if self.staleness_threshold < 0:
            raise ValueError(f"Layout.staleness_threshold={self.staleness_threshold}: >= 0")


@dataclass
class SimResult:
    """What a simulated run did."""

    layout: Layout
    step_end_s: list[float]
    """Time at the end of each step (the push after it included)."""
    num_samples: int
    trainer_wait_s: float
    """Trainer time spent waiting for groups."""
    engine_busy_s: float
    """Mean over replicas of the time some sequence was generating."""
    staleness: Counter[int] = field(default_factory=Counter)
    """Trained samples per staleness (versions)."""

    @property
    def wall_s(self) -> float:
        return self.step_end_s[-1] if self.step_end_s else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.num_samples / self.wall_s if self.wall_s > 0 else 0.0

    def steady_samples_per_s(self, warmup_steps: int = 2) -> float:
        """Samples/s over the steps after the first ``warmup_steps`` (start-up excluded)."""
        if len(self.step_end_s) <= warmup_steps + 1:
            return self.samples_per_s
        per_step = self.num_samples / len(self.step_end_s)
        steps = len(self.step_end_s) - warmup_steps
        return per_step * steps / (self.step_end_s[-1] - self.step_end_s[warmup_steps - 1])

    @property
    def trainer_idle_ratio(self) -> float:
        return self.trainer_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rollouter_idle_ratio(self) -> float:
        return 1.0 - self.engine_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / total if total else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness, default=0)
