"""The runs of a registered study, in the design's order, each trained, then evaluated off the
clock, its records kept; resumable across machines that lose their files.

    for run in design.runs() (warm-ups, then blocks of alternating mode order):
        a record in <records>/runs/<tag>/record.json   --> done, skipped
        once the warm-up sync run is kept               --> targets.json fixed (design.py), or
                                                            DesignError: no run after it
        less time left before ``deadline_s`` than the phase's estimate (estimates.py: the
        mode's longest so far, a segmented run's own speed, the design's timeouts before
        any)                                            --> stop, exit code 3: call again
        ``volatile`` (the machine's files go at the deadline): a run not begun starts only
        when its training and its evaluation both fit   --> else stop, exit code 3
        train   python -m recipe ... in <out>/<tag>/ with GPU telemetry (its study.log), or
                with the design's ``segment_s``, segment by segment (study-<k>.log), each
                one process that stops with a checkpoint the next resumes
        eval    python -m recipe.tools.study.evaluate <out>/<tag> (its eval.log); with
                ``EVAL_MIN_S`` left but not its estimate, what fits, and the next call
                scores the rest (eval-<k>.log; evaluated.json: each call's seconds)
        keep    the run's small records (keeping.py) and record.json (mode, seed, order,
                design, data and code checksums, code commit, GPU telemetry, peak GPU
                memory of the trainer and the engine, seconds) into <records>/runs/<tag>/

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
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recipe.tools.study.design import RunSpec, StudyDesign, Targets, fix_targets
from recipe.tools.study.estimates import (
    EVAL_MIN_S,
    RECORD_FILE,
    RUNS_DIR,
    mode_estimate_s,
    segment_estimate_s,
)
from recipe.tools.study.evaluate import EVAL_FILE, read_points
from recipe.tools.study.gpu_memory import GpuProcessMemory, peaks
from recipe.tools.study.keeping import keep_run, write_archive
from recipe.tools.study.provenance import code_changed, code_checksum, data_checksum, git_commit
from recipe.tools.study.runs import LOG_FILE, TIMED_OUT, run_logged
from recipe.tools.study.telemetry import GpuTelemetry, device_name, summarize

EXIT_MORE = 3
"""Runs remain that did not fit before the deadline: call again."""
OUT_OF_TIME = "out of time"
EVALUATED_FILE = "evaluated.json"
"""In a run directory once an evaluation ran: the seconds of each call that scored its
snapshots (an evaluation cut at a call's deadline goes on in the next)."""
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
        volatile: bool = False,
    ) -> None:
        """``device``: this machine's cards (None: ``device_name()``). ``volatile``: the
        machine loses its files at the deadline, snapshots with them, so a run trained but
        not evaluated by then is lost: a run starts only when both phases fit."""
        self.design, self.records, self.out, self.data = design, records, out, data
        self.archive, self.volatile = archive, volatile
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
            try:
                if spec.warmup and spec.mode == "sync":
                    self.targets()  # a warm-up within the noise stops the study here, not later
            finally:
                self.write_archive()  # the record, and the targets it fixed
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
        if self.volatile and not read_trained(run_dir):
            whole_s = self.estimate_s("train", spec.mode) + self.estimate_s("eval", spec.mode)
            if not self.fits("training and evaluation", spec, end, need_s=whole_s):
                return OUT_OF_TIME
        failed = self.train(spec, run_dir, end)
        if failed is not None:
            return failed
        failed = self.evaluate(spec, run_dir, end)
        if failed is not None:
            return failed
        calls_s = json.loads((run_dir / EVALUATED_FILE).read_text(encoding="utf-8"))
        print(f"{spec.tag}: evaluated in {sum(calls_s):.0f} s", flush=True)
        self.keep(spec, run_dir, eval_s=sum(calls_s))
        return None

    def evaluate(self, spec: RunSpec, run_dir: Path, end: float) -> str | None:
        """Score the run's snapshots: all of them when the estimate fits before ``end``, else
        as many as the time left allows when that is ``EVAL_MIN_S`` or more (an evaluation
        resumes where it stopped). Each call's seconds go to ``evaluated.json``. Why it
        failed (nothing of it counts then), ``OUT_OF_TIME``, or None once all are scored."""
        timeout_s = self.design.eval_timeout_s
        if not self.fits("eval", spec, end):
            left = end - time.monotonic()
            if left < EVAL_MIN_S:
                return OUT_OF_TIME
            timeout_s = min(timeout_s, left)
            print(
                f"{spec.tag}: evaluating for those {left:.0f} s; the next call goes on", flush=True
            )
        path = run_dir / EVALUATED_FILE
        calls_s = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        log = "eval.log" if not calls_s else f"eval-{len(calls_s) + 1}.log"
        failed, seconds = run_logged(
            self.eval_command(run_dir),
            run_dir,
            timeout_s=timeout_s,
            log_file=log,
            result=f"snapshots/{EVAL_FILE}",
        )
        cut = timeout_s < self.design.eval_timeout_s
        if failed is not None and cut and failed.startswith(TIMED_OUT):
            failed = OUT_OF_TIME  # cut at the deadline: its points are kept, the rest follow
        if failed is not None and failed != OUT_OF_TIME:
            path.unlink(missing_ok=True)
            return f"evaluation: {failed}; see {run_dir}/{log}"
        path.write_text(json.dumps([*calls_s, seconds]), encoding="utf-8")
        return failed

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
            own = segment_estimate_s(run_dir, trained, self.design.total_steps)
            if not self.fits("train", spec, end, need_s=own):
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

    def fits(self, phase: str, spec: RunSpec, end: float, *, need_s: float | None = None) -> bool:
        """The phase's estimate (``need_s``, else the mode's) fits before ``end``; else says
        so."""
        need = self.estimate_s(phase, spec.mode) if need_s is None else need_s
        left = end - time.monotonic()
        if need <= left:
            return True
        print(
            f"{spec.tag}'s {phase} may take {need:.0f} s, {max(left, 0.0):.0f} s left",
            flush=True,
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
        """The run's records into the study's (``keeping.keep_run``); record.json last."""
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
        keep_run(run_dir, self.record_dir(spec), record)

    def write_archive(self) -> None:
        """The records as one ``.tar.gz`` at ``archive``, when set (``keeping``)."""
        if self.archive is not None:
            write_archive(self.records, self.archive)

    def estimate_s(self, phase: str, mode: str) -> float:
        """``estimates.mode_estimate_s`` for this study's records."""
        return mode_estimate_s(self.records, self.design, phase, mode)

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
