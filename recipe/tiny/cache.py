"""The cache of built models: one folder per builder fingerprint, built once in a child
process with pinned numerics (``BUILD_ENV``), under a file lock, published by atomic rename.

``$RECIPE_CACHE_DIR`` (default ``~/.cache/fully_async_rl``) holds the folders; each has a
``tiny_meta.json`` with the build record, written last, so a folder with one is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

META_FILE = "tiny_meta.json"
DEFAULT_CACHE_DIR = Path("~/.cache/fully_async_rl")
LOCK_TIMEOUT_S = 900.0


# Read when torch, OpenMP and MKL initialise, hence set for a child process, not in this one.
BUILD_ENV = {
    # ATen's vectorised kernels (softmax, norms, exp, attention): AVX2, not the host's best
    # (AVX-512 where present), whose different reduction widths change the low bits.
    "ATEN_CPU_CAPABILITY": "avx2",
    # MKL's GEMMs dispatch on CPU vendor and ISA, also in its CNR mode's ISA branches (on AMD
    # those fall back to AUTO); COMPATIBLE (SSE2) is the branch that is the same everywhere.
    # It doubles the SFT's time.
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",  # no set order is known to reach the model; pinned so none can
}


def default_cache_dir() -> Path:
    """``$RECIPE_CACHE_DIR`` if set, else ``~/.cache/fully_async_rl``."""
    return Path(os.environ.get("RECIPE_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()


def ensure_cached(
    dir_name: str,
    builder: str,
    cache_dir: Path | None,
    *,
    force: bool = False,
    builder_args: tuple[str, ...] = (),
) -> Path:
    """``cache_dir / dir_name``, built first (when missing, or with ``force``) by
    ``python -m builder --build-into TMP *builder_args`` in a child with ``BUILD_ENV``, under
    a file lock, published by atomic rename (see ``ensure_tiny_model``)."""
    from filelock import FileLock, Timeout

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / dir_name
    if (final / META_FILE).is_file() and not force:
        return final
    lock = FileLock(str(root / f"{dir_name}.lock"))
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT_S):
            if (final / META_FILE).is_file() and not force:
                return final  # another process built it while we waited
            tmp = Path(tempfile.mkdtemp(prefix=f".{dir_name}-", dir=root))
            try:
                build_in_child(tmp, builder, builder_args)
                publish_dir(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except Timeout as exc:
        raise RuntimeError(
            f"waited {LOCK_TIMEOUT_S:.0f}s for {lock.lock_file}: another process holds it; "
            f"if none is building {dir_name}, delete the lock file"
        ) from exc
    return final


def build_in_child(
    out_dir: Path, builder: str = "recipe.tiny", builder_args: tuple[str, ...] = ()
) -> None:
    """Build into ``out_dir`` with ``python -m builder`` in a fresh process with ``BUILD_ENV``."""
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **BUILD_ENV, "PYTHONPATH": python_path}
    cmd = [sys.executable, "-m", builder, "--build-into", str(out_dir), *builder_args]
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building {out_dir.name} failed (exit {proc.returncode}); its log is above. "
            f"To retry by hand: {' '.join(cmd)}"
        )


def publish_dir(src: Path, dst: Path) -> None:
    """Make ``src`` world-readable (workers may run as other users) and rename it to ``dst``."""
    src.chmod(0o755)
    for child in src.iterdir():
        child.chmod(0o644)
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():  # only with force: a reader may briefly miss the folder, never see half
        os.rename(dst, old)
    os.rename(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def read_tiny_meta(model_dir: Path) -> dict[str, Any]:
    """The build record (``tiny_meta.json``) of a tiny-model directory."""
    return json.loads((Path(model_dir) / META_FILE).read_text())


def weights_sha256(model_dir: Path) -> str:
    """sha256 over the saved tensors' names and raw bytes in name order (not the file's bytes,
    whose header layout may change with the safetensors version)."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        for name in sorted(f.keys()):
            tensor = f.get_tensor(name).contiguous()
            digest.update(name.encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def check_build_env(logger: Any, what: str) -> str:
    """The ATen CPU capability; warns when the numerics are not ``BUILD_ENV``'s (a build run
    by hand without it), since the weights may then differ from other hosts' builds."""
    import torch

    pinned = {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    cpu_capability = torch.backends.cpu.get_cpu_capability()
    if pinned != {k: BUILD_ENV[k] for k in pinned} or cpu_capability != "AVX2":
        logger.warning(
            "%s built with %s and ATen CPU capability %s, not BUILD_ENV's: its weights "
            "may differ from other hosts' builds",
            what,
            pinned,
            cpu_capability,
        )
    return cpu_capability


def save_built_model(
    model: Any, out_dir: Path, meta: dict[str, Any], *, started: float, cpu_capability: str
) -> dict[str, Any]:
    """Save ``model`` (weights, generation config) into ``out_dir``, then ``META_FILE``: ``meta``
    plus the build's own record (weights digest, seconds, versions, numerics). The meta file
    is written last: a folder that has one is complete."""
    import torch
    import transformers

    model.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    meta = {
        **meta,
        "weights_sha256": weights_sha256(out_dir),
        "build_seconds": round(time.perf_counter() - started, 2),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cpu_capability": cpu_capability,
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def builder_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    ensure: Callable[..., Path],
    build: Callable[[argparse.Namespace], None],
    child_args: tuple[str, ...] = (),
) -> None:
    """The command line of a builder module: show the cached model (built once), or, with
    ``--build-into`` (and ``child_args``, all paths), build as ``ensure_cached``'s child."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $RECIPE_CACHE_DIR")
    parser.add_argument(
        "--build-into",
        type=Path,
        default=None,
        help="build into this empty folder in this process, as the cache's child does "
        "(set BUILD_ENV first for a reproducible build)",
    )
    for name in child_args:
        parser.add_argument(name, type=Path, default=None, help="(with --build-into)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.build_into is not None:
        missing = [n for n in child_args if getattr(args, n.lstrip("-").replace("-", "_")) is None]
        if missing:
            parser.error(f"--build-into needs {', '.join(missing)}")
        build(args)
        return
    path = ensure(args.cache_dir, force=args.force)
    print(path)
    print(json.dumps(read_tiny_meta(path), indent=2))
