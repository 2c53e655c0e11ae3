"""``RunCheckpointer``: a run's checkpoints, its resume, and the prompt ledger they rewind.

    startup   resolve trainer.resume_mode --> check the checkpoint fits this run (mode, the
              prompt sets' fingerprints: recipe/data/fingerprint.py) --> rewind the run
              directory to it: metrics.jsonl and ledger.jsonl lose the steps after it, newer
              checkpoints are set aside (a fresh start keeps an earlier attempt's logs as
              <name>.prev)
    each step ledger.jsonl += the prompts trained (record_trained)
    a push    every trainer.save_freq versions and after the last step: save() writes
              checkpoints/step_N/ atomically (recipe/checkpoint/store.py)
    resume    load() puts the weights, optimizer, schedule and RNG back into the trainer group
              and returns trainer_state.json; the recipe takes its step and version from it

The rewind runs in ``__init__``, before the Tracker opens metrics.jsonl for appending; first,
what an earlier process of the run left half done is removed: weights files exported for
engines (``.weights/``, written aside as ``*.partial``; gigabytes each) and interrupted
checkpoint directories (``checkpoints/.step_N.partial``, ``.deleting``, ``.replaced``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.checkpoint.ledger import LEDGER_FILE, StepLedger
from recipe.checkpoint.rng import capture_rng, restore_rng
from recipe.checkpoint.run_logs import truncate_jsonl
from recipe.checkpoint.store import (
    RUN_STATE_DIR,
    STATE_FILE,
    leftover_dirs,
    read_state,
    resolve_resume,
    set_aside_newer,
    write_checkpoint,
    write_json,
)
from recipe.data.fingerprint import FINGERPRINTS_KEY, fingerprint_mismatch, prompt_fingerprints
from recipe.observability.backends import METRICS_FILE
from recipe.protocol import PromptRecord
from recipe.utils.weights_file import WeightsFile, leftover_weights_files

if TYPE_CHECKING:
    from recipe.config import RecipeConfig
    from recipe.workers.trainer.ranks import TrainerRanks

logger = logging.getLogger(__name__)
MAX_NAMES_LOGGED = 5


class RunCheckpointer:
    """Checkpoints and resume of one run directory (see the module docstring)."""

    def __init__(
        self,
        cfg: RecipeConfig,
        run_dir: Path,
        *,
        train: Sequence[PromptRecord],
        val: Sequence[PromptRecord],
    ) -> None:
        self.mode, self.trainer_cfg = cfg.mode, cfg.trainer
        self._model_cfg, self._lora = cfg.model, cfg.actor.lora.enabled
        self.run_dir = Path(run_dir)
        self.num_train_prompts = len(train)
        self.fingerprints = prompt_fingerprints(train, val)
        """Of the ``train`` and ``val`` prompt sets: saved in every checkpoint, checked on
        resume."""
        self.resume_from: Path | None = None
        """The checkpoint this run resumes from (``trainer.resume_mode``), or None."""
        self.resume_state: dict[str, Any] = {}
        """Its ``trainer_state.json`` (empty when not resuming)."""
        self._sweep_leftovers()
        self._rewind()
        self.ledger = StepLedger(self.run_dir)
        """``ledger.jsonl``: the prompts each trainer step trained."""

    @property
    def resumed_step(self) -> int:
        """The trainer step the run resumed at (0: a fresh start)."""
        return int(self.resume_state.get("global_step", 0))

    def should_save(self, version: int, *, last: bool = False) -> bool:
        """Every ``trainer.save_freq`` weight versions (= trainer steps in the batch recipes,
        which push once per step), and after the last step; asked right after a push."""
        freq = self.trainer_cfg.save_freq
        return freq > 0 and (version % freq == 0 or last)

    def record_trained(
        self,
        step: int,
        version: int,
        prompt_uids: Sequence[str],
        filtered_uids: Sequence[str] = (),
        skipped_uids: Sequence[str] = (),
    ) -> None:
        """One ``ledger.jsonl`` line: the prompts trained at ``step`` (and those filtered or
        skipped)."""
        self.ledger.append(step, version, prompt_uids, filtered_uids, skipped_uids)

    def save(
        self,
        ranks: TrainerRanks,
        *,
        step: int,
        version: int,
        state: dict[str, Any],
        extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """``checkpoints/step_N/``, written atomically: the HF-format policy, optimizer + LR
        schedule + RNG of every trainer rank, and ``trainer_state.json`` (step, version,
        driver RNG and the recipe's ``state``). ``extra(run_state_dir)`` adds a recipe's
        own files."""
        start = time.perf_counter()

        def fill(partial: Path) -> None:
            ranks.save_hf(partial)
            ranks.save_train_state(partial / RUN_STATE_DIR)
            if extra is not None:
                extra(partial / RUN_STATE_DIR)
            meta = {
                "format": 1,
                "mode": self.mode,
                "global_step": step,
                "param_version": version,
                "num_train_prompts": self.num_train_prompts,
                FINGERPRINTS_KEY: self.fingerprints,
                "rng": capture_rng(),
                **state,
            }
            write_json(partial / STATE_FILE, meta)

        final = write_checkpoint(
            self.run_dir, step, version, fill, keep=self.trainer_cfg.max_ckpt_to_keep
        )
        logger.info("checkpoint of step %d took %.2f s", step, time.perf_counter() - start)
        return final

    def load(self, ranks: TrainerRanks) -> dict[str, Any]:
        """Load ``resume_from`` into ``ranks`` (weights, optimizer, schedule, RNG) and
        this process's RNG; returns ``trainer_state.json`` (``global_step``,
        ``param_version`` and the recipe's loop state)."""
        assert self.resume_from is not None, "load() only when resuming"
        start = time.perf_counter()
        ranks.load_hf(self.resume_from)
        ranks.load_train_state(self.resume_from / RUN_STATE_DIR)
        restore_rng(self.resume_state["rng"])
        logger.info("trainer state loaded in %.2f s", time.perf_counter() - start)
        return self.resume_state

    def _sweep_leftovers(self) -> None:
        """Remove what an earlier process of this run left half done: weights files it
        exported for engines (``.weights/``, ``*.partial`` among them) and interrupted
        checkpoint directories; logged once, with the bytes freed. Nothing is in flight yet."""
        doomed = leftover_weights_files(self.run_dir / EXPORT_DIR) + leftover_dirs(self.run_dir)
        if not doomed:
            return
        num_bytes = sum(_num_bytes(path) for path in doomed)
        for path in doomed:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        names = [str(path.relative_to(self.run_dir)) for path in doomed]
        logger.info(
            "removed %d leftovers of an earlier process of this run, %d bytes (%.2f GiB) freed: %s",
            len(doomed),
            num_bytes,
            num_bytes / 2**30,
            ", ".join(names[:MAX_NAMES_LOGGED])
            + (", ..." if len(names) > MAX_NAMES_LOGGED else ""),
        )

    def _rewind(self) -> None:
        """Resolve ``trainer.resume_mode`` and rewind the run directory (module docstring).
        Raises ValueError (startup) when the checkpoint does not fit this run."""
        path = resolve_resume(self.trainer_cfg.resume_mode, self.run_dir)
        if path is None:
            if self.trainer_cfg.resume_mode == "auto":
                logger.info(
                    "trainer.resume_mode=auto: no checkpoint in %s, starting fresh", self.run_dir
                )
            self._keep_earlier_logs()
            return
        state = read_state(path)
        expected = {"mode": self.mode, "num_train_prompts": self.num_train_prompts}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"trainer.resume_mode={str(path)!r}: the checkpoint has {key}="
                    f"{state.get(key)!r}, this run {value!r}"
                )
        self._check_prompts(path, state)
        self._check_adapter_base(path)
        step = state["global_step"]
        for name in (METRICS_FILE, LEDGER_FILE):
            num_dropped = truncate_jsonl(self.run_dir / name, step)
            if num_dropped:
                logger.info(
                    "resuming at step %d: %d lines of %s dropped (the steps after it, trained "
                    "again, and a torn last line if any)",
                    step,
                    num_dropped,
                    name,
                )
        set_aside_newer(self.run_dir, step)
        self.resume_from, self.resume_state = path, state
        logger.info("resuming from %s (step %d, version %d)", path, step, state["param_version"])

    def _check_adapter_base(self, path: Path) -> None:
        """ValueError (one line, exit code 2 at startup) when a LoRA checkpoint resumes
        without LoRA or onto another base, or a full checkpoint resumes with LoRA."""
        from recipe.model import HFModelConfig
        from recipe.workers.trainer.lora import BASE_RECORD_NAME, base_record, check_same_base

        has_adapter = (path / BASE_RECORD_NAME).is_file()
        if has_adapter != self._lora:
            held = "a LoRA adapter" if has_adapter else "the whole model"
            raise ValueError(
                f"trainer.resume_mode={str(path)!r}: the checkpoint holds {held} but this run "
                f"has actor.lora.rank{'>0' if self._lora else '=0'}"
            )
        if has_adapter:
            base = HFModelConfig.from_config(self._model_cfg).path
            check_same_base(path, base_record(str(base)))

    def _check_prompts(self, path: Path, state: dict[str, Any]) -> None:
        """ValueError (one line, exit code 2 at startup) when this run's prompt sets are not
        the checkpoint's: its uids would name other prompts."""
        saved = state.get(FINGERPRINTS_KEY)
        if saved is None:
            logger.warning(
                "checkpoint %s holds no prompt fingerprints (written by an older version): "
                "this run's prompts cannot be checked against its; resume with the same data",
                path,
            )
            return
        mismatch = fingerprint_mismatch(saved, self.fingerprints, str(path))
        if mismatch is not None:
            raise ValueError(mismatch)

    def _keep_earlier_logs(self) -> None:
        # A fresh start never appends to the logs of an earlier attempt in this directory
        # (e.g. one killed before its first checkpoint): they are kept as <name>.prev.
        for name in (METRICS_FILE, LEDGER_FILE):
            log = self.run_dir / name
            if log.is_file() and log.stat().st_size > 0:
                log.replace(log.with_name(f"{name}.prev"))
                logger.warning("starting fresh: the earlier %s is now %s.prev", name, name)


def _num_bytes(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size
    return sum(
        (Path(dirpath) / name).stat().st_size
        for dirpath, _, names in os.walk(path)
        for name in names
    )


EXPORT_DIR = ".weights"
"""Under the run directory: full weights written for engines that load a file."""


@contextlib.contextmanager
def exported_weights(
    ranks: TrainerRanks, run_dir: Path, tag: str, *, slot: str | None = None
) -> Iterator[WeightsFile]:
    """The trainer's weights (or those saved in CPU ``slot``) as one safetensors file, for
    engines that load a file (a resume, a restarted replica), with the checksum a reader
    verifies before loading it; removed on exit.

    The file lives under the run directory, which every node reads (checked at startup on
    several hosts), not in trainer rank 0's node-local shared memory, which an engine on
    another host cannot see; in a directory only the run's user may enter (0700), with a
    name no other process can guess, written 0600."""
    directory = Path(run_dir) / EXPORT_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)  # mkdir's mode is cut by the umask and ignored for an old dir
    path = directory / f"{tag}-{uuid.uuid4().hex}.safetensors"
    try:
        yield ranks.export_weights(str(path), slot=slot)
    finally:
        path.unlink(missing_ok=True)
