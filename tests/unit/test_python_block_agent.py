"""The code-block agent's loop against a scripted OpenAI client: the last python block of a
reply runs in the real sandbox and its output comes back as a user message, the guessed
answer of a turn that ran code never scores, the reply after the output does, a spent budget
ends the episode with 0; the block extractor and the output message hold on any text
(hypothesis), and the preset composes in every mode."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import openai
import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given
from hypothesis import strategies as st

from recipe.agent.examples import python_block_agent as agent
from recipe.agent.sandbox import SandboxResult
from recipe.config import load_config, register_configs
from tests.helpers.scripted_openai import ScriptedClient, assistant, episode, math_record

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
REPO = Path(__file__).resolve().parents[2]
BLOCK = "Let me compute.\n```python\nprint(6 * 7)\n```\nIt prints 42, so \\boxed{42}."
"""A turn that runs code and guesses its output (right, but never scored)."""


def _spent(status: int) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://endpoint/v1/chat/completions")
    error = openai.BadRequestError if status == 400 else openai.RateLimitError
    return error("spent", response=httpx.Response(status, request=request), body=None)


def _outputs(client: ScriptedClient) -> list[str]:
    """The output messages the agent sent, in the last request."""
    messages = client.requests[-1]["messages"][2:]
    return [m["content"] for m in messages if m["role"] == "user"]


@pytest.mark.parametrize("data_source", ["math", "openai/gsm8k"])
def test_a_block_runs_in_the_sandbox_and_the_reply_after_its_output_is_scored(data_source):
    reward, client = episode(
        agent.run, [assistant(BLOCK), assistant("So \\boxed{42}.")], math_record(data_source)
    )
    assert reward == 1.0
    first, second = client.requests
    assert "tools" not in first
    assert first["messages"][0] == {"role": "system", "content": agent.SYSTEM_PROMPT}
    assert second["messages"][:-2] == first["messages"]
    assert second["messages"][-2:] == [
        {"role": "assistant", "content": BLOCK},
        {"role": "user", "content": "Output:\n```\n42\n```"},
    ]


def test_the_guessed_answer_of_a_turn_that_ran_code_never_scores(monkeypatch):
    assert episode(agent.run, [assistant(BLOCK), _spent(400)])[0] == 0.0
    assert episode(agent.run, [assistant(BLOCK), _spent(429)])[0] == 0.0
    wrong_later = [assistant(BLOCK), assistant("\\boxed{41}")]  # the later reply counts
    assert episode(agent.run, wrong_later)[0] == 0.0
    monkeypatch.setattr(agent, "SETTINGS", agent.ToolSettings(max_turns=2))
    reward, client = episode(
        agent.run, [assistant(BLOCK), assistant(BLOCK), assistant("\\boxed{42}")]
    )
    assert reward == 0.0 and len(client.requests) == 2


@pytest.mark.parametrize("content", [None, "", "It is 42.", "\\boxed{41}", "```python\nx"])
def test_a_reply_without_a_block_is_the_final_answer(content):
    reward, client = episode(agent.run, [assistant(content)])
    assert reward == 0.0 and len(client.requests) == 1


def test_hostile_code_is_answered_with_what_happened(monkeypatch):
    monkeypatch.setattr(agent, "SETTINGS", agent.ToolSettings(timeout_s=0.5, max_turns=5))
    programs = [
        "while True:\n    pass",
        "import sys\nsys.stdout.buffer.write(bytes(range(256)) * 64)",
        "print('`' * 9)\nprint('x' * 10**6)",
        "1 / 0",
    ]
    replies = [assistant(f"```python\n{p}\n```") for p in programs]
    reward, client = episode(agent.run, [*replies, assistant("\\boxed{42}")])
    assert reward == 1.0
    hang, binary, huge, error = _outputs(client)
    assert hang.endswith("[killed: ran past the 0.5 s time limit]\n```")
    assert "\ufffd" in binary and len(binary.encode()) < 4096 + 100
    assert huge.startswith("Output:\n``````````\n`````````\nxxx") and "[output cut at" in huge
    assert "ZeroDivisionError" in error and error.endswith("[exit status 1]\n```")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("a\r\n```Py \r\nprint(1)\r\n```\r\nb", "print(1)\n"),
        ("```python3\nx = 1\n\nprint(x)\n````", "x = 1\n\nprint(x)\n"),
        ("```python\nprint(1)\n```\n```python\nprint(2)\n```", "print(2)\n"),  # the last
        ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)\n"),  # unterminated: none
        ("1. Compute:\n   ```python\n   x = 2\n   print(x)\n   ```", "x = 2\nprint(x)\n"),
        ("```python\ns = '''\n``\n'''\nprint(s)\n```", "s = '''\n``\n'''\nprint(s)\n"),
        ("```python\nprint('\ud800')\n```", "print('?')\n"),  # writable as main.py
        ("```python\nprint(1)", None),
        ("```python\n\n  \n```", None),  # blank
        ("```bash\nls\n```", None),
        ("````markdown\n```python\nprint(1)\n```\n````", None),  # quoted, not run
        ("```python print(1)```", None),  # not a fence
        ("`print(1)`", None),
        (None, None),
        (42, None),
        ([{"type": "text", "text": "```python\nprint(1)\n```"}], None),
    ],
)
def test_the_last_complete_python_block_is_the_one_run(text, code):
    assert agent.last_block(text) == code


def test_output_fences_outgrow_the_output_and_stderr_keeps_its_tail():
    settings = agent.ToolSettings(max_output_bytes=64)
    stderr = "Traceback\n" + "x" * 200 + "\nValueError: bad\n"
    message = agent.output_message(
        SandboxResult("```` 42\n", stderr, 1, False, False, 0.1), settings
    )
    assert message.startswith("Output:\n`````\n```` 42\n[stderr]\n")
    assert "ValueError: bad\n[output cut at 64 bytes]\n[exit status 1]\n`````" in message
    empty = SandboxResult("", "", 0, False, False, 0.1)
    assert agent.output_message(empty, settings) == "Output:\n```\n[no output]\n```"


OUTPUT_TEXT = st.text(st.sampled_from("`\n \t\rpy\u00e9\ufffd\x00x"), max_size=60) | st.text()
NOTICES_BYTES = 120
"""What ``[stderr]`` and the notices of how a run ended add to the output, at most."""


@given(text=OUTPUT_TEXT | st.none() | st.integers())
def test_the_block_extractor_never_raises_and_returns_runnable_code(text):
    code = agent.last_block(text)
    assert code is None or (code.strip() and code.endswith("\n"))
    if code is not None:
        code.encode("utf-8")  # written as main.py


@given(
    before=st.text().map(lambda t: t.replace("`", "")),
    code=st.text(min_size=1).filter(lambda c: c.strip() and "`" not in c and "\r" not in c),
    after=st.text().map(lambda t: t.replace("`", "")),
)
def test_a_block_after_any_text_is_found_as_written(before, code, after):
    text = f"{before}\n```python\n{code}\n```\n{after}"
    assert agent.last_block(text) == textwrap.dedent(code + "\n")


@given(
    stdout=OUTPUT_TEXT,
    stderr=OUTPUT_TEXT,
    exit_code=st.none() | st.integers(-64, 255),
    flags=st.tuples(st.booleans(), st.booleans()),
    budget=st.integers(1, 200),
)
def test_the_output_message_is_bounded_and_its_fence_is_never_closed_early(
    stdout, stderr, exit_code, flags, budget
):
    result = SandboxResult(stdout, stderr, exit_code, *flags, 0.1)
    message = agent.output_message(result, agent.ToolSettings(max_output_bytes=budget))
    head, fence, *body, last = message.split("\n")
    assert head == "Output:" and set(fence) == {"`"} and last == fence and len(fence) >= 3
    shown = "\n".join(body)
    assert "`" * len(fence) not in shown
    assert len(shown.encode()) <= budget + NOTICES_BYTES


def test_settings_come_from_the_environment_and_a_bad_one_fails_the_import_naming_it():
    settings = agent.ToolSettings.from_env({"PYTHON_TOOL_MAX_TURNS": "3"})
    assert (settings.max_turns, settings.timeout_s) == (3, 5.0)
    with pytest.raises(ValueError, match="PYTHON_TOOL_MAX_TURNS='0': expected a positive int"):
        agent.ToolSettings.from_env({"PYTHON_TOOL_MAX_TURNS": "0"})
    proc = subprocess.run(
        [sys.executable, "-c", f"import {agent.__name__}"],
        cwd=REPO,
        env={"PYTHON_TOOL_TIMEOUT_S": "soon", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert "ValueError: PYTHON_TOOL_TIMEOUT_S='soon': expected a positive float" in proc.stderr


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "fully_async"])
def test_the_math_python_block_preset_composes_in_every_mode(mode):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        overrides = ["env=math_python_block", f"mode={mode}", "data.train_files=[train.parquet]"]
        cfg = load_config(compose(config_name="config", overrides=overrides))
    multi_turn = cfg.rollout.multi_turn
    assert multi_turn.agent == "recipe.agent.examples.python_block_agent:run"
    assert multi_turn.enable and cfg.model.path.startswith("qwen2.5-coder")
