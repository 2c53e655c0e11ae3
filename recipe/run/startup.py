"""``StartupTimes``: where a run's seconds go before its first training step.

    process start ----------------------------------------------------> first step begins
      inputs_s        model, data, reward functions checked (the driver)
      ray_s           Ray started or joined (fully_async; the batch modes start it with their ranks)
      trainer_init_s  trainer side built: placement reserved, ranks load the model and join
      engines_s       engines started (vLLM: load, compile, graph capture), beside the ranks
      initial_val_s   validation of the initial weights (trainer.val_before_train)
      to_first_step_s from the process's start (the OS's clock of it) to the first step
    first_push_s      the first weight push (it follows the first step: version 0 is the
                      model on disk, which the engines load themselves)

The trainer ranks and the engines start side by side, so ``trainer_init_s`` and ``engines_s``
overlap: the phases do not add up to ``to_first_step_s``, their maximum does (plus Python's
imports, Hydra and the config, ``other_s``). Each phase is recorded by whoever runs it
(the recipe, ``TrainingRun``); ``metrics`` turns them into the ``startup/*`` summary keys.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

PREFIX = "startup/"

OVERLAPPING = ("trainer_init_s", "engines_s")
"""Phases that run side by side: only the longer one counts towards the total."""


def process_start_time() -> float:
    """When this process started (seconds since the epoch, the OS's record of it), so the
    interpreter's and the imports' seconds count too; now when the OS does not say."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # no psutil, or a platform without the record: count from here
        return time.time()


class StartupTimes:
    """Seconds per start-up phase of this process (see the module docstring)."""

    def __init__(self, process_start: float | None = None) -> None:
        """``process_start``: seconds since the epoch (None: the OS's start of this process)."""
        self.process_start = process_start_time() if process_start is None else process_start
        self.phases_s: dict[str, float] = {}
        """Phase name (``ray_s``, ...) -> seconds; a phase recorded twice adds up."""
        self.first_step_at: float | None = None
        """When the first training step began (seconds since the epoch); None before."""

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` to phase ``name`` (a name ending in ``_s``)."""
        if not name.endswith("_s"):
            raise ValueError(f"start-up phase {name!r}: names end in '_s' (seconds)")
        self.phases_s[name] = self.phases_s.get(name, 0.0) + float(seconds)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time spent in the block to phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def first_step(self, now: float | None = None) -> None:
        """The first training step begins now (``now``: seconds since the epoch); later
        calls change nothing."""
        if self.first_step_at is None:
            self.first_step_at = time.time() if now is None else now

    def metrics(self) -> dict[str, float]:
        """``startup/<phase>`` for every phase recorded, and, once the first step began,
        ``startup/to_first_step_s`` and ``startup/other_s`` (what no phase accounts for)."""
        out = {PREFIX + name: seconds for name, seconds in self.phases_s.items()}
        if self.first_step_at is None:
            return out
        total = max(self.first_step_at - self.process_start, 0.0)
        out[PREFIX + "to_first_step_s"] = total
        out[PREFIX + "other_s"] = max(total - self.accounted_s(), 0.0)
        return out

    def accounted_s(self) -> float:
        """Seconds the phases before the first step account for: phases that ran side by
        side count once (the longer); ``first_push_s`` comes after the first step."""
        side_by_side = [self.phases_s[name] for name in OVERLAPPING if name in self.phases_s]
        serial = sum(
            seconds
            for name, seconds in self.phases_s.items()
            if name not in OVERLAPPING and name != "first_push_s"
        )
        return serial + max(side_by_side, default=0.0)
