"""``python -m recipe.tools.study.evaluate RUN_DIR [key=value ...]``: every weights snapshot a run
took (``trainer.snapshot_samples``), evaluated after the run, off its clock.

    RUN_DIR/config.yaml (the run's resolved config) + key=value --> one sync-mode set of
    engines (no trainer), started once
    for each snapshot in RUN_DIR/snapshots/index.jsonl, and the initial weights first:
        engines load it (checksum verified) --> validation on data.val_files (greedy at
        rollout.val_temperature=0, the run's scorer, multi-turn agents as in training)
        --> RUN_DIR/snapshots/eval.jsonl += {samples, step, clock_s, accuracy, ...}
        --> the weights file is deleted (keep=true keeps it)

The evaluation shares nothing with the run's clock: each point's ``clock_s`` is the training
clock at which its weights existed. Points already in ``eval.jsonl`` are not evaluated again,
so an evaluation stopped part way continues where it stopped. Overrides name what differs from
training, typically the whole test set (``data.val_files=[...] data.val_max_samples=-1``) and
its response limit. The engines' records (metrics.jsonl, trace.json) go to ``RUN_DIR/eval/``.
Bad input (no run directory, no snapshots, a bad override): one line, exit code 2.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.batch_trainer import validation
from recipe.config import RecipeConfig, load_config
from recipe.observability.trace import traced
from recipe.run.inputs import RunInputs
from recipe.run.placement import Placement
from recipe.run.snapshots import INDEX_FILE, SNAPSHOT_DIR, Snapshot, read_index
from recipe.run.training_run import TrainingRun
from recipe.tools.cli import exit_on_help, fail, parse_pairs
from recipe.utils.weights_file import WeightsFile

logger = logging.getLogger(__name__)

EVAL_FILE = "eval.jsonl"
EVAL_DIR = "eval"
FIXED = (
    "mode=sync",  # engines only: no trainer ranks, no rollouter
    "trainer.snapshot_samples=0",
    "trainer.resume_mode=disable",
    "trainer.val_before_train=false",
    "rollout.val_temperature=0.0",
    "actor.lora.rank=0",  # a LoRA run's snapshots hold the merged policy: full weights
)
"""What every evaluation sets (a ``key=value`` may add to it, not change these)."""


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """One evaluated policy: a snapshot, or the initial weights (samples 0, clock 0)."""

    samples: int
    step: int
    clock_s: float
    accuracy: float
    num_prompts: int
    response_length_mean: float
    clip_ratio: float
    eval_s: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalPoint:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


def read_points(path: Path) -> list[EvalPoint]:
    """The points of an ``eval.jsonl`` (a run's ``snapshots/eval.jsonl``, or the copy a
    study keeps), by trained samples; none when it does not exist yet."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    points = [EvalPoint.from_json(json.loads(line)) for line in lines if line.strip()]
    return sorted(points, key=lambda p: p.samples)


def eval_config(run_dir: Path, overrides: list[str]) -> RecipeConfig:
    """The run's resolved config with ``FIXED`` and ``overrides`` on top; ValueError (a
    ConfigError) naming a bad key."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: not found (RUN_DIR must be a run directory of python -m recipe)")
    saved = OmegaConf.load(path)
    if not isinstance(saved, DictConfig):
        raise ValueError(f"{path}: not a run's config (a mapping)")
    saved.pop("model_provenance", None)
    for arg in overrides:
        if arg.partition("=")[0] in {f.partition("=")[0] for f in FIXED}:
            raise ValueError(f"{arg}: set by the evaluation itself ({' '.join(FIXED)})")
    merged = OmegaConf.merge(saved, OmegaConf.from_dotlist([*FIXED, *overrides]))
    assert isinstance(merged, DictConfig)
    return load_config(merged)


class SnapshotEvaluator:
    """The engines of a sync run, without a trainer: they load each snapshot and validate."""

    def __init__(self, cfg: RecipeConfig, run_dir: Path) -> None:
        self.cfg, self.inputs = cfg, RunInputs.load(cfg)
        eval_dir = Path(run_dir) / EVAL_DIR
        eval_dir.mkdir(parents=True, exist_ok=True)
        self.run = TrainingRun(
            cfg, eval_dir, train=self.inputs.train_records, val=self.inputs.val_records
        )
        self.tracer = self.run.tracer
        self.placement = Placement(cfg, eval_dir)
        self.version = 0
        self.source = Path(run_dir)
        self.eval_file = self.source / SNAPSHOT_DIR / EVAL_FILE
        assert self.inputs.model is not None
        self.rollout = self.placement.start_engines(self.inputs.model)

    def close(self) -> None:
        """The records (the engines' last trace events among them), then the engines."""
        self.run.close([self.rollout.drain_trace])
        self.rollout.shutdown()
        self.placement.release()

    @traced("validate")
    def _validate(self) -> dict[str, float]:
        return validation(self.rollout, self.inputs, self.cfg.rollout, self.version)

    def evaluate_all(self, *, keep: bool = False) -> list[EvalPoint]:
        """Evaluate the initial weights and every snapshot not in ``eval.jsonl`` yet."""
        done = {p.samples for p in read_points(self.eval_file)}
        snapshots = read_index(self.source)
        if 0 not in done:
            self._record(self._evaluate(samples=0, step=0, clock_s=0.0))
        for number, snapshot in enumerate(snapshots, start=1):
            if snapshot.samples in done:
                continue
            self._load(snapshot, version=number)
            self._record(
                self._evaluate(
                    samples=snapshot.samples, step=snapshot.step, clock_s=snapshot.clock_s
                )
            )
            if not keep:
                (self.source / SNAPSHOT_DIR / snapshot.file).unlink(missing_ok=True)
        return read_points(self.eval_file)

    def _load(self, snapshot: Snapshot, *, version: int) -> None:
        path = self.source / SNAPSHOT_DIR / snapshot.file
        if not path.is_file():
            raise ValueError(
                f"{path}: the weights of the snapshot at {snapshot.samples} samples are gone "
                f"and it has no point in {EVAL_FILE}"
            )
        self.rollout.update_weights_from_file(
            WeightsFile(str(path), snapshot.num_bytes, snapshot.sha256), version
        )
        self.version = version

    def _evaluate(self, *, samples: int, step: int, clock_s: float) -> EvalPoint:
        start = time.perf_counter()
        val = self._validate()
        point = EvalPoint(
            samples=samples,
            step=step,
            clock_s=clock_s,
            accuracy=val["val/accuracy"],
            num_prompts=int(val["val/num_prompts"]),
            response_length_mean=val["val/response_length_mean"],
            clip_ratio=val["response/clip_ratio"],
            eval_s=time.perf_counter() - start,
        )
        logger.info("samples %d: accuracy %.4f (%.1f s)", samples, point.accuracy, point.eval_s)
        return point

    def _record(self, point: EvalPoint) -> None:
        with self.eval_file.open("a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(point)) + "\n")


def evaluate_run(run_dir: Path, overrides: list[str], *, keep: bool = False) -> list[EvalPoint]:
    """Evaluate ``run_dir``'s snapshots (module docstring); returns every point."""
    if not (Path(run_dir) / SNAPSHOT_DIR / INDEX_FILE).is_file():
        raise ValueError(
            f"{run_dir}: no {SNAPSHOT_DIR}/{INDEX_FILE} (run it with trainer.snapshot_samples=K)"
        )
    evaluator = SnapshotEvaluator(eval_config(run_dir, overrides), run_dir)
    try:
        return evaluator.evaluate_all(keep=keep)
    finally:
        evaluator.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not argv or "=" in argv[0]:
        exit_on_help(argv, __doc__)
        fail("give the run directory first: python -m recipe.tools.study.evaluate RUN_DIR ...")
    (run_dir_arg,), pairs = parse_pairs(argv, __doc__, num_positional=1)
    run_dir, keep = Path(run_dir_arg), ("keep", "true") in pairs
    overrides = [f"{k}={v}" for k, v in pairs if k != "keep"]
    try:
        points = evaluate_run(run_dir, overrides, keep=keep)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for p in points:
        print(f"samples {p.samples:>8}  clock {p.clock_s:8.1f} s  accuracy {p.accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
