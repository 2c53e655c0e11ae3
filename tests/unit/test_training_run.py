"""``TrainingRun.end_step``: the step tail every recipe shares, in one order (trace, metrics
read off the trace, validation when due, metrics.jsonl and ledger.jsonl, checkpoint)."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from recipe.checkpoint import read_ledger
from recipe.config import load_config
from recipe.protocol import PromptRecord
from recipe.run.training_run import TrainingRun

TRAINED = {"actor/grad_norm": 1.0, "actor/optimizer_steps": 1.0, "actor/skipped_steps": 0.0}

PROMPTS = [PromptRecord(f"train:p{i}", "1+1=", "2", "arithmetic") for i in range(100)]


def _run(tmp_path, test_freq: int) -> TrainingRun:
    cfg = OmegaConf.create(
        {"mode": "sync", "logger": {"backends": ["jsonl"]}, "trainer": {"test_freq": test_freq}}
    )
    return TrainingRun(load_config(cfg), tmp_path, train=PROMPTS, val=[])


def test_the_step_tail_runs_in_one_order_and_validates_only_when_due(tmp_path):
    run = _run(tmp_path, test_freq=2)
    calls: list[str] = []
    event = {"name": "generate", "ph": "X", "ts": 0, "dur": 1, "pid": 9, "tid": 1}

    def source():
        calls.append("trace")
        return [event]

    def from_trace(events):
        calls.append("from_trace")
        assert event in events  # what the sources buffered reaches the recipe
        return {"trainer/idle_ratio": 0.25}

    def validate():
        calls.append("validate")
        assert len(read_ledger(tmp_path)) == version - 1  # before the step's records
        return {"val/accuracy": 0.5}

    def checkpoint():
        calls.append("checkpoint")
        assert len(read_ledger(tmp_path)) == version  # after them

    results = []
    for version in (1, 2):
        metrics = dict(TRAINED)
        results.append(
            run.end_step(
                version,
                version,
                metrics,
                [f"p{version}"],
                sources=[source],
                from_trace=from_trace,
                validate=validate,
                checkpoint=checkpoint if version == 2 else None,
            )
        )
    run.close([])
    assert calls == ["trace", "from_trace", "trace", "from_trace", "validate", "checkpoint"]
    assert results == [{}, {"val/accuracy": 0.5}]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["trainer/idle_ratio"] == 0.25 and "val/accuracy" not in records[0]
    assert records[1]["val/accuracy"] == 0.5
    assert [r["trained"] for r in read_ledger(tmp_path)] == [["p1"], ["p2"]]
