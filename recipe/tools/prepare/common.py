"""Shared steps of the dataset preparers: read a source file, write a parquet file atomically.

A preparer turns a dataset as its authors published it into parquet files in verl's row schema
(``recipe.data.loaders`` documents it). Every failure is a ``PrepareError`` whose message
names the file (and line) to fix, so the command line can print it as one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from recipe.data.loaders import DataError, iter_jsonl_objects


class PrepareError(ValueError):
    """Bad input to a preparer: a missing or malformed source file, an unusable output
    folder. The message names the path (and line) at fault."""


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of ``path``; line numbers are
    1-based, as an editor shows them, and errors name them."""
    if not path.is_file():
        raise PrepareError(f"{path}: source file not found")
    try:
        rows = list(iter_jsonl_objects(path))
    except DataError as err:
        raise PrepareError(str(err)) from err
    if not rows:
        raise PrepareError(f"{path}: the file holds no rows")
    return rows


def ensure_out_dir(out_dir: Path) -> None:
    """Create ``out_dir`` (and its parents) unless it exists as a folder."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepareError(f"{out_dir}: the output folder is a file")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PrepareError(f"{out_dir}: cannot create the output folder: {err}") from err


def write_parquet_atomic(rows: list[dict[str, Any]], path: Path, schema: Any) -> None:
    """Write ``rows`` with the Arrow ``schema`` to ``path``: a temporary file in the same
    folder, then a rename, so ``path`` is either the old file or the whole new one (never
    half written, even if the process dies)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    # Hidden and unique per process; created by pyarrow, so it gets the umask's permissions.
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp_path)
        os.replace(tmp_path, path)  # atomic within one file system
    except OSError as err:
        raise PrepareError(f"{path}: cannot write the file: {err}") from err
    finally:
        tmp_path.unlink(missing_ok=True)  # gone already after a successful rename


def write_jsonl_atomic(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` as JSON lines to ``path`` the way ``write_parquet_atomic`` writes (a
    temporary file, then a rename): for machines without pyarrow."""
    tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp_path.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp_path, path)
    except OSError as err:
        raise PrepareError(f"{path}: cannot write the file: {err}") from err
    finally:
        tmp_path.unlink(missing_ok=True)
