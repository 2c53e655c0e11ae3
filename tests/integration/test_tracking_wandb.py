"""The Tracker's wandb sink with real wandb in offline mode: what lands under run_dir/wandb.

Offline wandb writes a transaction log ``run-<id>.wandb`` (a LevelDB-style record log of
protobuf ``Record`` messages) instead of JSON files, so the test reads that log back to check
the logged history, summary and config.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from recipe.observability.config import LoggerConfig, WandbConfig
from recipe.observability.tracking import Tracker

pytestmark = pytest.mark.integration

_FILE_HEADER_BYTES = 7  # ":W&B", 2-byte magic, 1-byte version
_BLOCK_BYTES = 32 * 1024
_RECORD_HEADER_BYTES = 7  # crc32 (4), length (2), chunk type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@pytest.fixture(autouse=True)
def _end_wandb_service():
    """End wandb's service process even when a test fails before its Tracker closes."""
    yield
    import wandb

    wandb.teardown()


def _read_records(path: Path) -> list:
    """Parse every protobuf ``Record`` of a ``.wandb`` transaction log."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, chunks, payloads = _FILE_HEADER_BYTES, b"", []
    while pos + _RECORD_HEADER_BYTES <= len(data):
        left_in_block = _BLOCK_BYTES - pos % _BLOCK_BYTES
        if left_in_block < _RECORD_HEADER_BYTES:
            pos += left_in_block  # block trailer padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _RECORD_HEADER_BYTES])
        if kind == 0:
            pos += left_in_block  # zero padding up to the next block
            continue
        start = pos + _RECORD_HEADER_BYTES
        chunks += data[start : start + length]
        pos = start + length
        if kind in (_FULL, _LAST):
            payloads.append(chunks)
            chunks = b""
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def _history(records: list) -> list[dict]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {
            "/".join(item.nested_key) or item.key: item.value_json for item in record.history.item
        }
        rows.append({"step": record.history.step.num, **row})
    return rows


def _summary(records: list) -> dict[str, str]:
    out: dict[str, str] = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                out["/".join(item.nested_key) or item.key] = item.value_json
    return out


def _config(records: list) -> dict[str, str]:
    for record in records:
        if record.WhichOneof("record_type") == "run":
            return {item.key: item.value_json for item in record.run.config.update}
    return {}


def _offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def _wandb_tracker(run_dir: Path, run_config: dict | None = None) -> Tracker:
    cfg = LoggerConfig(
        backends=["wandb", "jsonl"],
        project="tracking_test",
        experiment="offline_smoke",
        wandb=WandbConfig(mode="offline"),
        quiet=True,
    )
    return Tracker(cfg, run_dir, run_config=run_config)


def test_wandb_offline_run_records_metrics_summary_and_config_under_run_dir(tmp_path):
    run_config = {"actor": {"lr": 1e-4}, "rollout": {"n": 4}}
    with _wandb_tracker(tmp_path, run_config) as tracker:
        for step in range(3):
            tracker.log({"reward/mean": 0.25 * step, "actor/pg_loss": float("nan")}, step=step)
        tracker.log_summary({"val/accuracy": 0.5})

    runs = _offline_runs(tmp_path)
    assert len(runs) == 1
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    assert runs[0].name.endswith(run_id)
    records = _read_records(runs[0] / f"run-{run_id}.wandb")

    history = _history(records)
    assert [row["step"] for row in history] == [0, 1, 2]
    assert [json.loads(row["reward/mean"]) for row in history] == [0.0, 0.25, 0.5]
    assert all(row["actor/pg_loss"] == "NaN" for row in history)
    assert json.loads(_summary(records)["val/accuracy"]) == 0.5
    config = _config(records)
    assert json.loads(config["actor"]) == {"lr": 1e-4}
    assert json.loads(config["rollout"]) == {"n": 4}
    # The jsonl sink ran beside wandb from the same records.
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_resumed_run_dir_continues_the_same_wandb_run(tmp_path):
    with _wandb_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.1}, step=0)
    with _wandb_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.2}, step=1)

    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    runs = _offline_runs(tmp_path)
    # Same id in both directories (wandb adds "-1" when the two starts share a second).
    assert len(runs) == 2 and all(f"-{run_id}" in run.name for run in runs)
    steps = [
        row["step"] for run in runs for row in _history(_read_records(run / f"run-{run_id}.wandb"))
    ]
    assert sorted(steps) == [0, 1]
