"""MATH (Hendrycks) final answers -> parquet rows scored by ``math_score``.

Source: ``SRC_DIR/train.json`` (the MATH train split, rows ``{"problem", "answer",
"difficulty", "type"}``) and ``SRC_DIR/test.json`` (MATH-500, rows ``{"problem", "answer",
"difficulty", "unique_id"}``), each one JSON array, as DeepScaleR publishes them. ``answer``
is the content of the reference solution's last ``\\boxed{}``; ``difficulty`` the MATH level
(1.0-5.0). One output row per kept source row, in source order::

    {"data_source": "lighteval/MATH" (train) | "HuggingFaceH4/MATH-500" (test),
     "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": answer},
     "extra_info": {"split", "index": <0-based source row>, "level": <int 0-5>,
                    "subject": "Algebra" | ..., "unique_id": <test only, else null>,
                    "problem": problem}}

Both data sources map to ``recipe.reward.scorers.math_score`` (the response's last
``\\boxed{}`` against the answer). The instruction is the one Qwen's math models are
evaluated with. Two kinds of source rows are not what the row format promises, and neither
is passed over in silence (``logger.warning`` names them):

- ``answer: null`` (a reference solution without a box) or ``""`` (an empty box): skipped,
  counted and named per split (the train file has two of each);
- ``difficulty: 0.0`` (MATH's "Level ?"): kept as level 0, their rows named.

``python -m recipe.tools.prepare math SRC OUT --levels 3,4,5`` keeps only those levels.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from recipe.tools.prepare.common import PrepareError

logger = logging.getLogger(__name__)

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DATA_SOURCES = {"train": "lighteval/MATH", "test": "HuggingFaceH4/MATH-500"}
MAX_LEVEL = 5
# MATH-500's unique_id folders ("test/precalculus/807.json") -> the train rows' "type" names.
SUBJECTS = {
    "algebra": "Algebra",
    "counting_and_probability": "Counting & Probability",
    "geometry": "Geometry",
    "intermediate_algebra": "Intermediate Algebra",
    "number_theory": "Number Theory",
    "prealgebra": "Prealgebra",
    "precalculus": "Precalculus",
}


def row_schema() -> Any:
    """The Arrow schema of the rows (explicit, so an all-null field cannot change a type)."""
    import pyarrow as pa

    extra = [
        ("split", pa.string()),
        ("index", pa.int64()),
        ("level", pa.int64()),
        ("subject", pa.string()),
        ("unique_id", pa.string()),
        ("problem", pa.string()),
    ]
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct(extra)),
        ]
    )


def prepare_math(src_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Rows of each split (``train``, ``test``) of the MATH files in ``src_dir``."""
    if not src_dir.is_dir():
        raise PrepareError(f"{src_dir}: source folder not found")
    return {split: _split_rows(src_dir / f"{split}.json", split) for split in DATA_SOURCES}


def read_json_array(path: Path) -> list[dict[str, Any]]:
    """The objects of a file holding one JSON array; ``PrepareError`` naming the file (and
    the first element that is not an object)."""
    if not path.is_file():
        raise PrepareError(f"{path}: source file not found")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PrepareError(f"{path}: cannot read a JSON array: {err}") from None
    if not isinstance(rows, list) or not rows:
        raise PrepareError(f"{path}: expected a non-empty JSON array of rows")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PrepareError(f"{path}: row {index}: expected an object, got {type(row).__name__}")
    return rows


def _split_rows(path: Path, split: str) -> list[dict[str, Any]]:
    rows, level_zero = [], []
    no_answer: dict[str, list[int]] = {"null": [], "empty": []}
    for index, source in enumerate(read_json_array(path)):
        try:
            row = _row(source, split=split, index=index)
        except PrepareError as err:
            raise PrepareError(f"{path}: row {index}: {err}") from None
        if isinstance(row, str):
            no_answer[row].append(index)
            continue
        if row["extra_info"]["level"] == 0:
            level_zero.append(index)
        rows.append(row)
    for why, skipped in no_answer.items():
        if skipped:
            logger.warning(
                "%s: %d rows skipped, their answer is %s (rows %s)",
                path,
                len(skipped),
                why,
                ", ".join(map(str, skipped)),
            )
    if level_zero:
        logger.warning(
            "%s: %d rows have difficulty 0.0 (no level in the source), kept as level 0 (rows %s)",
            path,
            len(level_zero),
            ", ".join(map(str, level_zero)),
        )
    per_level = Counter(row["extra_info"]["level"] for row in rows)
    logger.info(
        "%s: %d rows kept, per level %s",
        path,
        len(rows),
        ", ".join(f"{level}: {count}" for level, count in sorted(per_level.items())),
    )
    return rows


def _row(source: dict[str, Any], *, split: str, index: int) -> dict[str, Any] | str:
    """The output row of one source row; for a row without an answer, why: ``"null"`` or
    ``"empty"``."""
    problem, answer = source.get("problem"), source.get("answer")
    if not isinstance(problem, str) or not problem.strip():
        raise PrepareError(f"'problem' must be a non-empty string, got {problem!r:.60}")
    if answer is None:
        return "null"
    if not isinstance(answer, str):
        raise PrepareError(f"'answer' must be a string or null, got {answer!r:.60}")
    if not answer.strip():
        return "empty"
    unique_id = source.get("unique_id") if split == "test" else None
    return {
        "data_source": DATA_SOURCES[split],
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "level": _level(source.get("difficulty")),
            "subject": _subject(source, split),
            "unique_id": unique_id,
            "problem": problem,
        },
    }


def _level(difficulty: Any) -> int:
    if (
        isinstance(difficulty, bool)
        or not isinstance(difficulty, int | float)
        or difficulty != int(difficulty)
        or not 0 <= difficulty <= MAX_LEVEL
    ):
        raise PrepareError(
            f"'difficulty' must be a whole number in 0..{MAX_LEVEL}, got {difficulty!r}"
        )
    return int(difficulty)


def _subject(source: dict[str, Any], split: str) -> str:
    if split == "train":
        subject = source.get("type")
        if not isinstance(subject, str) or subject not in SUBJECTS.values():
            raise PrepareError(
                f"'type' must be one of {sorted(SUBJECTS.values())}, got {subject!r}"
            )
        return subject
    unique_id = source.get("unique_id")
    parts = unique_id.split("/") if isinstance(unique_id, str) else []
    if len(parts) != 3 or parts[1] not in SUBJECTS:
        raise PrepareError(
            f"'unique_id' must look like 'test/<subject>/<n>.json' with a subject of "
            f"{sorted(SUBJECTS)}, got {unique_id!r}"
        )
    return SUBJECTS[parts[1]]
