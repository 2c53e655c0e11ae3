"""Trainer steps whose update was not applied (non-finite gradient norms): the run's books
(``recipe.run.training_run``). The worker side, a diverging learning rate that makes the
steps skip, is in test_trainer_worker.py; a whole run that stops on them in
tests/integration/test_skipped_steps_run.py."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from recipe.checkpoint import read_ledger
from recipe.config import load_config
from recipe.faults import RunFailure
from recipe.protocol import PromptRecord
from recipe.run.training_run import TrainingRun

GOOD = {"actor/grad_norm": 1.0, "actor/optimizer_steps": 2.0, "actor/skipped_steps": 0.0}
PARTLY = {"actor/grad_norm": math.nan, "actor/optimizer_steps": 2.0, "actor/skipped_steps": 1.0}
SKIPPED = {"actor/grad_norm": math.nan, "actor/optimizer_steps": 2.0, "actor/skipped_steps": 2.0}

PROMPTS = [PromptRecord(f"train:p{i}", "1+1=", "2", "arithmetic") for i in range(100)]


def _run(tmp_path, max_skipped_steps: int) -> TrainingRun:
    cfg = OmegaConf.create(
        {"mode": "sync", "logger": {"backends": ["jsonl"]},
         "actor": {"max_skipped_steps": max_skipped_steps}}
    )  # fmt: skip
    return TrainingRun(load_config(cfg), tmp_path, train=PROMPTS, val=[])


def test_a_skipped_step_lists_its_prompts_as_skipped_and_the_books_count_them(tmp_path):
    run = _run(tmp_path, max_skipped_steps=3)
    run.log_step(1, 1, GOOD, ["a", "b"])
    run.log_step(2, 2, SKIPPED, ["c", "d"])
    run.log_step(3, 3, PARTLY, ["e", "f"])  # one of two optimizer steps applied: trained
    ledger = read_ledger(tmp_path)
    assert [r["trained"] for r in ledger] == [["a", "b"], [], ["e", "f"]]
    assert ledger[1]["skipped"] == ["c", "d"] and "skipped" not in ledger[2]
    summary = run.finish(step=3, version=3, final_val={}, wall_s=1.0,
                         extra={"prompts/trained": 6})  # fmt: skip
    assert summary["prompts/trained"] == 4 and summary["prompts/skipped"] == 2
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    # the NaN norm is in metrics.jsonl for a reader to see
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["actor/grad_norm"] == "NaN"
    run.close([])


def test_consecutive_skips_stop_the_run_after_both_records_are_written(tmp_path):
    run = _run(tmp_path, max_skipped_steps=2)
    run.log_step(1, 1, SKIPPED, ["a"])
    run.log_step(2, 2, GOOD, ["b"])  # an applied step starts the count again
    run.log_step(3, 3, SKIPPED, ["c"])
    with pytest.raises(RunFailure, match=r"^actor\.max_skipped_steps=2: 2 trainer steps in a row"):
        run.log_step(4, 4, SKIPPED, ["d"])
    assert read_ledger(tmp_path)[-1] == {
        "step": 4, "param_version": 4, "trained": [], "skipped": ["d"]
    }  # fmt: skip
    run.close([])


def test_zero_never_stops(tmp_path):
    run = _run(tmp_path, max_skipped_steps=0)
    for step in range(1, 6):
        run.log_step(step, step, SKIPPED, [str(step)])
    assert run.prompts_skipped == 5
    run.close([])


class FakeRanks:
    """The two calls a checkpoint makes of the trainer ranks."""

    def save_hf(self, path):
        (path / "model.safetensors").write_bytes(b"weights")

    def save_train_state(self, path):
        path.mkdir()
        (path / "optimizer.pt").write_bytes(b"adam")


def test_the_count_of_skipped_steps_in_a_row_survives_a_resume(tmp_path):
    run = _run(tmp_path, max_skipped_steps=2)
    run.log_step(1, 1, SKIPPED, ["a"])
    run.save(FakeRanks(), step=1, version=1, state={})
    run.close([])
    resumed = _run(tmp_path, max_skipped_steps=2)  # trainer.resume_mode=auto: from step 1
    assert resumed.resume_from is not None and resumed.consecutive_skips == 1
    with pytest.raises(RunFailure, match=r"2 trainer steps in a row \(the last: step 2\)"):
        resumed.log_step(2, 2, SKIPPED, ["b"])
    resumed.close([])
