"""The runs of a registered study, in the design's order, each trained, then evaluated off the
clock, its records kept; resumable across machines that lose their files.

    for run in design.runs() (warm-ups, then blocks of alternating mode order):
        a record in <records>/runs/<tag>/record.json   --> done, skipped
        once the warm-up sync run is kept               --> targets.json fixed (design.py), or
                                                            DesignError: no run after it
        less time left before ``deadline_s`` than the mode's longest run so far (or the
        design's timeouts before any)                   --> stop, exit code 3: call again
        train   python -m recipe ... in <out>/<tag>/ with GPU telemetry (its study.log), or
                with the design's ``segment_s``, segment by segment (study-<k>.log), each
                one process that stops with a checkpoint the next resumes
        eval    python -m recipe.tools.study.evaluate <out>/<tag> (its eval.log)
        keep    metrics.jsonl, summary.json, config.yaml, snapshots.jsonl, eval.jsonl, the
                planner's projection from the run's phases to 2, 4 and 8 GPUs
                (plan-gpusN.txt) and record.json (mode, seed, order, design, data and
                code checksums, code commit, GPU telemetry, peak GPU memory of the trainer
                and the engine, seconds) into <records>/runs/<tag>/

Every run of a study runs on the cards its first run ran on (``device`` in each record,
``telemetry.device_name``): on a machine with other cards the study stops before any run,
exit code 2, since times measured on two kinds of GPU do not compare.

Only the small records are kept (commit them); run directories can go, once their runs are
kept: a segmented run's next segment needs its directory (a machine that loses its files
between calls must train a run within the calls it keeps them). A run that was cut off (no
``trained.json``) is run again from its start in a fresh directory, or resumed from a
checkpoint when it is segmented or the design's overrides set ``trainer.save_freq``
(``resumed`` in its record; ``segments``: its processes).
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
from recipe.tools.study.runs import LOG_FILE, run_logged
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
"""In a run directory once a training process ended: when the run began, each process's
seconds and their sum, resumed or not, complete or not (segments remain)."""


def read_trained(run_dir: Path) -> dict[str, Any]:
    """The run directory's ``trained.json`` (empty: none yet). One written before runs
    trained in segments is a complete run's."""
    path = run_dir / TRAINED_FILE
    if not path.is_file():
        return {}
    trained: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    trained.setdefault("complete", True)
    return trained


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
        failed = self.train(spec, run_dir, end)
        if failed is not None:
            return failed
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

    def train(self, spec: RunSpec, run_dir: Path, end: float) -> str | None:
        """Train ``spec`` to its last step: in one process, or segment by segment (the
        design's ``segment_s``), each resuming the checkpoint the one before ended with and
        started only when its estimate fits before ``end``. Why it failed, ``OUT_OF_TIME``,
        or None once ``trained.json`` says the training is complete."""
        trained = read_trained(run_dir)
        if trained.get("complete"):
            return None
        segmented = self.design.segment_s is not None
        cut_off = (run_dir / "config.yaml").is_file() and not trained
        if cut_off and not segmented and "trainer.save_freq" not in " ".join(self.design.overrides):
            shutil.rmtree(run_dir)  # cut off, no checkpoints: it runs again from its start
            cut_off = False
        trained.setdefault("started_utc", datetime.now(UTC).isoformat(timespec="seconds"))
        trained.setdefault("segments_s", [])
        trained["resumed"] = trained.get("resumed", False) or cut_off
        while not trained.get("complete"):
            if not self.fits("train", spec, end):
                return OUT_OF_TIME
            segment = len(trained["segments_s"]) + 1 if segmented else 0
            log = f"study-{segment}.log" if segmented else LOG_FILE
            with GpuTelemetry(run_dir / "gpu.csv"), GpuProcessMemory(run_dir / "gpu_memory.csv"):
                failed, seconds = run_logged(
                    self.train_command(spec, segment),
                    run_dir,
                    timeout_s=self.design.run_timeout_s,
                    log_file=log,
                )
            if failed is not None:
                return f"training: {failed}; see {run_dir}/{log}"
            trained["segments_s"].append(seconds)
            trained["train_s"] = sum(trained["segments_s"])
            trained["complete"] = self.complete(run_dir, segment)
            trained["resumed"] = trained["resumed"] or segment > 1
            (run_dir / TRAINED_FILE).write_text(json.dumps(trained), encoding="utf-8")
            what = f"segment {segment}" if segmented else "trained"
            print(f"{spec.tag}: {what} in {seconds:.0f} s", flush=True)
        return None

    def complete(self, run_dir: Path, segment: int) -> bool:
        """Whether the run reached its last step; an earlier segment's ``summary.json`` is
        kept aside as ``summary-<segment>.json`` (the last one covers the whole run)."""
        if not segment:
            return True
        summary = run_dir / "summary.json"
        steps = int(json.loads(summary.read_text(encoding="utf-8")).get("steps", 0))
        if steps >= self.design.total_steps:
            return True
        summary.replace(run_dir / f"summary-{segment}.json")
        return False

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

    def train_command(self, spec: RunSpec, segment: int = 0) -> list[str]:
        return [
            sys.executable,
            "-m",
            "recipe",
            f"mode={spec.mode}",
            "logger.quiet=true",
            f"hydra.run.dir={self.out / spec.tag}",
            f"trainer.seed={spec.seed}",
            f"rollout.seed={spec.seed}",
            *self.design.run_overrides(spec, self.data, segment),
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
            "seconds": {
                "train": trained["train_s"],
                "eval": eval_s,
                "train_process_max": max(trained.get("segments_s") or [trained["train_s"]]),
            },
            "resumed": trained["resumed"],
            "segments": len(trained.get("segments_s") or [None]),
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
        """1.1 x the longest ``phase`` (eval, or one training process: a run or a segment)
        of a kept run of ``mode``; before any, the design's limit for it."""
        taken = []
        for path in (self.records / RUNS_DIR).glob(f"*/{RECORD_FILE}"):
            record = json.loads(path.read_text(encoding="utf-8"))
            if record["mode"] == mode:
                seconds = record["seconds"]
                key = "train_process_max" if phase == "train" else phase
                taken.append(seconds.get(key, seconds[phase]))
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
