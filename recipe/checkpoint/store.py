"""Checkpoint directories of a run: atomic writes, completeness, discovery, resume resolution.

    run_dir/checkpoints/
      step_8/                  complete: COMPLETE was written last, then the directory renamed
        COMPLETE               manifest {"format", "global_step", "param_version", "files"}
        trainer_state.json     step, version, driver RNG, the recipe's loop state
        config.json, *.safetensors, tokenizer files     the policy, HF format
        run_state/             optimizer + LR schedule, per-process RNG, rollouter state
      .step_12.partial/        being written, or left by a crash: never taken (a crash's
                               leftovers are removed at the run's next start: leftover_dirs)
      .step_4.deleting/        pruned (renamed first, then removed)

Write protocol (``write_checkpoint``): fill ``.step_N.partial``; fsync every file and
directory in it; write ``COMPLETE`` listing every file with its size and sha256 (fsynced);
rename the directory to ``step_N``; fsync ``checkpoints/``. A crash at any point leaves either
no ``step_N`` or a complete one, and older checkpoints are pruned only after the rename, so the
previous checkpoint survives any crash of the write. A reader lists a directory only when
``COMPLETE`` parses and every file it lists exists with that size, so a directory damaged
after the fact (half deleted, truncated) is refused too; a resume also hashes the files of the
checkpoint it takes (``verified_checkpoint``), and one whose contents changed is not complete
either: ``auto`` falls back to the one before it, logged. Manifests of format 1 (sizes only)
still read; their files are checked by size alone.

Hashing: sha256 runs at ~1.7 GB/s on one core here (hashlib, SHA extensions; blake2b 0.9,
md5 0.7), faster than the disks checkpoints are read from, so no cheaper hash is needed; files
are hashed on ``HASH_THREADS`` threads (hashlib releases the GIL), at the write (from the page
cache, just written) and once at a resume.

Pure file IO, no torch: ``recipe.config`` uses it to check ``trainer.resume_mode`` at startup.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from recipe.utils.config_check import ConfigError
from recipe.utils.weights_file import file_sha256

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
MARKER = "COMPLETE"
"""Manifest written last into a checkpoint: its presence (and validity) makes it complete."""
STATE_FILE = "trainer_state.json"
"""The driver's state: ``global_step``, ``param_version``, RNG and the recipe's loop state."""
RUN_STATE_DIR = "run_state"
"""Subdirectory of non-HF state: optimizer, LR schedule, RNG per process, rollouter state."""
FORMAT_VERSION = 2
"""2: ``files`` maps each file to ``{"size", "sha256"}``; 1 (still read): to its size."""
HASH_THREADS = 4
_STEP_RE = re.compile(r"step_(\d+)")
_LEFTOVER_RE = re.compile(r"\.step_\d+\.(partial|deleting|replaced)")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step_{step}"


# ---- writing --------------------------------------------------------------------------------


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as JSON and fsync it (inside a partial directory: no rename needed)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f)
        f.flush()
        os.fsync(f.fileno())


def fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file and directory under ``root`` (itself included); returns the files'
    sizes by path relative to ``root``."""
    sizes: dict[str, int] = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                sizes[path.relative_to(root).as_posix()] = os.fstat(fd).st_size
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
    return sizes


def hash_files(root: Path, rel_paths: Iterable[str]) -> dict[str, str]:
    """sha256 (hex) of each file under ``root``, by its relative path."""
    rels = list(rel_paths)
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        return dict(zip(rels, pool.map(lambda rel: file_sha256(root / rel), rels), strict=True))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    run_dir: Path,
    global_step: int,
    param_version: int,
    fill: Callable[[Path], None],
    *,
    keep: int | None = None,
) -> Path:
    """Write ``checkpoints/step_<global_step>/`` atomically (module docstring).

    ``fill(partial_dir)`` writes the contents; ``keep``: complete checkpoints to keep (the
    newest ones; None keeps all). Returns the final directory.
    """
    final = checkpoint_dir(run_dir, global_step)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    fill(partial)
    sizes = fsync_tree(partial)
    checksums = hash_files(partial, sizes)
    manifest = {
        "format": FORMAT_VERSION,
        "global_step": global_step,
        "param_version": param_version,
        "files": {rel: {"size": size, "sha256": checksums[rel]} for rel, size in sizes.items()},
    }
    write_json(partial / MARKER, manifest)
    fsync_dir(partial)
    if final.exists():  # an incomplete leftover, or a step re-done after resuming from older
        _remove(final, ".replaced")
    os.rename(partial, final)
    fsync_dir(final.parent)
    logger.info("checkpoint written: %s", final)
    if keep is not None:
        prune(run_dir, keep)
    return final


def leftover_dirs(run_dir: Path) -> list[Path]:
    """The hidden directories an interrupted write or removal leaves in ``checkpoints/``
    (``.step_N.partial``, ``.deleting``, ``.replaced``; never ``.superseded``, which a resume
    set aside on purpose): nothing resumes from them, and no other process writes them while a
    run starts, so they are removed then."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return sorted(child for child in root.iterdir() if _LEFTOVER_RE.fullmatch(child.name))


def _remove(path: Path, suffix: str) -> None:
    """Remove a directory by renaming it aside first (a crash mid-removal leaves a hidden
    directory, never a half-deleted one under its real name)."""
    doomed = path.with_name(f".{path.name}{suffix}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints; returns what was deleted."""
    doomed = [path for _, path in list_checkpoints(run_dir)[:-keep]] if keep > 0 else []
    for path in doomed:
        _remove(path, ".deleting")
        logger.info("checkpoint pruned: %s", path)
    return doomed


# ---- reading --------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a complete checkpoint; None if ``path`` is not one (no marker, an
    unreadable marker, or a listed file missing or of another size). Checksums are not
    checked here (``verified_checkpoint`` does, once, at a resume)."""
    try:
        manifest = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
        for rel, listed in manifest["files"].items():
            if (Path(path) / rel).stat().st_size != _listed_size(listed):
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return manifest


def _listed_size(listed: Any) -> int:
    # Format 1 lists a file's size; format 2 its size and sha256.
    return listed if isinstance(listed, int) else listed["size"]


def checksum_mismatch(path: Path) -> str | None:
    """Why the complete checkpoint ``path`` does not hold the files its manifest lists (the
    first file whose sha256 differs, named), or None when they all match; None too for a
    format-1 manifest, which has no checksums."""
    manifest = read_manifest(path)
    if manifest is None:
        return f"{MARKER} does not match the files"
    listed = {
        rel: entry["sha256"]
        for rel, entry in manifest["files"].items()
        if isinstance(entry, dict)  # format 1: a size, no checksum
    }
    seen = hash_files(Path(path), listed)
    for rel in sorted(listed):
        if seen[rel] != listed[rel]:
            return (
                f"{rel} has sha256 {seen[rel][:12]}.. but {listed[rel][:12]}.. when written: "
                "its contents changed"
            )
    return None


def is_complete(path: Path) -> bool:
    return read_manifest(path) is not None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(global_step, path) of every complete checkpoint of the run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_RE.fullmatch(child.name)
        if match and child.is_dir() and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run; incomplete directories are skipped."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def read_state(path: Path) -> dict[str, Any]:
    """``trainer_state.json`` of a complete checkpoint."""
    return json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))


def check_checkpoint_path(key: str, value: str) -> Path:
    """``value`` as a complete checkpoint directory; ``ConfigError`` naming key and path else."""
    path = Path(value).expanduser()
    if not path.is_dir():
        reason = "no such directory"
    elif not (path / MARKER).is_file():
        reason = f"not a complete checkpoint (no {MARKER} marker)"
    elif read_manifest(path) is None:
        reason = f"a damaged checkpoint ({MARKER} does not match the files)"
    else:
        return path.resolve()
    raise ConfigError(
        f"{key}={value!r} is invalid: {reason}; allowed 'auto', 'disable' or a "
        f"checkpoints/step_N directory"
    )


def resolve_resume(resume_mode: str, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: ``disable`` None; ``auto`` the newest complete one in
    ``run_dir`` whose files match their checksums (None when there is none); else the path,
    which must be such a checkpoint (``ConfigError`` naming the key and the file else)."""
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        return verified_checkpoint(run_dir)
    path = check_checkpoint_path("trainer.resume_mode", resume_mode)
    problem = checksum_mismatch(path)
    if problem is not None:
        raise ConfigError(
            f"trainer.resume_mode={resume_mode!r} is invalid: a damaged checkpoint ({problem}); "
            "allowed 'auto', 'disable' or a checkpoints/step_N directory"
        )
    return path


def verified_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run whose files match their checksums; a newer
    one that does not is skipped with a warning (the resume falls back to the one before)."""
    for _, path in reversed(list_checkpoints(run_dir)):
        problem = checksum_mismatch(path)
        if problem is None:
            return path
        logger.warning(
            "checkpoint %s is not complete: %s; falling back to the checkpoint before it",
            path,
            problem,
        )
    return None


def set_aside_newer(run_dir: Path, step: int) -> list[Path]:
    """Hide complete checkpoints of ``run_dir`` newer than ``step`` (``.step_M.superseded``):
    a run resumed from an older one must not later resume from the abandoned future."""
    moved = []
    for other_step, path in list_checkpoints(run_dir):
        if other_step > step:
            target = path.with_name(f".{path.name}.superseded")
            shutil.rmtree(target, ignore_errors=True)
            os.rename(path, target)
            moved.append(target)
            logger.warning(
                "checkpoint %s is newer than the resume point: moved to %s", path, target
            )
    return moved
