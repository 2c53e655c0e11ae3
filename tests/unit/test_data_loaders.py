"""Unit tests of the parquet/jsonl loaders (verl row schema), of ``build_datasets`` and of
``data.source``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipe.data.config import DataConfig
from recipe.data.dataset import build_datasets
from recipe.data.loaders import DataError, load_records
from recipe.protocol import PromptRecord
from recipe.utils.config_check import ConfigError

CHAT_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 70+2?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"index": 3, "split": "train"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 1+1?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"index": 4, "split": "train"},
    },
]
STRING_ROWS = [
    {"data_source": "arithmetic", "prompt": "3+4=", "reward_model": {"ground_truth": 7}},
    {"data_source": "math", "prompt": "x?", "reward_model": {"ground_truth": 2.5}},
]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(path: Path, rows: list[Any], *, blank_line_after: int | None = None) -> str:
    lines = [json.dumps(row) for row in rows]
    if blank_line_after is not None:
        lines.insert(blank_line_after, "")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def expected_chat_records(split: str, name: str) -> list[PromptRecord]:
    return [
        PromptRecord(
            uid=f"{split}:{name}:{i}",
            prompt=row["prompt"],
            ground_truth=row["reward_model"]["ground_truth"],
            data_source="openai/gsm8k",
            extra_info=row["extra_info"],
        )
        for i, row in enumerate(CHAT_ROWS)
    ]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_chat_prompts_round_trip(tmp_path: Path, suffix: str) -> None:
    writer = write_parquet if suffix == ".parquet" else write_jsonl
    path = writer(tmp_path / f"gsm{suffix}", CHAT_ROWS)
    assert load_records([path], split="train") == expected_chat_records("train", f"gsm{suffix}")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_string_prompts_and_numeric_ground_truth_load_as_strings(
    tmp_path: Path, suffix: str
) -> None:
    writer = write_parquet if suffix == ".parquet" else write_jsonl
    path = writer(tmp_path / f"s{suffix}", STRING_ROWS)
    records = load_records([path], split="val")
    assert [r.prompt for r in records] == ["3+4=", "x?"]
    assert [r.ground_truth for r in records] == ["7", "2.5"]
    assert [r.uid for r in records] == [f"val:s{suffix}:0", f"val:s{suffix}:1"]
    assert [r.extra_info for r in records] == [{}, {}]


def test_files_load_in_order_with_row_index_uids_skipping_blank_lines(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", STRING_ROWS, blank_line_after=1)
    b = write_parquet(tmp_path / "b.parquet", CHAT_ROWS)
    uids = [r.uid for r in load_records([a, b], split="train")]
    assert uids == ["train:a.jsonl:0", "train:a.jsonl:1", "train:b.parquet:0", "train:b.parquet:1"]


def test_prompt_key_selects_the_prompt_column(tmp_path: Path) -> None:
    rows = [{k if k != "prompt" else "question": v for k, v in r.items()} for r in STRING_ROWS]
    path = write_parquet(tmp_path / "q.parquet", rows)
    assert load_records([path], split="train", prompt_key="question")[0].prompt == "3+4="
    with pytest.raises(DataError, match=r"q.parquet: no column 'prompt'.*data.prompt_key"):
        load_records([path], split="train")


# ---------------------------------------------------------------- file-level errors


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.parquet: data file not found"):
        load_records([str(tmp_path / "nope.parquet")], split="train")


def test_unknown_extension_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError, match=r"d.csv: unknown data file extension '.csv'"):
        load_records([str(path)], split="train")


def test_unreadable_parquet_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot read the parquet file"):
        load_records([str(path)], split="train")


def test_non_utf8_jsonl_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"prompt": "\xe9"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl: cannot read the file"):
        load_records([str(path)], split="train")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_empty_file_is_named(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    if suffix == ".parquet":
        schema = pa.Table.from_pylist(STRING_ROWS).schema
        pq.write_table(schema.empty_table(), path)
    else:
        path.write_text("\n\n")
    with pytest.raises(DataError, match=f"empty{suffix}: the file holds no rows"):
        load_records([str(path)], split="train")


def test_no_files_is_an_error() -> None:
    with pytest.raises(DataError, match=r"no train files"):
        load_records([], split="train")


def test_same_basename_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    a = write_jsonl(tmp_path / "d.jsonl", STRING_ROWS)
    b = write_jsonl(tmp_path / "x" / "d.jsonl", STRING_ROWS)
    with pytest.raises(DataError, match=r"share the file name 'd\.jsonl'"):
        load_records([a, b], split="train")


def test_invalid_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(STRING_ROWS[0]) + "\n" + '{"prompt": "x", oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: line 2: invalid JSON"):
        load_records([str(path)], split="train")


def test_non_object_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "arr.jsonl", [STRING_ROWS[0], [1, 2]])
    with pytest.raises(DataError, match=r"arr.jsonl: line 2: expected a JSON object, got list"):
        load_records([path], split="train")


# ---------------------------------------------------------------- malformed rows


def _with(**changes: Any) -> dict[str, Any]:
    row = json.loads(json.dumps(CHAT_ROWS[0]))
    for key, value in changes.items():
        if value is _DROP:
            del row[key]
        else:
            row[key] = value
    return row


_DROP = object()

MALFORMED = [
    (_with(reward_model=_DROP), "reward_model missing"),
    (_with(reward_model={"style": "rule"}), "reward_model.ground_truth missing"),
    (_with(reward_model={"ground_truth": ["1", "2"]}), "reward_model.ground_truth must be a"),
    (_with(reward_model="72"), "reward_model must be an object, got str"),
    (_with(data_source=_DROP), "data_source missing"),
    (_with(data_source=7), "data_source must be a non-empty string"),
    (_with(prompt=_DROP), "prompt missing"),
    (_with(prompt=[]), "prompt is an empty list"),
    (_with(prompt=" "), "prompt is an empty string"),
    (_with(prompt={"role": "user"}), "prompt must be a string or a list of chat messages"),
    (_with(prompt=[{"role": "user", "content": "a"}, {"role": "user"}]),
     "prompt: message at index 1 has no 'content'"),
    (_with(prompt=[{"content": "a"}]), "prompt: message at index 0 has no 'role'"),
    (_with(prompt=[{"role": "user", "content": 5}]),
     "prompt: message at index 0: 'content' must be a string"),
    (_with(prompt=["hello"]), "prompt: message at index 0 must be an object, got str"),
    (_with(extra_info=[1]), "extra_info must be an object, got list"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "field_message"), MALFORMED)
def test_malformed_jsonl_row_names_file_line_and_field(
    tmp_path: Path, row: dict[str, Any], field_message: str
) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", [CHAT_ROWS[1], row], blank_line_after=1)
    with pytest.raises(DataError) as info:
        load_records([path], split="train")
    # Line 3: one good row, one blank line, then the bad row (1-based line numbers).
    assert str(info.value).startswith(f"{path}: line 3: {field_message}")


@pytest.mark.parametrize(
    ("bad_row", "field_message"),
    [
        ({**STRING_ROWS[0], "reward_model": {"ground_truth": None}}, "reward_model.ground_truth"),
        ({**STRING_ROWS[0], "data_source": None}, "data_source missing"),
        ({**STRING_ROWS[0], "prompt": None}, "prompt missing"),
    ],
)
def test_malformed_parquet_row_names_file_row_index_and_field(
    tmp_path: Path, bad_row: dict[str, Any], field_message: str
) -> None:
    path = write_parquet(tmp_path / "rows.parquet", [STRING_ROWS[0], STRING_ROWS[0], bad_row])
    with pytest.raises(DataError, match=f"rows.parquet: row 2: {field_message}"):
        load_records([path], split="train")


def test_parquet_chat_message_without_content_names_row_and_message(tmp_path: Path) -> None:
    rows = json.loads(json.dumps(CHAT_ROWS))
    rows[1]["prompt"][0]["content"] = None
    path = write_parquet(tmp_path / "chat.parquet", rows)
    with pytest.raises(DataError, match=r"chat\.parquet: row 1: prompt: message at index 0 has no"):
        load_records([path], split="train")


# ---------------------------------------------------------------- build_datasets


def test_build_datasets_loads_train_and_val_files(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", CHAT_ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", STRING_ROWS)
    train_records, val_records = build_datasets(DataConfig(train_files=[train], val_files=[val]))
    assert train_records == expected_chat_records("train", "train.parquet")
    assert [r.uid for r in val_records] == ["val:val.jsonl:0", "val:val.jsonl:1"]


def test_max_samples_keep_the_first_rows_of_the_files(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", CHAT_ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", STRING_ROWS)
    cfg = DataConfig(train_files=[train], val_files=[val], train_max_samples=1, val_max_samples=1)
    train_records, val_records = build_datasets(cfg)
    assert train_records == expected_chat_records("train", "train.parquet")[:1]
    assert [r.uid for r in val_records] == ["val:val.jsonl:0"]
    big = DataConfig(train_files=[train], val_files=[val], val_max_samples=100)
    assert len(build_datasets(big)[1]) == len(STRING_ROWS)
    for bad in (0, -2):
        with pytest.raises(ConfigError, match=r"^data\.val_max_samples=.* -1 \(all rows\)"):
            DataConfig(train_files=[train], val_max_samples=bad)


def test_build_datasets_without_val_files_warns_and_holds_out_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = write_parquet(tmp_path / "train.parquet", CHAT_ROWS)
    with caplog.at_level(logging.WARNING, logger="recipe.data.dataset"):
        train_records, val_records = build_datasets(DataConfig(train_files=[train]))
    assert len(train_records) == len(CHAT_ROWS)
    assert val_records == []
    assert "data.val_files is empty" in caplog.text


def test_build_datasets_uses_the_synthetic_task_without_files(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []

    def fake_make(num: int, *, difficulty: int, seed: int, split: str) -> list[PromptRecord]:
        calls.append((num, difficulty, seed, split))
        return [PromptRecord(f"{split}-{i}", "1+1=", "2", "arithmetic") for i in range(num)]

    monkeypatch.setattr("recipe.data.arithmetic.make_arithmetic_records", fake_make)
    cfg = DataConfig(num_train_prompts=5, num_val_prompts=2, difficulty=3, seed=9)
    train, val = build_datasets(cfg)
    assert (len(train), len(val)) == (5, 2)
    assert calls == [(5, 3, 9, "train"), (2, 3, 9, "val")]


# ---------------------------------------------------------------- data.source


def test_source_auto_means_files_when_given_else_the_synthetic_task(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", CHAT_ROWS)
    assert DataConfig(train_files=[train]).resolved_source == "files"
    assert DataConfig().resolved_source == "synthetic"
    assert DataConfig(source="files", train_files=[train]).resolved_source == "files"


def test_source_files_without_train_files_fails_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^data\.train_files=\[\] is invalid: allowed at least"):
        DataConfig(source="files")


def test_explicit_synthetic_source_ignores_train_files_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = write_parquet(tmp_path / "train.parquet", CHAT_ROWS)
    with caplog.at_level(logging.WARNING, logger="recipe.data.config"):
        cfg = DataConfig(
            source="synthetic", train_files=[train], num_train_prompts=4, num_val_prompts=2
        )
    assert "data.train_files has no effect with data.source=synthetic" in caplog.text
    train_records, val_records = build_datasets(cfg)
    assert {r.data_source for r in train_records + val_records} == {"arithmetic"}
    assert (len(train_records), len(val_records)) == (4, 2)


def test_generated_set_sizes_given_with_files_are_named_as_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sizes of generated sets do nothing to files: a run that sets them believing they
    cut the files down is told which key does."""
    rows = write_parquet(tmp_path / "rows.parquet", CHAT_ROWS)
    with caplog.at_level(logging.WARNING, logger="recipe.data.config"):
        cfg = DataConfig(train_files=[rows], val_files=[rows], num_val_prompts=1)
    assert (
        "data.num_val_prompts has no effect with data.val_files; it is ignored "
        "(data.val_max_samples=N keeps the first N rows)" in caplog.text
    )
    assert "data.num_train_prompts" not in caplog.text
    assert len(build_datasets(cfg)[1]) == len(CHAT_ROWS)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="recipe.data.config"):
        DataConfig(train_files=[rows], num_train_prompts=3)
    assert "data.num_train_prompts has no effect with data.source=files" in caplog.text
