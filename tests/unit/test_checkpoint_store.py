"""Checkpoint directories: atomic writes (a SIGKILL mid-write leaves the previous checkpoint in
use), completeness checks, pruning, resume resolution and its errors, the run-log rewind, and
the state codecs (RNG, trajectories, cursor) round-tripping exactly."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from recipe.checkpoint.codec import decode_groups, encode_groups
from recipe.checkpoint.ledger import StepLedger, read_ledger
from recipe.checkpoint.rng import capture_rng, restore_rng
from recipe.checkpoint.run_logs import truncate_jsonl
from recipe.checkpoint.store import (
    MARKER,
    checkpoint_dir,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    prune,
    resolve_resume,
    set_aside_newer,
    write_checkpoint,
)
from recipe.config import load_config
from recipe.data.cursor import PromptCursor
from recipe.protocol import PromptRecord, Trajectory
from recipe.utils.config_check import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _fill(payload: str):
    def fill(partial: Path) -> None:
        (partial / "weights.bin").write_text(payload)
        (partial / "run_state").mkdir()
        (partial / "run_state" / "optimizer.pt").write_text(payload * 2)

    return fill


def test_a_written_checkpoint_is_complete_with_a_manifest_of_its_files(tmp_path):
    path = write_checkpoint(tmp_path, 4, 2, _fill("abc"))
    assert path == checkpoint_dir(tmp_path, 4) and is_complete(path)
    manifest = json.loads((path / MARKER).read_text())
    assert manifest["global_step"] == 4 and manifest["param_version"] == 2
    assert manifest["format"] == 2 and manifest["files"] == {
        "weights.bin": {"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
        "run_state/optimizer.pt": {"size": 6, "sha256": hashlib.sha256(b"abcabc").hexdigest()},
    }
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_4"]


def test_a_directory_without_its_marker_or_with_a_changed_file_is_never_taken(tmp_path):
    write_checkpoint(tmp_path, 2, 1, _fill("abc"))
    newest = write_checkpoint(tmp_path, 6, 3, _fill("abc"))
    (newest / "weights.bin").write_text("ab")  # damaged after the fact: size differs
    no_marker = checkpoint_dir(tmp_path, 8)
    no_marker.mkdir()
    (no_marker / "weights.bin").write_text("abc")
    (tmp_path / "checkpoints" / ".step_10.partial").mkdir()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 2)
    assert resolve_resume("auto", tmp_path) == checkpoint_dir(tmp_path, 2)


def test_a_checkpoint_whose_contents_changed_is_skipped_for_the_one_before(tmp_path, caplog):
    older = write_checkpoint(tmp_path, 2, 1, _fill("abc"))
    newest = write_checkpoint(tmp_path, 4, 2, _fill("abc"))
    (newest / "run_state" / "optimizer.pt").write_text("abcabd")  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="recipe.checkpoint.store"):
        assert resolve_resume("auto", tmp_path) == older
    assert f"checkpoint {newest} is not complete: run_state/optimizer.pt has sha256 " in caplog.text
    assert "falling back to the checkpoint before it" in caplog.text
    with pytest.raises(ConfigError) as caught:  # asked for by name: refused, naming the file
        resolve_resume(str(newest), tmp_path)
    assert "is invalid: a damaged checkpoint (run_state/optimizer.pt has sha256" in str(
        caught.value
    )


def test_a_manifest_of_sizes_only_still_reads(tmp_path):
    path = write_checkpoint(tmp_path, 2, 1, _fill("abc"))
    manifest = json.loads((path / MARKER).read_text())
    manifest |= {"format": 1, "files": {"weights.bin": 3, "run_state/optimizer.pt": 6}}
    (path / MARKER).write_text(json.dumps(manifest))
    assert is_complete(path) and resolve_resume("auto", tmp_path) == path
    (path / "weights.bin").write_text("ab")
    assert resolve_resume("auto", tmp_path) is None


_CRASHING_WRITER = """
import sys, time
from pathlib import Path
from recipe.checkpoint.store import write_checkpoint

run_dir = Path(sys.argv[1])

def complete(partial):
    (partial / "weights.bin").write_bytes(b"v1" * 1000)

def crashing(partial):
    (partial / "weights.bin").write_bytes(b"v2" * 1000)
    (run_dir / "mid-write").touch()
    time.sleep(60)  # killed here, half-way through the checkpoint

write_checkpoint(run_dir, 4, 2, complete)
write_checkpoint(run_dir, 8, 4, crashing)
"""


def test_sigkill_mid_write_leaves_the_previous_checkpoint_in_use(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CRASHING_WRITER), str(tmp_path)], cwd=REPO
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "mid-write").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (tmp_path / "checkpoints" / ".step_8.partial" / "weights.bin").is_file()
    assert not checkpoint_dir(tmp_path, 8).exists()
    assert resolve_resume("auto", tmp_path) == checkpoint_dir(tmp_path, 4)
    assert (checkpoint_dir(tmp_path, 4) / "weights.bin").read_bytes() == b"v1" * 1000
    # The next write of that step replaces the leftover.
    write_checkpoint(tmp_path, 8, 4, _fill("new"))
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 8)
    assert not (tmp_path / "checkpoints" / ".step_8.partial").exists()


def test_an_incomplete_directory_at_the_target_step_is_replaced(tmp_path):
    leftover = checkpoint_dir(tmp_path, 4)
    leftover.mkdir(parents=True)
    (leftover / "stale.bin").write_text("x")
    write_checkpoint(tmp_path, 4, 2, _fill("abc"))
    assert is_complete(leftover) and not (leftover / "stale.bin").exists()


def test_pruning_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (2, 4, 6):
        write_checkpoint(tmp_path, step, step // 2, _fill("x"), keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 6]
    assert prune(tmp_path, 1) == [checkpoint_dir(tmp_path, 4)]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_6"]


def test_resuming_from_an_older_checkpoint_sets_newer_ones_aside(tmp_path):
    for step in (2, 4, 6):
        write_checkpoint(tmp_path, step, step // 2, _fill("x"))
    moved = set_aside_newer(tmp_path, 2)
    assert [p.name for p in moved] == [".step_4.superseded", ".step_6.superseded"]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 2)


def test_resume_modes_resolve_to_a_checkpoint_or_none(tmp_path):
    assert resolve_resume("disable", tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None  # nothing there yet: a fresh start
    path = write_checkpoint(tmp_path, 2, 1, _fill("x"))
    assert resolve_resume("disable", tmp_path) is None
    assert resolve_resume(str(path), tmp_path / "elsewhere") == path.resolve()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda root: root / "missing", "no such directory"),
        (lambda root: root, "not a complete checkpoint (no COMPLETE marker)"),
    ],
)
def test_a_resume_path_that_is_not_a_checkpoint_fails_at_config_load_naming_it(
    tmp_path, make, reason
):
    path = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config({"trainer": {"resume_mode": str(path)}})
    message = str(info.value)
    assert message.startswith(f"trainer.resume_mode={str(path)!r} is invalid: {reason}")
    assert "\n" not in message


def test_truncating_run_logs_drops_steps_after_the_checkpoint_and_torn_lines(tmp_path):
    ledger = StepLedger(tmp_path)
    for step in range(1, 6):
        ledger.append(step, step // 2, [f"p{step}"])
    with ledger.path.open("a") as f:
        f.write('{"step": 6, "trai')  # the crash cut this line
    assert truncate_jsonl(ledger.path, 3) == 3
    assert [r["step"] for r in read_ledger(tmp_path)] == [1, 2, 3]
    assert truncate_jsonl(ledger.path, 3) == 0
    assert truncate_jsonl(tmp_path / "absent.jsonl", 3) == 0


def test_an_unreadable_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path):
    ledger = StepLedger(tmp_path)
    for step in range(1, 4):
        ledger.append(step, step, [f"p{step}"])
    lines = ledger.path.read_text().splitlines()
    lines[1] = lines[1][:10]  # damaged in place, not by a crash: the last line is whole
    ledger.path.write_text("\n".join(lines) + "\n")
    before = ledger.path.read_bytes()
    with pytest.raises(ValueError) as caught:
        truncate_jsonl(ledger.path, 1)
    message = str(caught.value)
    assert message.startswith(f"{ledger.path}: line 2 is not a record with a step (")
    assert "the run's records were damaged" in message and "\n" not in message
    assert ledger.path.read_bytes() == before  # left as it was, not rewritten


def test_a_resume_logs_the_lines_it_drops_from_the_run_logs(tmp_path, caplog):
    ledger = StepLedger(tmp_path)
    for step in range(1, 7):
        ledger.append(step, step, [f"p{step}"])
    with ledger.path.open("a") as f:
        f.write('{"step": 7, "trai')  # the crash cut this line
    _write_state(tmp_path, 4)
    with caplog.at_level(logging.INFO, logger="recipe.run.checkpointing"):
        _checkpointer(tmp_path, "auto")
    assert "resuming at step 4: 3 lines of ledger.jsonl dropped" in caplog.text
    assert [r["step"] for r in read_ledger(tmp_path)] == [1, 2, 3, 4]


def test_rng_states_round_trip_through_json():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = json.loads(json.dumps(capture_rng()))
    expected = (random.random(), np.random.rand(), torch.rand(2).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(2).tolist()) == expected


def test_trajectories_round_trip_exactly():
    traj = Trajectory(
        "u1", 1, [5, 6], [7, 8, 9], [-0.1234567890123, -1e-30, -7.5], [3, 3, 4], "aborted",
        reward=0.25, response_text="7 8",
    )  # fmt: skip
    back = decode_groups(json.loads(json.dumps(encode_groups([[traj]]))))
    assert back == [[traj]]


def test_a_restored_cursor_continues_the_same_order_across_epochs():
    records = [PromptRecord(f"p{i}", "1+1=", "2", "arithmetic") for i in range(5)]
    cursor = PromptCursor(records, seed=3)
    cursor.take(7)  # into epoch 2
    state = json.loads(json.dumps(cursor.state_dict()))
    expected = [r.uid for r in cursor.take(6)]
    resumed = PromptCursor(records, seed=3)
    resumed.load_state_dict(state)
    assert [r.uid for r in resumed.take(6)] == expected


TEN_PROMPTS = [PromptRecord(f"train:p{i}", "1+1=", "2", "arithmetic") for i in range(10)]


def _checkpointer(run_dir: Path, resume_mode: str, mode: str = "fully_async"):
    """The run's checkpointer alone (no Ray, no workers): constructing it rewinds."""
    from recipe.run.checkpointing import RunCheckpointer

    cfg = load_config({"mode": mode, "trainer": {"resume_mode": resume_mode}})
    return RunCheckpointer(cfg, run_dir, train=TEN_PROMPTS, val=[])


def _write_state(run_dir: Path, step: int, mode: str = "fully_async") -> Path:
    def fill(partial: Path) -> None:
        state = {"mode": mode, "num_train_prompts": 10, "global_step": step, "param_version": 1}
        (partial / "trainer_state.json").write_text(json.dumps(state))

    return write_checkpoint(run_dir, step, step // 2, fill)


def test_resuming_rewinds_metrics_and_ledger_to_the_checkpoint_step(tmp_path):
    ledger = StepLedger(tmp_path)
    with (tmp_path / "metrics.jsonl").open("w") as f:
        for step in range(7):
            f.write(json.dumps({"step": step}) + "\n")
    for step in range(1, 7):
        ledger.append(step, step, [f"p{step}"])
    _write_state(tmp_path, 4)
    _write_state(tmp_path, 8)
    base = _checkpointer(tmp_path, str(checkpoint_dir(tmp_path, 4)))
    assert base.resume_from == checkpoint_dir(tmp_path, 4).resolve()
    metrics = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert metrics == [0, 1, 2, 3, 4]
    assert [r["step"] for r in read_ledger(tmp_path)] == [1, 2, 3, 4]
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 4)  # step 8 set aside


def test_a_fresh_start_moves_the_logs_of_an_earlier_attempt_aside(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "checkpoints" / ".step_4.partial").mkdir(parents=True)
    base = _checkpointer(tmp_path, "auto")
    assert base.resume_from is None
    assert not (tmp_path / "metrics.jsonl").exists()
    assert (tmp_path / "metrics.jsonl.prev").read_text() == '{"step": 1}\n'


def test_a_start_removes_the_weights_files_and_checkpoint_writes_a_crash_left(tmp_path, caplog):
    exports = tmp_path / ".weights"
    exports.mkdir()
    (exports / "resume-v4-0a1b.safetensors").write_bytes(b"w" * 1000)  # not removed by its owner
    (exports / "policy-v3.safetensors.partial").write_bytes(b"w" * 2000)  # crash before rename
    (exports / "notes.txt").write_text("the user's")
    (tmp_path / "mine.safetensors").write_bytes(b"u")  # outside the run's layout
    kept_checkpoint = _write_state(tmp_path, 4)
    root = tmp_path / "checkpoints"
    (root / ".step_8.partial").mkdir()
    (root / ".step_8.partial" / "model.safetensors").write_bytes(b"c" * 3000)
    (root / ".step_2.deleting").mkdir()
    (root / ".step_6.superseded").mkdir()  # set aside by a resume on purpose
    with caplog.at_level(logging.INFO, logger="recipe.run.checkpointing"):
        base = _checkpointer(tmp_path, "auto")
    assert base.resume_from == kept_checkpoint
    assert sorted(p.name for p in exports.iterdir()) == ["notes.txt"]
    assert (tmp_path / "mine.safetensors").exists()
    assert sorted(p.name for p in root.iterdir()) == [".step_6.superseded", "step_4"]
    lines = [r.getMessage() for r in caplog.records if "leftovers" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "removed 4 leftovers of an earlier process of this run, 6000 bytes (0.00 GiB) freed: "
    )
    assert ".weights/policy-v3.safetensors.partial" in lines[0]


def test_a_checkpoint_of_another_mode_is_refused(tmp_path):
    path = _write_state(tmp_path, 4, mode="sync")
    with pytest.raises(ValueError, match="the checkpoint has mode='sync', this run 'fully_async'"):
        _checkpointer(tmp_path, "auto", mode="fully_async")
    assert latest_checkpoint(tmp_path) == path


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rollout_logprobs": [0.0]}, "2 response_ids, 1 rollout_logprobs"),
        ({"loss_mask": [1]}, "loss_mask has 1 entries for 2 response tokens"),
        ({"finish_reason": "done"}, "finish_reason 'done' is not one of"),
    ],
)
def test_a_trajectory_that_does_not_hold_together_is_refused_naming_its_prompt(fields, named):
    """What a decoded checkpoint, an engine or an agent hands over is checked with a real
    exception (kept under ``python -O``), naming the prompt."""
    values = {
        "prompt_uid": "train:q7",
        "sample_index": 0,
        "prompt_ids": [5],
        "response_ids": [6, 7],
        "rollout_logprobs": [0.0, 0.0],
        "token_versions": [0, 0],
        "finish_reason": "stop",
    }
    with pytest.raises(ValueError, match=named) as caught:
        Trajectory(**(values | fields))
    assert "'train:q7'" in str(caught.value)
