"""A study record names the code that ran, also where the checkout's .git is older than its tree."""

import subprocess
from pathlib import Path

import pytest

from recipe.tools.study.provenance import code_changed, code_checksum, data_checksum, git_commit


def make_tree(root: Path) -> None:
    (root / "recipe").mkdir()
    (root / "recipe" / "a.py").write_text("x = 1\n")
    (root / "configs").mkdir()
    (root / "configs" / "c.yaml").write_text("k: 1\n")
    (root / "recipe" / "notes.md").write_text("not code\n")


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_the_code_checksum_follows_code_and_config_bytes_and_ignores_other_files(
    tmp_path: Path,
) -> None:
    make_tree(tmp_path)
    first = code_checksum(tmp_path)
    (tmp_path / "recipe" / "notes.md").write_text("changed\n")
    assert code_checksum(tmp_path) == first
    (tmp_path / "configs" / "c.yaml").write_text("k: 2\n")
    assert code_checksum(tmp_path) != first
    (tmp_path / "configs" / "c.yaml").write_text("k: 1\n")
    (tmp_path / "recipe" / "b.py").write_text("")
    assert code_checksum(tmp_path) != first


def test_a_tree_edited_past_its_commit_says_so(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown" and code_changed(tmp_path) is None
    make_tree(tmp_path)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    assert len(git_commit(tmp_path)) == 40
    assert code_changed(tmp_path) is False
    (tmp_path / "recipe" / "a.py").write_text("x = 2\n")
    assert code_changed(tmp_path) is True


def test_data_checksum_refuses_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        data_checksum(tmp_path / "missing")
