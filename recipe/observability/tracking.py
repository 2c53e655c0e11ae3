"""The one metrics interface of the project: typed records, one reduction, many sinks.

    component --add()--> MetricsAccumulator --reduce()--> {key: float} --> Tracker.log(step)
                                                                            |-> console (rich)
                                                                            |-> metrics.jsonl
                                                                            |-> wandb
                                                                            '-> tensorboard

Components record values with an explicit reduction (weighted mean, sum, max, min, last) and
the accumulator reduces them in one place, so a token-weighted mean is never averaged again as
if it were a plain one. The Tracker validates keys (slash-namespaced, ``section/name``), turns
values into floats and fans them out to the sinks named in ``logger.backends``; callers never
branch on which sinks are on. Only one process per run (rank 0 / the driver) owns a Tracker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from recipe.observability.backends import Backend, json_safe, make_backend
from recipe.observability.config import LoggerConfig

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
REDUCE_KINDS = ("mean", "sum", "max", "min", "last")
_KEY_RE = re.compile(r"[^\s/]+(/[^\s/]+)+")


def validate_metric_key(key: str) -> str:
    """Return ``key`` if it is slash-namespaced (``section/name``, non-empty parts, no spaces)."""
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise ValueError(
            f"metric key {key!r} is invalid: use a slash-namespaced name like 'reward/mean' "
            "(at least two non-empty parts, no whitespace)"
        )
    return key


@dataclass(slots=True)
class _Stat:
    """Running state of one key. ``value`` is the weighted sum for ``mean``, else the result."""

    reduce: str
    value: float
    weight: float


class MetricsAccumulator:
    """Collects metric records over a step and reduces each key by its declared kind.

    ``mean`` is weighted (sum(w * v) / sum(w)); ``sum``, ``max``, ``min`` and ``last`` ignore
    weights and reject any other than 1. A key keeps the reduce kind it was first added with;
    adding it with another kind raises, because mixing them has no single meaning.
    """

    def __init__(self) -> None:
        self._stats: dict[str, _Stat] = {}

    def __len__(self) -> int:
        return len(self._stats)

    def add(self, key: str, value: float, *, weight: float = 1.0, reduce: str = "mean") -> None:
        """Record ``value`` under ``key``; ``weight`` (>= 0) counts only for ``reduce="mean"``."""
        validate_metric_key(key)
        if reduce not in REDUCE_KINDS:
            raise ValueError(f"reduce={reduce!r} for {key!r}: allowed {', '.join(REDUCE_KINDS)}")
        if reduce != "mean" and weight != 1.0:
            raise ValueError(f"weight={weight} for {key!r}: weights apply only to reduce='mean'")
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"weight={weight} for {key!r}: must be finite and >= 0")
        value = float(value)
        if reduce == "mean":
            # A zero weight means "does not count": keep a NaN value out of the weighted sum.
            value = value * weight if weight > 0 else 0.0
        self._merge(key, _Stat(reduce, value, weight))

    def extend(self, other: MetricsAccumulator) -> None:
        """Fold in ``other``'s records as if they were added here after ours (``last`` wins)."""
        for key, stat in other._stats.items():  # check first so a clash leaves self unchanged
            if key in self._stats and self._stats[key].reduce != stat.reduce:
                raise ValueError(
                    f"metric {key!r} has reduce={stat.reduce!r} and {self._stats[key].reduce!r}"
                )
        for key, stat in other._stats.items():
            self._merge(key, _Stat(stat.reduce, stat.value, stat.weight))

    @contextlib.contextmanager
    def timer(self, key: str, *, reduce: str = "sum") -> Iterator[None]:
        """Add the block's wall time in seconds under ``key`` (e.g. ``timing/gen_s``).

        The key must end in ``_s`` so the unit is in the name; ``sum`` totals repeated blocks.
        """
        validate_metric_key(key)
        if reduce not in REDUCE_KINDS:
            raise ValueError(f"reduce={reduce!r} for {key!r}: allowed {', '.join(REDUCE_KINDS)}")
        if not key.endswith("_s"):
            raise ValueError(f"timer key {key!r} must end in '_s' (it records seconds)")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(key, time.perf_counter() - start, reduce=reduce)

    def reduce(self) -> dict[str, float]:
        """The reduced value of every key; a ``mean`` whose weights sum to 0 is NaN."""
        out: dict[str, float] = {}
        for key, stat in self._stats.items():
            if stat.reduce == "mean":
                out[key] = stat.value / stat.weight if stat.weight > 0 else math.nan
            else:
                out[key] = stat.value
        return out

    def _merge(self, key: str, new: _Stat) -> None:
        old = self._stats.get(key)
        if old is None:
            self._stats[key] = new
            return
        if old.reduce != new.reduce:
            raise ValueError(f"metric {key!r} added with reduce={new.reduce!r} and {old.reduce!r}")
        if new.reduce in ("mean", "sum"):
            old.value += new.value
        elif new.reduce == "max":
            # NaN is sticky (plain max() would keep or drop it depending on argument order).
            if math.isnan(new.value) or new.value > old.value:
                old.value = new.value
        elif new.reduce == "min":
            if math.isnan(new.value) or new.value < old.value:
                old.value = new.value
        else:
            old.value = new.value
        old.weight += new.weight


class Tracker:
    """Fans each step's metrics out to the configured sinks and writes ``summary.json``.

    Usable as a context manager; ``close`` is idempotent and closes every sink even if one fails.
    """

    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_config: dict | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._summary: dict[str, Any] = {}
        self._closed = False
        self._backends: list[Backend] = []
        try:
            for name in cfg.backends:
                self._backends.append(make_backend(name, cfg, self.run_dir, run_config))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        """Send one step's metrics (validated keys, values as floats) to every sink."""
        if self._closed:
            raise RuntimeError("Tracker.log called after close()")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r} is invalid: must be an int >= 0")
        record: dict[str, float] = {}
        for key, value in metrics.items():
            validate_metric_key(key)
            try:
                record[key] = float(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"metric {key!r}={value!r} is not a number") from err
        for backend in self._backends:
            backend.log(record, step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Merge ``summary`` into ``run_dir/summary.json`` (atomic rewrite) and the sinks'."""
        if self._closed:
            raise RuntimeError("Tracker.log_summary called after close()")
        self._summary.update(summary)
        _write_json_atomic(self.run_dir / SUMMARY_FILE, self._summary)
        for backend in self._backends:
            backend.summary(summary)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        first_error: BaseException | None = None
        for backend in self._backends:
            try:
                backend.close()
            except Exception as err:  # close the rest; report the first failure after
                logger.exception("closing metric backend %s failed", type(backend).__name__)
                first_error = first_error or err
        if first_error is not None:
            raise first_error

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Readers see the old file or the new one, never a partial one (temp file + rename)."""
    text = json.dumps(json_safe(dict(payload)), indent=2, sort_keys=True, allow_nan=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
