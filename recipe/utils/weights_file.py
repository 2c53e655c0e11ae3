"""Files of full weights that one process writes and engines on other hosts load.

    writer: write_weights(state_dict, path) -> WeightsFile(path, num_bytes, sha256)
            (written aside as <path>.partial, 0600, then renamed: a reader never sees half;
            what a crash leaves is removed at the run's next start: leftover_weights_files)
            --(Ray: the record, never the tensors)-->
    reader: verify_weights_file(path, sha256) -> the file is the one written, byte for byte,
            or WeightsFileError naming it; then load

The file lives in a directory every node reads (the run directory), so its checksum is what
tells a reader that the copy its node sees (a network filesystem that has not caught up, a
file cut short by a full disk, one rewritten since) is the one its writer recorded.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only in annotations: recipe.checkpoint.store hashes without it
    import torch

_READ_BYTES = 8 << 20
WEIGHTS_SUFFIX = ".safetensors"
PARTIAL_SUFFIX = ".partial"
"""A file being written: renamed to its final name once whole."""


class WeightsFileError(ValueError):
    """A weights file is missing on the reader's node or differs from its writer's record."""


@dataclass(frozen=True, slots=True)
class WeightsFile:
    """A written weights file, as its writer recorded it (travels over Ray)."""

    path: str
    num_bytes: int
    """Bytes of the tensors it holds (not of the file)."""
    sha256: str
    """Of the whole file."""


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def write_weights(state_dict: dict[str, torch.Tensor], path: str | Path) -> WeightsFile:
    """Write ``state_dict`` as one safetensors file at ``path`` (aside, then renamed; 0600:
    these are the model's weights) and record its checksum."""
    from safetensors.torch import save_file

    partial = f"{path}{PARTIAL_SUFFIX}"
    save_file(state_dict, partial)
    os.chmod(partial, 0o600)
    sha256 = file_sha256(partial)
    os.replace(partial, path)
    num_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    return WeightsFile(str(path), num_bytes, sha256)


def verify_weights_file(path: str, sha256: str) -> None:
    """Raise ``WeightsFileError`` unless this node sees ``path`` with the checksum its writer
    recorded (``WeightsFile.sha256``)."""
    if not os.path.isfile(path):
        raise WeightsFileError(
            f"weights file {path} does not exist on this node: its directory must be one "
            "every node reads (a shared filesystem)"
        )
    seen = file_sha256(path)
    if seen != sha256:
        raise WeightsFileError(
            f"weights file {path} has sha256 {seen[:16]}... here but {sha256[:16]}... as "
            "written: it was cut, changed or has not fully reached this node"
        )


def leftover_weights_files(directory: Path) -> list[Path]:
    """The weights files in ``directory`` (a run's exports): every ``*.safetensors`` and
    ``*.safetensors.partial``, left by a process that crashed between write and rename or
    before it removed a file it exported. Ask only while no export is in flight (a run's
    start), when every such file is a leftover; other files are not ours and are left."""
    if not directory.is_dir():
        return []
    suffixes = (WEIGHTS_SUFFIX, WEIGHTS_SUFFIX + PARTIAL_SUFFIX)
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(suffixes))
