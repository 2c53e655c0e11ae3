"""``python -m recipe.tools.prepare NAME SRC_DIR OUT_DIR [--levels 3,4,5] [--holdout N]``: see
``recipe.tools.prepare``. What a preparer notes about the source (rows it skipped, and why)
is printed before the files written.

Bad input (an unknown name, a missing or malformed source, an OUT_DIR that is a file) prints
one line on stderr and exits with code 2, as ``python -m recipe`` does; ``RECIPE_DEBUG=1``
shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from recipe.tools.prepare import FORMATS, PREPARERS, PrepareError, prepare


def main(argv: list[str] | None = None) -> None:
    names = "\n".join(f"  {name}: {p.description}" for name, p in sorted(PREPARERS.items()))
    parser = argparse.ArgumentParser(
        prog="python -m recipe.tools.prepare",
        description="Write a published dataset as parquet files in verl's row schema.",
        epilog=f"datasets:\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", help="the dataset (see below)")
    parser.add_argument("src_dir", type=Path, help="folder holding the published files")
    parser.add_argument("out_dir", type=Path, help="folder for <split>.parquet (created)")
    parser.add_argument(
        "--levels",
        type=_levels,
        default=None,
        help="keep only these levels, comma-separated (datasets whose rows carry one: math)",
    )
    parser.add_argument(
        "--holdout",
        type=int,
        default=0,
        metavar="N",
        help="move N train rows (drawn with --holdout-seed) to OUT_DIR/heldout.*: a test set "
        "from the training distribution",
    )
    parser.add_argument("--holdout-seed", type=int, default=0, metavar="S", help="default 0")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="parquet",
        help="parquet (default) or jsonl (the same rows; no pyarrow needed to read them)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        written = prepare(
            args.name,
            args.src_dir,
            args.out_dir,
            levels=args.levels,
            holdout=args.holdout,
            holdout_seed=args.holdout_seed,
            file_format=args.format,
        )
    except PrepareError as err:
        if os.environ.get("RECIPE_DEBUG", "0") not in ("", "0"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path, num_rows in written.items():
        print(f"wrote {num_rows} rows to {path}")


def _levels(text: str) -> frozenset[int]:
    try:
        levels = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected levels like 3,4,5") from None
    return levels


if __name__ == "__main__":
    main()
