"""Turn published datasets into parquet files in verl's row schema.

    python -m recipe.tools.prepare NAME SRC_DIR OUT_DIR [--levels L,..] [--holdout N]

    SRC_DIR (the files as the dataset's authors publish them)
        --PREPARERS[NAME].read--> rows of each split, all checked
        --keep_levels, hold_out--> the levels asked for; N train rows moved to ``heldout``
        --write_parquet_atomic--> OUT_DIR/<split>.parquet

A preparer is a name, the Arrow schema of its rows and a function from the source folder to
the rows of each split. Every source row is read and checked before anything is written, so
bad input leaves OUT_DIR as it was; each file is written to a temporary name and renamed.
The files load with ``recipe.data.loaders.load_records`` and are scored by the scorer
registered for their ``data_source``. To add a dataset, add its module and one entry to
``PREPARERS``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.tools.prepare import gsm8k, math
from recipe.tools.prepare.common import (
    PrepareError,
    ensure_out_dir,
    write_jsonl_atomic,
    write_parquet_atomic,
)

logger = logging.getLogger(__name__)

__all__ = ["PREPARERS", "PrepareError", "Preparer", "prepare"]


@dataclass(frozen=True, slots=True)
class Preparer:
    """How one dataset is prepared."""

    description: str
    """One line for ``--help``: where the source comes from and what it holds."""
    read: Callable[[Path], dict[str, list[dict[str, Any]]]]
    """Source folder -> rows of each split (the split names the output file)."""
    schema: Callable[[], Any]
    """The Arrow schema of the rows (a function: pyarrow is imported only when writing)."""


FORMATS = ("parquet", "jsonl")

PREPARERS: Mapping[str, Preparer] = {
    "gsm8k": Preparer(
        description="OpenAI's grade-school-math/data/{train,test}.jsonl",
        read=gsm8k.prepare_gsm8k,
        schema=gsm8k.row_schema,
    ),
    "math": Preparer(
        description="MATH train and MATH-500 as DeepScaleR publishes them, {train,test}.json",
        read=math.prepare_math,
        schema=math.row_schema,
    ),
}


def prepare(
    name: str,
    src_dir: Path,
    out_dir: Path,
    *,
    levels: Collection[int] | None = None,
    holdout: int = 0,
    holdout_seed: int = 0,
    file_format: str = "parquet",
) -> dict[Path, int]:
    """Prepare dataset ``name`` from ``src_dir`` into ``out_dir``; the rows written per file.
    ``levels``: keep only rows whose ``extra_info["level"]`` is one of them (None: all);
    ``holdout``: move that many train rows, drawn with ``holdout_seed``, to a ``heldout``
    split (a test set from the training distribution: same levels, same sources);
    ``file_format``: ``parquet`` or ``jsonl`` (the same rows, one JSON object a line).

    Raises ``PrepareError`` for an unknown name, a missing or malformed source, an
    ``out_dir`` that is a file, ``levels`` that leave a split empty or that the rows
    do not carry, or a ``holdout`` that would leave no train row.
    """
    if file_format not in FORMATS:
        raise PrepareError(f"format {file_format!r}: expected one of {', '.join(FORMATS)}")
    preparer = PREPARERS.get(name)
    if preparer is None:
        raise PrepareError(f"unknown dataset {name!r}; known: {', '.join(sorted(PREPARERS))}")
    if out_dir.exists() and not out_dir.is_dir():
        raise PrepareError(f"{out_dir}: the output folder is a file")
    splits = preparer.read(src_dir)  # everything is checked before the first write
    if levels is not None:
        splits = {split: keep_levels(rows, levels, name, split) for split, rows in splits.items()}
    if holdout:
        splits = hold_out(splits, holdout, holdout_seed, name)
    ensure_out_dir(out_dir)
    written = {}
    for split, rows in splits.items():
        path = out_dir / f"{split}.{file_format}"
        if file_format == "jsonl":
            write_jsonl_atomic(rows, path)
        else:
            write_parquet_atomic(rows, path, preparer.schema())
        written[path] = len(rows)
    return written


def keep_levels(
    rows: list[dict[str, Any]], levels: Collection[int], name: str, split: str
) -> list[dict[str, Any]]:
    """The rows of ``split`` whose ``extra_info["level"]`` is in ``levels``."""
    if rows and "level" not in (rows[0].get("extra_info") or {}):
        raise PrepareError(f"--levels: the rows of {name!r} carry no level")
    kept = [row for row in rows if row["extra_info"]["level"] in levels]
    if not kept:
        raise PrepareError(f"--levels {sorted(levels)}: no {split} row of {name!r} is left")
    logger.info("--levels %s: %d of %d %s rows kept", sorted(levels), len(kept), len(rows), split)
    return kept


def hold_out(
    splits: dict[str, list[dict[str, Any]]], count: int, seed: int, name: str
) -> dict[str, list[dict[str, Any]]]:
    """``splits`` with ``count`` train rows, drawn uniformly with ``seed``, moved to a
    ``heldout`` split; both keep the source's row order (the draw does not depend on it)."""
    train = splits.get("train")
    if train is None:
        raise PrepareError(f"--holdout: {name!r} has no train split")
    if "heldout" in splits:
        raise PrepareError(f"--holdout: {name!r} already has a heldout split")
    if not 0 < count < len(train):
        raise PrepareError(
            f"--holdout {count}: expected 1 to {len(train) - 1} (the train split has "
            f"{len(train)} rows and must keep one)"
        )
    drawn = set(random.Random(seed).sample(range(len(train)), count))
    kept = [row for index, row in enumerate(train) if index not in drawn]
    heldout = [row for index, row in enumerate(train) if index in drawn]
    logger.info("--holdout %d (seed %d): %d train rows kept", count, seed, len(kept))
    return splits | {"train": kept, "heldout": heldout}
