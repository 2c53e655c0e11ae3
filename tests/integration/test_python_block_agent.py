"""The code-block agent (recipe/agent/examples/python_block_agent.py) trained end to end: real
Ray, a real vLLM-CPU engine behind the agent endpoint, the FSDP2 trainer, and the sandbox
running the python block the model writes.

The model is the random tiny Qwen2 with a chat template, fitted in a few seconds to one
episode: its first turn is a ```python block of ``print(6*7)``, its turn after the agent's
``Output:`` message ``\\boxed{42}``. The engine samples those turns, the agent finds the block,
runs it in the sandbox and sends the output back as a user message, and the trained sequence
holds the sandbox's ``42`` in that message (mask 0), the model's turns as sampled (mask 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.agent.examples import python_block_agent as agent
from recipe.agent.sandbox import SandboxResult
from recipe.model import HFModelConfig
from tests.helpers.chat_templates import copy_with_tools_template
from tests.helpers.fitting import fit_to_episode
from tests.helpers.models import EOS
from tests.helpers.runs import agent_preset, build_recipe, read_metrics, spy_on_groups

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

QUESTION = [{"role": "system", "content": "Use python."}, {"role": "user", "content": "6*7?"}]
BLOCK = {"role": "assistant", "content": "```python\nprint(6*7)\n```"}
PRINTED = SandboxResult("42\n", "", 0, timed_out=False, truncated=False, seconds=0.0)
OUTPUT = {"role": "user", "content": agent.output_message(PRINTED, agent.SETTINGS)}
FINAL = {"role": "assistant", "content": "\\boxed{42}"}
NUM_STEPS = 1
PRESET = agent_preset(2)


@pytest.fixture(scope="module")
def python_block_model(rollout_model_path: Path, tmp_path_factory) -> Path:
    """The tiny Qwen2 with a chat template, fitted on the two model turns of the episode."""
    path = tmp_path_factory.mktemp("python_block_model") / "model"
    copy_with_tools_template(rollout_model_path, path, EOS)
    fit_to_episode(path, [*QUESTION, BLOCK, OUTPUT, FINAL])
    return path


# A run of its own (~50 s in CI), nightly like its function-tool twin: the agent's turns stay
# in CI on fakes (tests/unit/test_python_block_agent.py), the sandbox in test_sandbox.py.
@pytest.mark.nightly
def test_an_episode_whose_python_block_runs_in_the_sandbox_trains_end_to_end(
    python_block_model, tmp_path
):
    rows = tmp_path / "train.jsonl"
    row = {"data_source": "math", "prompt": QUESTION, "reward_model": {"ground_truth": "42"}}
    rows.write_text("".join(json.dumps(row) + "\n" for _ in range(16)))
    overrides = {
        "model.path": str(python_block_model),
        "data.train_files": [str(rows)],
        "data.max_prompt_length": 512,
        "rollout.n": 2,
        "rollout.max_num_seqs": 4,
        "rollout.response_length": 384,
        "rollout.multi_turn.enable": True,
        "rollout.multi_turn.agent": "recipe.agent.examples.python_block_agent:run",
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
    tokenizer = HFModelConfig(python_block_model).tokenizer
    trajs = [t for _, groups in seen for g in groups for t in g.trajectories]
    solved = []
    for traj in trajs:
        assert traj.finish_reason == "stop", traj.finish_reason
        masked = zip(traj.response_ids, traj.loss_mask, strict=True)
        env_text = tokenizer.decode([i for i, m in masked if not m])
        shown = tokenizer.decode(traj.response_ids)
        if traj.episode["turns"] > 1:  # the agent found a block, ran it and asked again
            # The sandbox's output of print(6*7), sent as a user message, rendered by the
            # chat template after the model's turn (mask 0: not trained on).
            assert traj.episode["segments"] == 1, shown
            assert f"<|im_start|>user\n{OUTPUT['content']}" in env_text, shown
            assert shown.startswith(BLOCK["content"] + EOS), shown
            solved.append(traj.reward == 1.0 and shown.endswith(FINAL["content"] + EOS))
    shown = [tokenizer.decode(t.response_ids) for t in trajs[:2]]
    assert any(solved), f"no episode ran its block and was rewarded for its answer: {shown}"
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert len(steps) == NUM_STEPS
    assert max(r["agent/turns_mean"] for r in steps) > 1
    assert all(r["agent/env_errors"] == 0 for r in steps)
