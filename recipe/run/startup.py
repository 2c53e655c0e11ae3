"""``StartupTimes``: where a run's seconds go before its first training step.

    process start ----------------------------------------------------> first step begins
      inputs_s        model, data, reward functions checked (the driver)
      ray_s           Ray started or joined (fully_async: inside inputs_s, while the model
                      and prompts are checked: ``add_within``)
      trainer_init_s  trainer side built: placement reserved, ranks load the model and join
      engines_s       engines started, beside the ranks; of it, from the rollout worker's
                      own line in its engine log (``WORKER_START_LINE``, the slowest engine):
        engine_process_s        its process up to the constructor (Ray starting it, Python,
                                our modules' imports)
        engine_import_s         vLLM imported, the tokenizer loaded
        engine_build_s          vLLM's engine built: its processes spawned and imported,
                                and the phases below
                      and from vLLM's own log lines (``engine_phases``; INFO lines:
                      ``VLLM_LOGGING_LEVEL=INFO``):
        engine_load_s           weights loaded      "Model loading took ... and X seconds"
        engine_compile_s        torch.compile       "torch.compile took|takes X s in total"
        engine_graph_capture_s  CUDA graphs         "Graph capturing finished in X secs"
        engine_init_s           profile, KV cache, warm-up (compile and capture included)
      resume_s        a resumed run: the checkpoint loaded into the ranks and the engines made
                      to serve its weights (after the engines started: fully_async loads it
                      once they are up, so the two do not queue behind each other)
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
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from recipe.utils.process_tree import process_start_time
from recipe.workers.rollout.engine_log import WORKER_START_LINE

PREFIX = "startup/"

OVERLAPPING = ("trainer_init_s", "engines_s")
"""Phases that run side by side: only the longer one counts towards the total."""

ENGINE_LINES = {
    "engine_load_s": re.compile(r"Model loading took .*? and ([\d.]+) s(?:econds)?"),
    "engine_compile_s": re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total"),
    "engine_graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "engine_init_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"
    ),
    **{
        f"engine_{part}_s": re.compile(rf"{WORKER_START_LINE}:.*\b{part} ([\d.]+) s")
        for part in ("process", "import", "build")
    },
}
"""vLLM's INFO lines that time an engine's start (vllm 0.32's wording; "torch.compile takes"
is older releases'; a line not found is left out, never guessed). Parts of ``engines_s``,
not phases of their own."""


def engine_phases(lines: Iterable[str]) -> dict[str, float]:
    """The ``ENGINE_LINES`` figures found in one engine's output (the first of each)."""
    found: dict[str, float] = {}
    for line in lines:
        for name, pattern in ENGINE_LINES.items():
            match = pattern.search(line) if name not in found else None
            if match is not None:
                found[name] = float(match.group(1))
    return found


def engine_log_phases(paths: Iterable[Path]) -> dict[str, float]:
    """``engine_phases`` of every engine log in ``paths``, the slowest engine's per phase
    (engines start side by side); a log that cannot be read counts as none."""
    slowest: dict[str, float] = {}
    for path in paths:
        try:
            with path.open(encoding="utf-8", errors="replace") as lines:
                phases = engine_phases(lines)
        except OSError:
            continue
        for name, seconds in phases.items():
            slowest[name] = max(seconds, slowest.get(name, 0.0))
    return slowest


class StartupTimes:
    """Seconds per start-up phase of this process (see the module docstring)."""

    def __init__(self, process_start: float | None = None) -> None:
        """``process_start``: seconds since the epoch (None: the OS's start of this process)."""
        self.process_start = process_start_time() if process_start is None else process_start
        self.phases_s: dict[str, float] = {}
        """Phase name (``ray_s``, ...) -> seconds; a phase recorded twice adds up."""
        self.within_s: dict[str, float] = {}
        """Phases that ran inside another one (``add_within``): reported, never added to
        what the phases account for."""
        self.first_step_at: float | None = None
        """When the first training step began (seconds since the epoch); None before."""

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` to phase ``name`` (a name ending in ``_s``)."""
        _add(self.phases_s, name, seconds)

    def add_within(self, name: str, seconds: float) -> None:
        """Count ``seconds`` to phase ``name``, which ran inside another recorded phase
        (fully_async's Ray start, inside its input checks)."""
        _add(self.within_s, name, seconds)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time spent in the block to phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add_engines(self, seconds: float, log_dir: Path) -> None:
        """``engines_s`` and its split off the engine logs in ``log_dir`` (``*.log``, the
        slowest engine's figure per phase: ``engine_log_phases``)."""
        self.add("engines_s", seconds)
        for name, phase_s in engine_log_phases(sorted(log_dir.glob("*.log"))).items():
            self.add(name, phase_s)

    def first_step(self, now: float | None = None) -> None:
        """The first training step begins now (``now``: seconds since the epoch); later
        calls change nothing."""
        if self.first_step_at is None:
            self.first_step_at = time.time() if now is None else now

    def metrics(self) -> dict[str, float]:
        """``startup/<phase>`` for every phase recorded, and, once the first step began,
        ``startup/to_first_step_s`` and ``startup/other_s`` (what no phase accounts for)."""
        out = {PREFIX + name: seconds for name, seconds in self.phases_s.items()}
        out |= {PREFIX + name: seconds for name, seconds in self.within_s.items()}
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
            if name not in OVERLAPPING and name != "first_push_s" and name not in ENGINE_LINES
        )
        return serial + max(side_by_side, default=0.0)


def _add(phases: dict[str, float], name: str, seconds: float) -> None:
    """``seconds`` added to ``phases[name]`` (a name ending in ``_s``)."""
    if not name.endswith("_s"):
        raise ValueError(f"start-up phase {name!r}: names end in '_s' (seconds)")
    phases[name] = phases.get(name, 0.0) + float(seconds)
