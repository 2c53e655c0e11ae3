"""The benchmark's prompt files, written once from the same GSM8K for every system.

    DATA_DIR: train.jsonl + test.jsonl (as OpenAI published them), or the prepared
              train.parquet + test.parquet (``python -m recipe.tools.prepare gsm8k``)
        --> OUT/data/train.parquet          every training row (verl's row schema)
            OUT/data/val<N>.parquet         the first N test rows

Validation takes the first N rows of the file it is given on both sides (verl would draw a
random N when asked for fewer rows than its file holds), so the systems score the same
problems.
"""

from __future__ import annotations

from pathlib import Path

from recipe.tools.prepare import gsm8k
from recipe.tools.prepare.common import write_parquet_atomic


def prepare_peer_data(data_dir: Path, out: Path, val_rows: int) -> tuple[Path, Path]:
    """(train file, validation file) under ``out/data``; written when missing."""
    folder = out / "data"
    train, val = folder / "train.parquet", folder / f"val{val_rows}.parquet"
    if train.is_file() and val.is_file():
        return train.resolve(), val.resolve()
    if (data_dir / "train.parquet").is_file() and (data_dir / "test.parquet").is_file():
        import pyarrow.parquet as pq

        splits = {s: pq.read_table(data_dir / f"{s}.parquet").to_pylist() for s in gsm8k.SPLITS}
    elif (data_dir / "train.jsonl").is_file():
        splits = gsm8k.prepare_gsm8k(data_dir)
    else:
        raise ValueError(
            f"data={data_dir}: expected GSM8K's train.jsonl/test.jsonl or a prepared "
            "train.parquet/test.parquet there"
        )
    if len(splits["test"]) < val_rows:
        raise ValueError(f"val_rows={val_rows}: the test split has {len(splits['test'])} rows")
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(splits["train"], train, gsm8k.row_schema())
    write_parquet_atomic(splits["test"][:val_rows], val, gsm8k.row_schema())
    return train.resolve(), val.resolve()
