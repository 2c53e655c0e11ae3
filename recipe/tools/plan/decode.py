"""An engine's two decode speeds, fitted from a sync run's batches, for the planner's engine.

The simulation's engine (sim.py) runs k sequences at once, each at 1 / (1/seq_tps +
k/engine_tps) tokens/s: one engine step takes a + b k seconds and gives every running sequence
a token, with a = 1/seq_tps (the step's fixed cost, which bounds a lone sequence) and
b = 1/engine_tps (the cost of one more sequence in the step). A batch whose sequences start
together and fit the engine at once therefore takes

    duration = a * longest + b * tokens

(longest: its longest response, the number of engine steps; tokens: the sum over those steps of
the sequences running). A sync run's generation is such a batch per replica and step, and the
batches differ in their longest response (a tail) and their tokens, so least squares over
them gives a and b.

Why it matters: a run's mean tokens/s over busy time counts a tail's nearly empty steps as
the engine's speed. Taken alone as ``engine_tps`` (with ``seq_tps`` infinite), it makes the
lone last sequence of a tail as fast as a full engine, and a full engine as slow as the
mean: both wrong against the long tail a sync step waits for, and both in sync's favour.

Batches that cannot be read this way are left out: requests of a replica that do not start
together (the last start later than ``START_SPREAD`` of the batch's duration), more sequences
than the engine runs at once. ``None`` when fewer than ``MIN_BATCHES`` remain, or when either
fitted cost is not ``MIN_T`` standard errors above zero: the batches do not separate the two
terms. Seen on the CPU with ``rollout.length_profile=longtail``, where every batch's longest
response is within 4% of the limit: t = 2.4 and 1.8, and fully_async's predicted samples/s
+16.7% off against +4.9% with the mean. On one H100 (GSM8K at 2,048 tokens, longest
531-2,048; the same fit on its metrics): t = 16 and 13.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MIN_BATCHES = 4
MIN_T = 3.0
"""Each fitted cost at least this many standard errors above zero."""
START_SPREAD = 0.1
"""The most a batch's requests may start apart, as a share of its duration."""


@dataclass(frozen=True, slots=True)
class Batch:
    """One replica's requests that ran together (a busy period)."""

    duration_s: float
    longest: int
    """Its longest response (tokens): the engine steps it took."""
    tokens: int
    sequences: int
    start_spread_s: float
    """Its last request's start after its first's."""


@dataclass(frozen=True, slots=True)
class DecodeFit:
    engine_tps: float
    """Tokens/s of a full engine: 1 / the cost of one more sequence in a step."""
    seq_tps: float
    """Tokens/s of a lone sequence: 1 / an engine step's fixed cost."""
    batches: int
    r2: float
    """Of the batches' durations."""

    def describe(self) -> str:
        return (
            f"a lone sequence {self.seq_tps:,.0f} tokens/s, a full engine "
            f"{self.engine_tps:,.0f} tokens/s (fit over {self.batches} sync batches: duration "
            f"= longest / seq_tps + tokens / engine_tps, R^2 {self.r2:.2f})"
        )


def by_replica(
    requests: Iterable[Mapping[str, Any]], start_us: float
) -> dict[int, list[Mapping[str, Any]]]:
    """The requests that started from ``start_us`` on, per replica (trace pid)."""
    replicas: dict[int, list[Mapping[str, Any]]] = {}
    for event in requests:
        if event["ts"] >= start_us:
            replicas.setdefault(event["pid"], []).append(event)
    return replicas


def busy_batches(requests: Iterable[Mapping[str, Any]], start_us: float) -> list[Batch]:
    """Each replica's busy periods from ``start_us`` on: requests overlapping in time,
    transitively (a sync step's generation on one replica)."""
    batches = []
    for events in by_replica(requests, start_us).values():
        events.sort(key=lambda e: e["ts"])
        period: list[Mapping[str, Any]] = []
        period_end = -math.inf
        for event in events:
            if period and event["ts"] > period_end:
                batches.append(_batch(period))
                period, period_end = [], -math.inf
            period.append(event)
            period_end = max(period_end, event["ts"] + event["dur"])
        if period:
            batches.append(_batch(period))
    return batches


def _batch(events: list[Mapping[str, Any]]) -> Batch:
    first = min(e["ts"] for e in events)
    return Batch(
        duration_s=(max(e["ts"] + e["dur"] for e in events) - first) / 1e6,
        longest=max(max(e["args"]["new_lengths"], default=0) for e in events),
        tokens=sum(int(e["args"]["new_tokens"]) for e in events),
        sequences=sum(int(e["args"]["n"]) for e in events),
        start_spread_s=(max(e["ts"] for e in events) - first) / 1e6,
    )


def fit_decode(batches: Iterable[Batch], max_num_seqs: int) -> DecodeFit | None:
    """a and b by least squares over the batches that start together and fit the engine
    (module docstring); None when they are not each ``MIN_T`` standard errors above zero."""
    usable = [
        x
        for x in batches
        if x.duration_s > 0
        and x.sequences <= max_num_seqs
        and x.start_spread_s <= START_SPREAD * x.duration_s
    ]
    if len(usable) < MIN_BATCHES:
        return None
    sll = sum(x.longest**2 for x in usable)
    stt = sum(x.tokens**2 for x in usable)
    slt = sum(x.longest * x.tokens for x in usable)
    det = sll * stt - slt**2
    if det <= 1e-9 * sll * stt:  # every batch alike: the two costs do not separate
        return None
    sld = sum(x.longest * x.duration_s for x in usable)
    std = sum(x.tokens * x.duration_s for x in usable)
    a = (stt * sld - slt * std) / det
    b = (sll * std - slt * sld) / det
    residual = sum((x.duration_s - a * x.longest - b * x.tokens) ** 2 for x in usable)
    variance = residual / (len(usable) - 2)
    if a <= MIN_T * math.sqrt(variance * stt / det) or b <= MIN_T * math.sqrt(variance * sll / det):
        return None
    durations = [x.duration_s for x in usable]
    mean = sum(durations) / len(durations)
    total = sum((d - mean) ** 2 for d in durations)
    r2 = 1.0 - residual / total if total > 0 else math.nan
    return DecodeFit(engine_tps=1.0 / b, seq_tps=1.0 / a, batches=len(usable), r2=r2)
