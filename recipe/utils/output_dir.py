"""The run directory must be writable, and that is checked before anything starts.

Hydra creates ``hydra.run.dir`` itself before the recipe runs, and a failure there ends in
Hydra's own traceback. ``OutputDirCheck`` is a Hydra callback (registered in
``configs/config.yaml``) that runs first: it creates the directory and writes a probe file
into it, and on failure prints one line naming the directory and exits with code 2 (the
bad-input code of ``python -m recipe``; ``RECIPE_DEBUG=1`` raises instead).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class OutputDirError(ValueError):
    """The run directory cannot be created or written. The message names it."""


def check_writable_dir(path: Path, key: str) -> None:
    """Create ``path`` (parents too) and write a probe file into it; ``OutputDirError``
    naming ``key``, the directory and the part that failed otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
        raise OutputDirError(
            f"{key}={str(path)!r}: the output directory is not writable{where}: "
            f"{exc.strerror or exc}; set {key} to a writable directory"
        ) from None


class OutputDirCheck(Callback):
    """Hydra callback: refuse an unwritable ``hydra.run.dir`` / ``hydra.sweep.dir`` up front."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.sweep.dir")


def _check(config: DictConfig, key: str) -> None:
    path = Path(str(OmegaConf.select(config, key))).expanduser()
    try:
        check_writable_dir(path, key)
    except OutputDirError as exc:
        if os.environ.get("RECIPE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
