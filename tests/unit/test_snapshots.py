"""``WeightSnapshots``: due at each multiple of k trained samples, one index line per export,
and a resume drops what came after its checkpoint (lines and files)."""

from __future__ import annotations

import json
from pathlib import Path

from recipe.run.snapshots import INDEX_FILE, SNAPSHOT_DIR, WeightSnapshots, read_index
from recipe.utils.weights_file import WeightsFile, file_sha256


def _export(path: str) -> WeightsFile:
    Path(path).write_bytes(b"weights of " + path.encode())
    return WeightsFile(path, 11, file_sha256(path))


def _take(snapshots: WeightSnapshots, samples: int, step: int) -> None:
    snapshots.take(_export, samples=samples, step=step, version=step, clock_s=float(step))


def test_a_snapshot_is_due_once_per_multiple_of_k_crossed(tmp_path):
    snapshots = WeightSnapshots(100, tmp_path)
    assert not snapshots.due(64)
    assert snapshots.due(128)
    _take(snapshots, 128, 2)
    assert not snapshots.due(192)  # still below 200
    assert snapshots.due(256)
    _take(snapshots, 320, 5)  # two multiples crossed in one step: one snapshot
    assert not snapshots.due(384)
    assert [s.samples for s in read_index(tmp_path)] == [128, 320]
    first = read_index(tmp_path)[0]
    assert first.clock_s == 2.0 and first.file == "samples_000000128.safetensors"
    assert file_sha256(tmp_path / SNAPSHOT_DIR / first.file) == first.sha256


def test_k_zero_never_snapshots(tmp_path):
    assert not WeightSnapshots(0, tmp_path).due(10**6)


def test_a_resume_drops_the_snapshots_of_steps_trained_again(tmp_path):
    snapshots = WeightSnapshots(64, tmp_path)
    for step in (1, 2, 3):
        _take(snapshots, 64 * step, step)
    resumed = WeightSnapshots(64, tmp_path, resumed_step=2)
    assert [s.step for s in read_index(tmp_path)] == [1, 2]
    names = sorted(p.name for p in (tmp_path / SNAPSHOT_DIR).glob("*.safetensors"))
    assert names == ["samples_000000064.safetensors", "samples_000000128.safetensors"]
    assert not resumed.due(128) and resumed.due(192)
    lines = (tmp_path / SNAPSHOT_DIR / INDEX_FILE).read_text().splitlines()
    assert all(json.loads(line)["step"] <= 2 for line in lines)


def test_a_fresh_start_in_an_old_run_directory_keeps_none_of_its_snapshots(tmp_path):
    _take(WeightSnapshots(64, tmp_path), 64, 1)
    WeightSnapshots(64, tmp_path)  # a fresh start: no checkpoint to resume from
    assert read_index(tmp_path) == []
    assert not list((tmp_path / SNAPSHOT_DIR).glob("*.safetensors"))
