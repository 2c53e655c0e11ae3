"""``ci/offline_bundle.sh``: files packed into parts of a bounded size come back whole on the
other side, and a missing or damaged part is one line and exit code 2, never a partial tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "offline_bundle.sh"
MIB = 1 << 20


def bundle(*args: str | Path, cwd: Path, part_mib: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "PART_MIB": str(part_mib), "PYTHON": sys.executable}
    cmd = ["bash", str(SCRIPT), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def carry(parts: Path, there: Path) -> None:
    """What a transfer does: every pNN folder's files copied into one folder."""
    there.mkdir()
    for folder in sorted(parts.iterdir()):
        for item in folder.iterdir():
            shutil.copy(item, there / item.name)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A folder of 2.5 MiB of random bytes (three 1 MiB parts) and a small file beside it."""
    src = tmp_path / "src"
    (src / "wheels" / "sub").mkdir(parents=True)
    (src / "wheels" / "sub" / "big.bin").write_bytes(os.urandom(5 * MIB // 2))
    (src / "data.jsonl").write_text('{"q": 1}\n')
    return src


def test_parts_of_a_bounded_size_unpack_to_the_same_files(tree: Path, tmp_path: Path) -> None:
    # Relative paths, read from the caller's directory.
    packed = bundle("pack", "parts", "src/wheels", "src/data.jsonl", cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    folders = sorted((tmp_path / "parts").iterdir())
    assert [f.name for f in folders] == ["p01", "p02", "p03"]
    for folder in folders:
        (part,) = folder.glob("bundle.tar.part*")
        assert part.stat().st_size <= MIB and (folder / "SHA256SUMS").is_file()
    carry(tmp_path / "parts", tmp_path / "there")
    unpacked = bundle("unpack", "there", "dest", cwd=tmp_path)
    assert unpacked.returncode == 0, unpacked.stderr
    dest = tmp_path / "dest"
    big = "wheels/sub/big.bin"
    assert (dest / big).read_bytes() == (tree / big).read_bytes()
    assert (dest / "data.jsonl").read_text() == '{"q": 1}\n'
    assert not (tmp_path / "there" / "bundle.tar").exists()


@pytest.mark.parametrize("damage", ["missing", "flipped"])
def test_a_missing_or_damaged_part_fails_in_one_line_and_unpacks_nothing(
    tree: Path, tmp_path: Path, damage: str
) -> None:
    assert bundle("pack", tmp_path / "parts", tree / "wheels", cwd=tmp_path).returncode == 0
    carry(tmp_path / "parts", tmp_path / "there")
    second = tmp_path / "there" / "bundle.tar.part01"
    if damage == "missing":
        second.unlink()
    else:
        data = bytearray(second.read_bytes())
        data[100] ^= 0xFF
        second.write_bytes(bytes(data))
    result = bundle("unpack", tmp_path / "there", tmp_path / "dest", cwd=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("offline_bundle:")]
    assert lines == [
        f"offline_bundle: unpack: the joined parts in {tmp_path / 'there'} fail their checksum "
        "(a part missing or damaged)"
    ]
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "usage:"),
        (("pack", "out"), "usage: pack OUT PATH..."),
        (("pack", "out", "nowhere"), "pack: nowhere does not exist"),
        (("unpack", "empty", "dest"), "unpack: no SHA256SUMS in empty"),
        (("wheels", "no-such-model", "w"), "no catalog model 'no-such-model'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_code_2(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    result = bundle(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
