"""A time-to-accuracy study's design, fixed before its runs (``configs/study/<name>.yaml``).

    configs/study/<name>.yaml --register--> <records>/design.json  (committed before any run)
    the warm-up runs (one per mode, discarded)  --targets rule--> <records>/targets.json
    the measured runs, in blocks that alternate the modes' order:
        seed 0: sync, fully_async    seed 1: fully_async, sync    seed 2: sync, ...

Once registered, a design does not change: registering another content under the same
records fails, naming the key that differs. The targets are fixed by a rule written in the
design and applied to the warm-up runs only (``warmup_gain``: the initial accuracy plus each
fraction of the warm-up sync run's gain, so the targets lie on the rising part of the curve),
or given outright (``fixed``); either way ``targets.json`` is written once, before the first
measured run, and never again. The budgets at which accuracy is compared are fractions of
the warm-up sync run's training clock, fixed with the targets.

Every run of the study gets ``overrides`` plus its mode's ``mode_overrides``,
``trainer.snapshot_samples=snapshot_samples``, no validation in the run (``trainer.test_freq=0``,
``trainer.val_before_train=false``, ``trainer.val_after_train=false``: accuracy comes from the
snapshots, off the clock) and its seed; ``{data}`` in an override is the study's data folder
(``data=`` on the command line). A design with ``segment_s`` trains each run in segments
(``trainer.max_wall_s`` and ``trainer.save_freq`` set by the study per segment).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

DESIGN_FILE = "design.json"
TARGETS_FILE = "targets.json"
TARGET_RULES = ("warmup_gain", "fixed")
MODES = ("sync", "one_step_off", "fully_async")
PER_RUN_KEYS = (
    "mode",
    "trainer.seed",
    "rollout.seed",
    "hydra.run.dir",
    "trainer.snapshot_samples",
    "actor.n_gpus_per_node",
    "rollout.n_gpus_per_node",
)


SEGMENT_KEYS = ("trainer.max_wall_s", "trainer.save_freq")
SEGMENT_SAVE_FREQ = 1_000_000_000
"""``trainer.save_freq`` of a segmented run: no periodic checkpoint, only the one at each
segment's end (and the run's)."""


class DesignError(ValueError):
    """A design that cannot run, or that differs from the one registered."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of the study, in the order the harness runs them."""

    mode: str
    seed: int
    warmup: bool
    order: int

    @property
    def tag(self) -> str:
        return f"{'warmup-' if self.warmup else ''}{self.mode}-seed{self.seed}"


@dataclass(frozen=True)
class StudyDesign:
    name: str
    question: str
    modes: list[str]
    seeds: list[int]
    warmup_seed: int
    snapshot_samples: int
    overrides: list[str]
    target_rule: str
    target_values: list[float]
    """``warmup_gain``: fractions of the warm-up sync run's gain; ``fixed``: accuracies."""
    budget_fractions: list[float]
    """Of the warm-up sync run's training clock: where accuracies are compared."""
    mode_overrides: dict[str, list[str]] = field(default_factory=dict)
    eval_overrides: list[str] = field(default_factory=list)
    min_warmup_gain: float = 0.0
    """The warm-up sync run's accuracy gain below which no targets are fixed (a gain within
    the evaluation's noise puts every target there too): e.g. 3 binomial standard errors."""
    gpus: int = 1
    """GPUs per run. sync colocates its trainer and engines on all of them; the async modes
    give ``async_trainer_gpus`` to the trainer and the rest to the engines. At 1 every mode
    shares the one GPU (the engines take ``rollout.gpu_memory_utilization`` of it)."""
    async_trainer_gpus: int | None = None
    """Trainer GPUs of the async modes when ``gpus`` > 1 (None: half)."""
    run_timeout_s: float = 540.0
    """Seconds one training process may take (start-up and shutdown included)."""
    eval_timeout_s: float = 540.0
    segment_s: float | None = None
    """A run longer than one process may take trains in segments: segment k stops once the
    run has trained k x ``segment_s`` seconds (``trainer.max_wall_s``, across resumes) with
    a checkpoint, which segment k + 1 resumes (recipe/run/snapshots.py: the training clock
    goes on across them). For a machine with a limit per call. None: one process a run."""
    bootstrap_resamples: int = 10_000
    bootstrap_seed: int = 0

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.modes) - set(MODES)):
            raise DesignError(f"modes: unknown {unknown}; known {list(MODES)}")
        if "sync" not in self.modes or len(self.modes) < 2:
            raise DesignError("modes: sync (the baseline) and at least one other mode")
        if len(set(self.seeds)) != len(self.seeds) or self.warmup_seed in self.seeds:
            raise DesignError("seeds: distinct, and warmup_seed not among them")
        if self.snapshot_samples <= 0:
            raise DesignError("snapshot_samples: a positive number of trained samples")
        if self.target_rule not in TARGET_RULES or not self.target_values:
            raise DesignError(f"targets: rule one of {TARGET_RULES}, with values")
        if self.target_rule == "warmup_gain" and not all(0 < f < 1 for f in self.target_values):
            raise DesignError("targets: warmup_gain fractions lie strictly between 0 and 1")
        trainer_gpus = self.async_trainer_gpus or self.gpus // 2
        if self.gpus > 1 and not 0 < trainer_gpus < self.gpus:
            raise DesignError(f"async_trainer_gpus: between 1 and gpus - 1 = {self.gpus - 1}")
        for arg in [*self.overrides, *self.eval_overrides]:
            if arg.partition("=")[0] in PER_RUN_KEYS:
                raise DesignError(f"overrides: {arg!r} is set by the study per run")
        if self.segment_s is not None:
            self.check_segments(self.segment_s)

    def check_segments(self, segment_s: float) -> None:
        """Segments need a run's length in steps and leave its budget and saves to the study."""
        if not 0 < segment_s < self.run_timeout_s:
            raise DesignError(f"segment_s: between 0 and run_timeout_s={self.run_timeout_s}")
        keys = {arg.partition("=")[0] for arg in self.overrides}
        if "trainer.total_training_steps" not in keys:
            raise DesignError("segment_s: set trainer.total_training_steps (a run's end)")
        if set_by_study := sorted(keys & set(SEGMENT_KEYS)):
            raise DesignError(f"overrides: {set_by_study} are set by the study per segment")

    @classmethod
    def load(cls, path: Path) -> StudyDesign:
        """From ``configs/study/<name>.yaml``; DesignError naming what is wrong."""
        if not Path(path).is_file():
            raise DesignError(f"{path}: no such design file")
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if not isinstance(raw, dict):
            raise DesignError(f"{path}: not a mapping")
        fields = {str(key): value for key, value in raw.items()}
        targets = fields.pop("targets", None) or {}
        try:
            return cls(
                target_rule=targets.get("rule", ""),
                target_values=[float(v) for v in targets.get("values", [])],
                **fields,
            )
        except TypeError as exc:
            raise DesignError(f"{path}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        """The registered form. ``segment_s`` at None is left out: designs registered before
        the key keep their file and checksum."""
        fields = asdict(self)
        if fields["segment_s"] is None:
            del fields["segment_s"]
        return fields

    @property
    def total_steps(self) -> int:
        """``trainer.total_training_steps`` of the overrides (0: not set)."""
        for arg in self.overrides:
            key, _, value = arg.partition("=")
            if key == "trainer.total_training_steps":
                return int(value)
        return 0

    @property
    def sha256(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def runs(self) -> list[RunSpec]:
        """Warm-ups first, then the seeds in blocks of alternating mode order."""
        specs = [RunSpec(m, self.warmup_seed, True, i) for i, m in enumerate(self.modes)]
        for block, seed in enumerate(self.seeds):
            order = self.modes if block % 2 == 0 else list(reversed(self.modes))
            specs += [RunSpec(m, seed, False, len(specs) + i) for i, m in enumerate(order)]
        return specs

    def run_overrides(self, spec: RunSpec, data: str, segment: int = 0) -> list[str]:
        """Everything a run is given besides ``mode=``, its seeds and its directory;
        ``segment``: which of a segmented run's processes (from 1; 0: not segmented)."""
        own = [*self.overrides, *self.mode_overrides.get(spec.mode, [])]
        fixed = [
            f"trainer.snapshot_samples={self.snapshot_samples}",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.val_after_train=false",
            *self.gpu_overrides(spec.mode),
        ]
        if segment and self.segment_s is not None:
            budget = segment * self.segment_s
            fixed += [f"trainer.max_wall_s={budget:g}", f"trainer.save_freq={SEGMENT_SAVE_FREQ}"]
        return [arg.replace("{data}", data) for arg in [*own, *fixed]]

    def gpu_overrides(self, mode: str) -> list[str]:
        """How ``mode`` lays its trainer and engines on ``gpus`` GPUs (none at 1)."""
        if self.gpus == 1:
            return []
        trainer = self.gpus if mode == "sync" else self.async_trainer_gpus or self.gpus // 2
        engines = self.gpus if mode == "sync" else self.gpus - trainer
        return [f"actor.n_gpus_per_node={trainer}", f"rollout.n_gpus_per_node={engines}"]


def register(design: StudyDesign, records: Path) -> Path:
    """Write ``records/design.json``; the same content again is a no-op, another content a
    DesignError naming the first key that differs."""
    records.mkdir(parents=True, exist_ok=True)
    path = records / DESIGN_FILE
    new = design.to_json()
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old != new:
            key = next(k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k))
            raise DesignError(
                f"{path}: registered with another {key!r} ({old.get(key)!r}, now "
                f"{new.get(key)!r}); a changed design is a new study: give it another name"
            )
        return path
    path.write_text(json.dumps(new, indent=1) + "\n", encoding="utf-8")
    return path


def registered(records: Path) -> StudyDesign:
    path = records / DESIGN_FILE
    if not path.is_file():
        raise DesignError(
            f"{path}: no design registered (python -m recipe.tools.study register ...)"
        )
    return StudyDesign(**json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True, slots=True)
class Targets:
    """Fixed once the warm-up sync run is kept, before any other run (``targets.json``)."""

    accuracies: list[float]
    budgets_s: list[float]
    basis: dict[str, float]
    """What the rule was applied to (the warm-up sync run's initial and final accuracy and
    its training clock)."""


def fix_targets(
    design: StudyDesign, initial: float, final: float, clock_s: float, records: Path
) -> Targets:
    """Apply the design's rule to the warm-up sync run and write ``targets.json`` (once: an
    existing file is returned as it is)."""
    path = records / TARGETS_FILE
    if path.is_file():
        return Targets(**json.loads(path.read_text(encoding="utf-8")))
    if design.target_rule == "fixed":
        accuracies = list(design.target_values)
    else:
        if final - initial <= design.min_warmup_gain:
            raise DesignError(
                f"warm-up sync run: accuracy {initial:.3f} -> {final:.3f}, a gain not above "
                f"min_warmup_gain={design.min_warmup_gain}: no target on a rising curve can "
                "be fixed (train longer, change the task, or register another design)"
            )
        accuracies = [round(initial + f * (final - initial), 4) for f in design.target_values]
    targets = Targets(
        accuracies=accuracies,
        budgets_s=[round(f * clock_s, 1) for f in design.budget_fractions],
        basis={"initial": initial, "final": final, "clock_s": clock_s},
    )
    path.write_text(json.dumps(asdict(targets), indent=1) + "\n", encoding="utf-8")
    return targets
