"""``WeightSnapshots``: the policy's weights every ``trainer.snapshot_samples`` trained samples,
with the training clock at that point, to be evaluated after the run, off the clock.

    end of a trainer step, trained samples crossed a multiple of k
        --> ranks.export_weights(snapshots/samples_<S>.safetensors)   (aside, then renamed)
        --> snapshots/index.jsonl += {samples, step, version, clock_s, export_s, file, sha256}

``clock_s`` is the run's training clock: seconds since the fit began (``TrainingRun.begin``,
before the first generation in every mode), across resumes, minus the time the trainer spent
blocked in work a study must not charge to a mode: these exports and validations run inside
the loop (sync, one_step_off). So two modes compare by when their weights existed, not by how
often they validated or exported. A study evaluates the files afterwards
(``python -m recipe.tools.study.evaluate``) and may delete them; the index stays.

A resumed run keeps the index lines up to its checkpoint's step; later lines (and their files)
came from steps that are trained again, and are dropped (a fresh start drops them all).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.checkpoint.run_logs import truncate_jsonl
from recipe.utils.weights_file import WeightsFile

logger = logging.getLogger(__name__)

SNAPSHOT_DIR = "snapshots"
INDEX_FILE = "index.jsonl"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One exported policy, as ``index.jsonl`` records it."""

    samples: int
    """Trained samples (responses) when it was taken."""
    step: int
    version: int
    """The weights version the engines served then (the trainer's weights may be newer: in
    fully_async a version spans ``trigger_parameter_sync_step`` steps)."""
    clock_s: float
    """The run's training clock at the end of ``step`` (module docstring)."""
    export_s: float
    file: str
    """Its name in ``snapshots/``."""
    num_bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def read_index(run_dir: Path) -> list[Snapshot]:
    """The snapshots a run took, in order (empty when it took none)."""
    path = Path(run_dir) / SNAPSHOT_DIR / INDEX_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Snapshot.from_json(json.loads(line)) for line in lines if line.strip()]


class WeightSnapshots:
    """Exports due at step ends (see the module docstring)."""

    def __init__(self, every: int, run_dir: Path, *, resumed_step: int = 0) -> None:
        self.every = every
        self.directory = Path(run_dir) / SNAPSHOT_DIR
        # A fresh start (step 0) keeps nothing of an earlier attempt in this directory.
        truncate_jsonl(self.directory / INDEX_FILE, resumed_step)
        taken = read_index(run_dir)
        self._drop_files_not_in(taken)
        self.last_samples = taken[-1].samples if taken else 0

    def due(self, num_samples: int) -> bool:
        """The trained samples crossed a multiple of ``every`` since the last snapshot."""
        return self.every > 0 and num_samples // self.every > self.last_samples // self.every

    def take(
        self,
        export: Callable[[str], WeightsFile],
        *,
        samples: int,
        step: int,
        version: int,
        clock_s: float,
    ) -> Snapshot:
        """Export the weights through ``export(path)`` and append the index line."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"samples_{samples:09d}.safetensors"
        start = time.perf_counter()
        weights = export(str(self.directory / name))
        snapshot = Snapshot(
            samples=samples,
            step=step,
            version=version,
            clock_s=clock_s,
            export_s=time.perf_counter() - start,
            file=name,
            num_bytes=weights.num_bytes,
            sha256=weights.sha256,
        )
        with (self.directory / INDEX_FILE).open("a", encoding="utf-8") as index:
            index.write(json.dumps(snapshot.to_json()) + "\n")
            index.flush()
            os.fsync(index.fileno())
        self.last_samples = samples
        logger.info(
            "snapshot at %d samples (step %d, clock %.1f s) in %.2f s",
            samples,
            step,
            clock_s,
            snapshot.export_s,
        )
        return snapshot

    def _drop_files_not_in(self, taken: list[Snapshot]) -> None:
        """Weights files of steps after the resumed checkpoint (trained again)."""
        if not self.directory.is_dir():
            return
        keep = {s.file for s in taken}
        for path in self.directory.glob("samples_*.safetensors*"):
            if path.name not in keep:
                path.unlink(missing_ok=True)
