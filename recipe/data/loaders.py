"""Load user datasets (parquet / JSON Lines) in verl's row schema into ``PromptRecord``s.

A row looks like the rows verl's data preprocessing scripts write::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],      # or a plain string
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"index": 3, ...}}                      # optional, passed through

Everything is validated at load time, so a bad row fails at startup with the file, the row
and the field named, not in the middle of a run. Row numbers are explicit about their base:
parquet rows are 0-based indices ("row 3"), JSON Lines rows are 1-based line numbers
("line 4") because that is what an editor shows.

The uid of a record is ``f"{split}:{basename}:{row}"`` with ``row`` the 0-based record index
in its file; it is stable across restarts as long as the file is unchanged, which is what the
exactly-once prompt ledger needs.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from recipe.protocol import ChatMessages, PromptRecord

logger = logging.getLogger(__name__)

PARQUET_EXTENSIONS = (".parquet",)
JSONL_EXTENSIONS = (".jsonl", ".jsonlines", ".ndjson")


class DataError(ValueError):
    """A dataset file is missing, unreadable or holds a malformed row. The message names it."""


class _RowError(Exception):
    """A malformed field; turned into a ``DataError`` naming file and row by the caller."""


def load_records(files: list[str], *, split: str, prompt_key: str = "prompt") -> list[PromptRecord]:
    """Read every row of ``files`` (in order) as ``PromptRecord``s of ``split``.

    Raises ``DataError`` for a missing file, an unknown extension, an unreadable file, a file
    without rows, or a malformed row (naming file, row and field).
    """
    if not files:
        raise DataError(f"no {split} files given")
    _check_distinct_basenames(files)
    records: list[PromptRecord] = []
    for path in files:
        file_records = _load_file(path, split=split, prompt_key=prompt_key)
        if not file_records:
            raise DataError(f"{path}: the file holds no rows ({split} set would be empty)")
        logger.info("loaded %d %s prompts from %s", len(file_records), split, path)
        records.extend(file_records)
    return records


def _check_distinct_basenames(files: list[str]) -> None:
    # The uid carries only the basename, so two files with one basename would share uids.
    seen: dict[str, str] = {}
    for path in files:
        name = os.path.basename(path)
        if name in seen:
            raise DataError(
                f"{seen[name]} and {path} share the file name {name!r}; record uids are built "
                "from the file name, so rename one of them"
            )
        seen[name] = path


def _load_file(path: str, *, split: str, prompt_key: str) -> list[PromptRecord]:
    if not os.path.isfile(path):
        raise DataError(f"{path}: data file not found (cwd: {os.getcwd()})")
    ext = os.path.splitext(path)[1].lower()
    if ext in PARQUET_EXTENSIONS:
        rows = _iter_parquet(path, prompt_key)
    elif ext in JSONL_EXTENSIONS:
        rows = ((f"line {line_no}", row) for line_no, row in iter_jsonl_objects(path))
    else:
        allowed = ", ".join(PARQUET_EXTENSIONS + JSONL_EXTENSIONS)
        raise DataError(f"{path}: unknown data file extension {ext!r}; expected one of {allowed}")
    basename = os.path.basename(path)
    records = []
    for index, (where, row) in enumerate(rows):
        try:
            records.append(_row_to_record(row, uid=f"{split}:{basename}:{index}", key=prompt_key))
        except _RowError as err:
            raise DataError(f"{path}: {where}: {err}") from None
    return records


def _iter_parquet(path: str, prompt_key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: cannot read the parquet file: {err}") from err
    columns = parquet.schema_arrow.names
    if prompt_key not in columns:
        raise DataError(
            f"{path}: no column {prompt_key!r} (columns: {', '.join(columns)}); "
            "set data.prompt_key to the column that holds the prompt"
        )
    index = 0
    try:
        # Batches bound memory on large files; to_pylist turns structs/lists into dicts/lists.
        for batch in parquet.iter_batches():
            for row in batch.to_pylist():
                yield f"row {index}", row
                index += 1
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: cannot read the parquet file near row {index}: {err}") from err


def iter_jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each non-blank line of a JSON Lines file; line numbers are
    1-based, as an editor shows them. ``DataError`` naming the line for one that is not a
    JSON object, or for an unreadable file."""
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}: line {line_no}: invalid JSON: {err}") from None
                if not isinstance(row, dict):
                    raise DataError(
                        f"{path}: line {line_no}: expected a JSON object, got {type(row).__name__}"
                    )
                yield line_no, row
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read the file: {err}") from err


def _row_to_record(row: dict[str, Any], *, uid: str, key: str) -> PromptRecord:
    return PromptRecord(
        uid=uid,
        prompt=_parse_prompt(row.get(key), key),
        ground_truth=_parse_ground_truth(row.get("reward_model")),
        data_source=_parse_data_source(row.get("data_source")),
        extra_info=_parse_extra_info(row.get("extra_info")),
    )


def _parse_prompt(value: Any, key: str) -> str | ChatMessages:
    if value is None:
        raise _RowError(f"{key} missing")
    if isinstance(value, str):
        if not value.strip():
            raise _RowError(f"{key} is an empty string")
        return value
    if not isinstance(value, list):
        raise _RowError(
            f"{key} must be a string or a list of chat messages, got {type(value).__name__}"
        )
    if not value:
        raise _RowError(f"{key} is an empty list of chat messages")
    messages: ChatMessages = []
    for i, message in enumerate(value):
        where = f"{key}: message at index {i}"
        if not isinstance(message, dict):
            raise _RowError(f"{where} must be an object, got {type(message).__name__}")
        for field_name in ("role", "content"):
            if message.get(field_name) is None:
                raise _RowError(f"{where} has no {field_name!r}")
            if not isinstance(message[field_name], str):
                raise _RowError(f"{where}: {field_name!r} must be a string")
        messages.append({"role": message["role"], "content": message["content"]})
    return messages


def _parse_ground_truth(reward_model: Any) -> str:
    if reward_model is None:
        raise _RowError("reward_model missing")
    if not isinstance(reward_model, dict):
        raise _RowError(f"reward_model must be an object, got {type(reward_model).__name__}")
    truth = reward_model.get("ground_truth")
    if truth is None:
        raise _RowError("reward_model.ground_truth missing")
    # Integral floats come from integer columns that pandas widened to float (NaN elsewhere).
    if isinstance(truth, float) and truth.is_integer():
        return str(int(truth))
    if isinstance(truth, str | int | float):
        return str(truth)
    raise _RowError(
        f"reward_model.ground_truth must be a string or a number, got {type(truth).__name__}"
    )


def _parse_data_source(value: Any) -> str:
    if value is None:
        raise _RowError("data_source missing")
    if not isinstance(value, str) or not value:
        raise _RowError(f"data_source must be a non-empty string, got {value!r}")
    return value


def _parse_extra_info(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _RowError(f"extra_info must be an object, got {type(value).__name__}")
    return dict(value)
