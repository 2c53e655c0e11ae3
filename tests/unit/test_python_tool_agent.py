"""The python-tool agent's loop against a scripted OpenAI client: tool calls run in the real
sandbox and come back as ``tool`` messages, the final answer is scored by the registry for
either dataset, a spent budget ends the episode, and the preset composes in every mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hydra import compose, initialize_config_dir

from recipe.agent.examples import python_tool_agent as agent
from recipe.agent.sandbox import SandboxResult
from recipe.config import load_config, register_configs
from tests.helpers.scripted_openai import assistant, episode, math_record

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def _call(code: Any, name: str = "python", call_id: str = "call_0") -> dict[str, Any]:
    arguments = json.dumps({"code": code})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


@pytest.mark.parametrize("data_source", ["math", "openai/gsm8k"])
def test_a_tool_call_runs_in_the_sandbox_and_the_boxed_answer_is_scored(data_source):
    reward, client = episode(
        agent.run,
        [_call("print(6 * 7)"), assistant("So it is \\boxed{42}.")],
        math_record(data_source),
    )
    assert reward == 1.0
    first, second = client.requests
    assert first["tools"] == agent.TOOLS
    assert first["messages"][0] == {"role": "system", "content": agent.SYSTEM_PROMPT}
    assert second["messages"][: len(first["messages"])] == first["messages"]
    sent, tool = second["messages"][-2:]
    assert sent["tool_calls"][0]["function"]["name"] == "python"
    assert tool == {"role": "tool", "tool_call_id": "call_0", "content": "42"}


def test_a_wrong_or_missing_final_answer_scores_zero():
    assert episode(agent.run, [assistant("\\boxed{41}")])[0] == 0.0
    assert episode(agent.run, [assistant("It is 42.")])[0] == 0.0
    gsm8k = math_record("openai/gsm8k")
    assert (
        episode(agent.run, [assistant("It is 42.\n#### 42")], gsm8k)[0] == 1.0
    )  # GSM8K's own spelling


def test_a_spent_budget_ends_the_episode_with_reward_zero():
    request = httpx.Request("POST", "http://endpoint/v1/chat/completions")
    spent = openai.BadRequestError(
        "context_length_exceeded", response=httpx.Response(400, request=request), body=None
    )
    reward, client = episode(agent.run, [_call("print(1)"), spent])
    assert reward == 0.0 and len(client.requests) == 2


def test_the_episode_stops_after_max_turns(monkeypatch):
    monkeypatch.setattr(agent, "SETTINGS", agent.ToolSettings(max_turns=2))
    reward, client = episode(
        agent.run, [_call("print(1)"), _call("print(2)"), assistant("\\boxed{42}")]
    )
    assert reward == 0.0 and len(client.requests) == 2


def test_a_bad_call_is_answered_with_an_error_the_model_can_read():
    reward, client = episode(
        agent.run, [_call(None), _call("print(1)", name="bash"), assistant("\\boxed{42}")]
    )
    assert reward == 1.0
    errors = [m["content"] for m in client.requests[-1]["messages"] if m["role"] == "tool"]
    assert len(errors) == 2 and all(e.startswith("error: call the tool `python`") for e in errors)


def test_the_record_s_own_system_prompt_is_kept():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    assert agent.first_messages(messages) == messages
    assert agent.first_messages("1+1?")[0]["content"] == agent.SYSTEM_PROMPT


def test_tool_output_says_how_a_run_ended():
    settings = agent.ToolSettings(timeout_s=5.0, max_output_bytes=4096)
    killed = SandboxResult("partial\n", "", None, True, True, 5.0)
    assert agent.tool_output(killed, settings) == (
        "partial\n[output cut at 4096 bytes]\n[killed: ran past the 5 s time limit]"
    )
    failed = SandboxResult("", "Traceback ...\nZeroDivisionError\n", 1, False, False, 0.1)
    assert agent.tool_output(failed, settings) == (
        "[stderr]\nTraceback ...\nZeroDivisionError\n[exit status 1]"
    )
    assert agent.tool_output(SandboxResult("", "", 0, False, False, 0.1), settings) == "[no output]"


def test_tool_settings_come_from_the_environment_and_bad_ones_name_the_variable():
    settings = agent.ToolSettings.from_env(
        {"PYTHON_TOOL_TIMEOUT_S": "2.5", "PYTHON_TOOL_MAX_OUTPUT_BYTES": "1024"}
    )
    assert (settings.timeout_s, settings.max_output_bytes, settings.memory_mb) == (2.5, 1024, 512)
    for name, value in [("PYTHON_TOOL_MEMORY_MB", "lots"), ("PYTHON_TOOL_TIMEOUT_S", "inf")]:
        with pytest.raises(ValueError, match=f"{name}='{value}': expected a positive"):
            agent.ToolSettings.from_env({name: value})


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "fully_async"])
def test_the_math_python_preset_composes_in_every_mode(mode):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        overrides = ["env=math_python", f"mode={mode}", "data.train_files=[train.parquet]"]
        cfg = load_config(compose(config_name="config", overrides=overrides))
    multi_turn = cfg.rollout.multi_turn
    assert multi_turn.agent == "recipe.agent.examples.python_tool_agent:run"
    assert multi_turn.tool_parser == "hermes" and cfg.model.path.startswith("qwen2.5-coder")
