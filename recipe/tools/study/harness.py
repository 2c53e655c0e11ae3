"""The runs of a registered study, in the design's order, each trained, then evaluated off the
clock, its records kept; resumable across machines that lose their files.

    for run in design.runs() (warm-ups, then blocks of alternating mode order):
        a record in <records>/runs/<tag>/record.json   --> done, skipped
        once the warm-up sync run is kept               --> targets.json fixed (design.py), or
                                                            DesignError: no run after it
        less time left before ``deadline_s`` than the mode's longest run so far (or the
        design's timeouts before any)                   --> stop, exit code 3: call again
        train   python -m recipe ... in <out>/<tag>/ with GPU telemetry (its study.log)
        eval    python -m recipe.tools.study.evaluate <out>/<tag> (its eval.log)
        keep    metrics.jsonl, summary.json, config.yaml, snapshots.jsonl, eval.jsonl, the
                planner's projection from the run's phases to 2, 4 and 8 GPUs
                (plan-gpusN.txt) and record.json (mode, seed, order, design, data and
                code checksums, code commit, GPU telemetry, peak GPU memory of the trainer
                and the engine, seconds) into <records>/runs/<tag>/

Every run of a study runs on the cards its first run ran on (``device`` in each record,
``telemetry.device_name``): on a machine with other cards the study stops before any run,
exit code 2, since times measured on two kinds of GPU do not compare.

Only the small records are kept (commit them); run directories can go. A run that was cut
off (no ``summary.json``) is run again from its start in a fresh directory, or resumed from a
checkpoint when the design's overrides set ``trainer.save_freq`` (``resumed`` in its record).
A run or evaluation that fails stops the study with exit code 1, naming its log; nothing of it
is counted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recipe.tools.study.design import RunSpec, StudyDesign, Targets, fix_targets
from recipe.tools.study.evaluate import EVAL_FILE, read_points
from recipe.tools.study.gpu_memory import GpuProcessMemory, peaks
from recipe.tools.study.provenance import code_changed, code_checksum, data_checksum, git_commit
from recipe.tools.study.runs import run_logged
from recipe.tools.study.telemetry import GpuTelemetry, device_name, summarize

RUNS_DIR = "runs"
RECORD_FILE = "record.json"
KEPT = {
    "metrics.jsonl": "metrics.jsonl",
    "summary.json": "summary.json",
    "config.yaml": "config.yaml",
    "snapshots/index.jsonl": "snapshots.jsonl",
    f"snapshots/{EVAL_FILE}": EVAL_FILE,
}
EXIT_MORE = 3
"""Runs remain that did not fit before the deadline: call again."""
OUT_OF_TIME = "out of time"
PROJECT_GPUS = (2, 4, 8)
TRAINED_FILE = "trained.json"
"""In a run directory once its training ended: when it began, its seconds, resumed or not."""


class DeviceMismatch(ValueError):
    """A study continued on other cards than its runs so far ran on."""


class Harness:
    def __init__(
        self,
        design: StudyDesign,
        records: Path,
        out: Path,
        data: str,
        *,
        archive: Path | None = None,
        device: str | None = None,
    ) -> None:
        """``device``: this machine's cards (None: ``device_name()``)."""
        self.design, self.records, self.out, self.data = design, records, out, data
        self.archive = archive
        self.device = device_name() if device is None else device
        self.data_sha256 = data_checksum(Path(data)) if data else ""

    def record_dir(self, spec: RunSpec) -> Path:
        return self.records / RUNS_DIR / spec.tag

    def done(self, spec: RunSpec) -> bool:
        return (self.record_dir(spec) / RECORD_FILE).is_file()

    def run_all(self, deadline_s: float) -> int:
        """Every run not done yet, in order, within ``deadline_s`` seconds from now;
        ``DeviceMismatch`` before any when the study's runs so far ran on other cards."""
        self.check_device()
        end = time.monotonic() + deadline_s
        for spec in self.design.runs():
            if self.done(spec):
                continue
            if not spec.warmup:
                self.targets()
            failed = self.run_one(spec, end)
            if failed == OUT_OF_TIME:
                left = [s for s in self.design.runs() if not self.done(s)]
                need_s = sum(self.estimate_s(p, s.mode) for s in left for p in ("train", "eval"))
                print(f"{len(left)} runs remain (about {need_s:.0f} s): call again", flush=True)
                return EXIT_MORE
            if failed is not None:
                print(f"{spec.tag}: FAILED ({failed})", flush=True)
                return 1
            self.write_archive()
            if spec.warmup and spec.mode == "sync":
                self.targets()  # a warm-up within the noise stops the study here, not later
        return 0

    def check_device(self) -> None:
        """The study's kept runs ran on this machine's cards (the first run fixes them)."""
        for path in sorted((self.records / RUNS_DIR).glob(f"*/{RECORD_FILE}")):
            ran_on = json.loads(path.read_text(encoding="utf-8")).get("device")
            if ran_on is not None and ran_on != self.device:
                raise DeviceMismatch(
                    f"{self.records}: this study's runs ran on {ran_on} ({path.parent.name}), "
                    f"this machine has {self.device}: times on other cards do not compare; run "
                    "it where its runs ran, or register a study of its own for these cards"
                )

    def run_one(self, spec: RunSpec, end: float) -> str | None:
        """Train, evaluate and keep one run, each phase only when its estimate fits before
        ``end`` (``time.monotonic()``); why it failed, ``OUT_OF_TIME``, or None."""
        run_dir = self.out / spec.tag
        resumed = (run_dir / "config.yaml").is_file() and not (run_dir / "summary.json").is_file()
        if resumed and "trainer.save_freq" not in " ".join(self.design.overrides):
            shutil.rmtree(run_dir)  # cut off, no checkpoints: it runs again from its start
            resumed = False
        if not (run_dir / "summary.json").is_file():
            if not self.fits("train", spec, end):
                return OUT_OF_TIME
            started = datetime.now(UTC).isoformat(timespec="seconds")
            with GpuTelemetry(run_dir / "gpu.csv"), GpuProcessMemory(run_dir / "gpu_memory.csv"):
                failed, train_s = run_logged(
                    self.train_command(spec), run_dir, timeout_s=self.design.run_timeout_s
                )
            if failed is not None:
                return f"training: {failed}; see {run_dir}/study.log"
            trained = {"started_utc": started, "train_s": train_s, "resumed": resumed}
            (run_dir / TRAINED_FILE).write_text(json.dumps(trained), encoding="utf-8")
            print(f"{spec.tag}: trained in {train_s:.0f} s", flush=True)
        if not self.fits("eval", spec, end):
            return OUT_OF_TIME
        failed, eval_s = run_logged(
            self.eval_command(run_dir),
            run_dir,
            timeout_s=self.design.eval_timeout_s,
            log_file="eval.log",
            result=f"snapshots/{EVAL_FILE}",
        )
        if failed is not None:
            return f"evaluation: {failed}; see {run_dir}/eval.log"
        print(f"{spec.tag}: evaluated in {eval_s:.0f} s", flush=True)
        self.keep(spec, run_dir, eval_s=eval_s)
        return None

    def fits(self, phase: str, spec: RunSpec, end: float) -> bool:
        """The phase's estimate fits before ``end``; else says so."""
        need, left = self.estimate_s(phase, spec.mode), end - time.monotonic()
        if need <= left:
            return True
        print(
            f"stopping before {spec.tag}'s {phase}: it may take {need:.0f} s, "
            f"{max(left, 0.0):.0f} s left"
        )
        return False

    def train_command(self, spec: RunSpec) -> list[str]:
        return [
            sys.executable,
            "-m",
            "recipe",
            f"mode={spec.mode}",
            "logger.quiet=true",
            f"hydra.run.dir={self.out / spec.tag}",
            f"trainer.seed={spec.seed}",
            f"rollout.seed={spec.seed}",
            *self.design.run_overrides(spec, self.data),
        ]

    def eval_command(self, run_dir: Path) -> list[str]:
        extra = [arg.replace("{data}", self.data) for arg in self.design.eval_overrides]
        return [sys.executable, "-m", "recipe.tools.study.evaluate", str(run_dir), *extra]

    def keep(self, spec: RunSpec, run_dir: Path, *, eval_s: float) -> None:
        """Copy the run's small records, then write record.json (last: it marks done)."""
        dest = self.record_dir(spec)
        dest.mkdir(parents=True, exist_ok=True)
        for source, name in KEPT.items():
            if (run_dir / source).is_file():
                shutil.copyfile(run_dir / source, dest / name)
        self.project(run_dir, dest)
        trained = json.loads((run_dir / TRAINED_FILE).read_text(encoding="utf-8"))
        record: dict[str, Any] = {
            "tag": spec.tag,
            "mode": spec.mode,
            "seed": spec.seed,
            "warmup": spec.warmup,
            "order": spec.order,
            "started_utc": trained["started_utc"],
            "seconds": {"train": trained["train_s"], "eval": eval_s},
            "resumed": trained["resumed"],
            "design_sha256": self.design.sha256,
            "data_sha256": self.data_sha256,
            "commit": git_commit(),
            "code_changed": code_changed(),
            "code_sha256": code_checksum(),
            "device": self.device,
            "gpu": summarize(run_dir / "gpu.csv"),
            "gpu_memory_mib": peaks(run_dir / "gpu_memory.csv"),
        }
        tmp = dest / f".{RECORD_FILE}.partial"
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        tmp.replace(dest / RECORD_FILE)

    def project(self, run_dir: Path, dest: Path) -> None:
        """The planner's projection from this run's measured phases (``python -m
        recipe.tools.plan --run``) for each of ``PROJECT_GPUS``, kept as ``plan-gpusN.txt``: a
        projection, stated as one, for the day more GPUs are lent."""
        if not (run_dir / "trace.json").is_file():
            return  # the planner reads the run's phases off its trace
        for gpus in PROJECT_GPUS:
            cmd = [
                sys.executable,
                "-m",
                "recipe.tools.plan",
                "--run",
                str(run_dir),
                f"--gpus={gpus}",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            text = proc.stdout if proc.returncode == 0 else f"planner failed:\n{proc.stderr}"
            (dest / f"plan-gpus{gpus}.txt").write_text(text, encoding="utf-8")

    def write_archive(self) -> None:
        """The records as one ``.tar.gz`` at ``archive`` (when set), replaced atomically
        after each kept run: what a machine that loses its files hands back."""
        if self.archive is None:
            return
        self.archive.parent.mkdir(parents=True, exist_ok=True)
        partial = self.archive.with_name(f".{self.archive.name}.partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(self.records, arcname=str(self.records))
        partial.replace(self.archive)

    def estimate_s(self, phase: str, mode: str) -> float:
        """1.1 x the longest ``phase`` (train, eval) of a kept run of ``mode``; before any,
        the design's limit for it."""
        taken = []
        for path in (self.records / RUNS_DIR).glob(f"*/{RECORD_FILE}"):
            record = json.loads(path.read_text(encoding="utf-8"))
            if record["mode"] == mode:
                taken.append(record["seconds"][phase])
        if taken:
            return 1.1 * max(taken)
        return self.design.run_timeout_s if phase == "train" else self.design.eval_timeout_s

    def targets(self) -> Targets:
        """Fixed from the warm-up sync run (once; design.py)."""
        warmup = RunSpec("sync", self.design.warmup_seed, True, 0)
        points = read_points(self.record_dir(warmup) / EVAL_FILE)
        if len(points) < 2:
            raise ValueError(f"{self.record_dir(warmup)}: the warm-up sync run has no evaluation")
        return fix_targets(
            self.design,
            initial=points[0].accuracy,
            final=points[-1].accuracy,
            clock_s=points[-1].clock_s,
            records=self.records,
        )
