"""What a study's run ran on: checksums of its data and code, and the code's commit.

A machine that gets a copy of the working tree (a lent GPU) may carry a ``.git`` older than
the tree, so ``git rev-parse HEAD`` alone can name a commit that is not the code that ran:
``code_sha256`` identifies the code itself (the same at any checkout of the same files), and
``code_changed`` says whether the tree differs from the commit named.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE_DIRS = ("recipe", "fully_async_policy", "one_step_off", "configs")
"""The folders a run's code and configuration come from."""
CODE_SUFFIXES = (".py", ".yaml")


def data_checksum(folder: Path) -> str:
    """sha256 over the files of the study's data folder (names and bytes, sorted)."""
    if not folder.is_dir():
        raise ValueError(f"data={folder}: not a folder")
    return _tree_checksum(folder, sorted(p for p in folder.rglob("*") if p.is_file()))


def code_checksum(root: Path = ROOT) -> str:
    """sha256 over the code and configuration files under ``CODE_DIRS`` (names and bytes)."""
    files = [
        path
        for name in CODE_DIRS
        for path in (root / name).rglob("*")
        if path.suffix in CODE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
    ]
    return _tree_checksum(root, sorted(files))


def git_commit(root: Path = ROOT) -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    proc = _git(root, "rev-parse", "HEAD")
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def code_changed(root: Path = ROOT) -> bool | None:
    """Whether the code under ``CODE_DIRS`` differs from the commit (None: no git)."""
    proc = _git(root, "status", "--porcelain", "--", *CODE_DIRS)
    return bool(proc.stdout.strip()) if proc.returncode == 0 else None


def _tree_checksum(base: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=root)
