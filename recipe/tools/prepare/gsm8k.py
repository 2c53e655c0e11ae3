"""GSM8K as OpenAI published it -> parquet rows as verl's ``examples/data_preprocess/gsm8k.py``
writes them.

Source: ``SRC_DIR/train.jsonl`` and ``SRC_DIR/test.jsonl``, rows ``{"question", "answer"}``
whose answer (a worked solution) ends in ``#### <number>``. One output row per source row, in
source order::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "<number, commas removed>"},
     "extra_info": {"split": "train" | "test", "index": <0-based row>, "answer": answer,
                    "question": question}}

The values are verl's: the same instruction suffix, the ground truth taken the same way (the
first ``#### `` followed by a number, its thousands commas removed), so a model trained or
evaluated on these files sees what it would see with verl's files. The scorer registered for
``openai/gsm8k`` (``recipe.reward.scorers.gsm8k_score``) reads this ground truth.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from recipe.tools.prepare.common import PrepareError, read_jsonl

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
# verl's pattern: one space after "####", then digits with optional sign, commas and dots.
_FINAL_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
# What that must be once commas are gone; verl would also take "#### ." (we refuse it).
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")


def row_schema() -> Any:
    """The Arrow schema of the rows (explicit, so an all-null field cannot change a type)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int64()),
                        ("answer", pa.string()),
                        ("question", pa.string()),
                    ]
                ),
            ),
        ]
    )


def final_answer(answer: str) -> str | None:
    """The ground truth of a GSM8K answer field: the number after its first ``#### ``,
    thousands commas removed; None when there is no such number."""
    match = _FINAL_ANSWER.search(answer)
    truth = match.group(1).replace(",", "") if match else ""
    return truth if _NUMBER.fullmatch(truth) else None


def prepare_gsm8k(src_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Rows of each split (``train``, ``test``) of the GSM8K files in ``src_dir``."""
    if not src_dir.is_dir():
        raise PrepareError(f"{src_dir}: source folder not found")
    return {split: _split_rows(src_dir / f"{split}.jsonl", split) for split in SPLITS}


def _split_rows(path: Path, split: str) -> list[dict[str, Any]]:
    rows = []
    # ``index`` counts rows (blank lines skipped), as verl's row index does.
    for index, (line_no, source) in enumerate(read_jsonl(path)):
        try:
            rows.append(_row(source, split=split, index=index))
        except PrepareError as err:
            raise PrepareError(f"{path}: line {line_no}: {err}") from None
    return rows


def _row(source: dict[str, Any], *, split: str, index: int) -> dict[str, Any]:
    question, answer = source.get("question"), source.get("answer")
    for name, value in (("question", question), ("answer", answer)):
        if not isinstance(value, str) or not value.strip():
            raise PrepareError(f"{name!r} must be a non-empty string, got {value!r:.60}")
    assert isinstance(question, str) and isinstance(answer, str)  # checked just above
    truth = final_answer(answer)
    if truth is None:
        raise PrepareError(f"the answer has no '#### <number>' line: ...{answer[-60:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }
