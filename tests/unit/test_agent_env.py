"""A command agent's environment and input (``rollout.multi_turn.agent_env``,
``agent_command_ground_truth``): built from an allow-list, not inherited, so the run's keys,
the worker's proxies and the answer stay out of the agent's tools' reach; the record on
stdin only, whatever its size. And a function agent's client, which no proxy of the
worker's may reroute. Real processes and the real in-process endpoint."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from recipe.agent.config import MultiTurnConfig
from recipe.agent.endpoint.agents import load_agent
from recipe.utils.config_check import ConfigError
from tests.helpers.endpoint_episodes import (
    REPLY,
    chat_tokenizer,
    python_command,
    record,
    run_episodes,
)

pytestmark = pytest.mark.model  # builds a transformers tokenizer

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PROXY = "http://127.0.0.1:9"  # nothing listens there: a request through it fails
SECRETS = {
    "WANDB_API_KEY": "wandb-secret",
    "HF_TOKEN": "hf-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "HTTP_PROXY": PROXY,
    "http_proxy": PROXY,
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("tok"))


def _finished(episode, reward):
    assert (episode.finish_reason, episode.reward) == ("stop", reward), episode.error


DUMP = """
record = json.loads(sys.stdin.read())
with open(sys.argv[1], "w") as out:
    json.dump({"env": dict(os.environ), "record": record}, out)
chat("hi")
print(1)
"""


def test_a_command_agent_gets_the_record_on_stdin_and_none_of_the_workers_secrets(
    tokenizer, tmp_path, monkeypatch
):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_TIME", "C")
    dump = tmp_path / "dump.json"
    rec = record("p-0", answer="#### 5")
    (episode,) = run_episodes(
        tokenizer, [rec], agent_command=python_command(tmp_path, DUMP, str(dump))
    )
    _finished(episode, 1.0)
    seen = json.loads(dump.read_text())
    env = seen["env"]
    assert env["PATH"] == os.environ["PATH"] and env["LC_TIME"] == "C"
    extra = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "NO_PROXY", "no_proxy"}
    allowed = {"PATH", "HOME", "LANG", "TMPDIR", *extra}
    assert {k for k in env if not k.startswith("LC_")} <= allowed, sorted(env)
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1"
    assert seen["record"] == {"uid": "p-0", "prompt": rec.prompt, "data_source": "test"}


def test_agent_env_and_the_ground_truth_key_are_given_on_request(tokenizer, tmp_path, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NO_PROXY", "internal.example")
    dump = tmp_path / "dump.json"
    rec = record("p-1", answer="#### 5")
    (episode,) = run_episodes(
        tokenizer,
        [rec],
        agent_command=python_command(tmp_path, DUMP, str(dump)),
        agent_env={
            "HF_TOKEN": None,
            "HTTP_PROXY": None,
            "http_proxy": None,
            "NO_PROXY": None,
            "MODE": "fast",
            "N": 3,
        },
        agent_command_ground_truth=True,
    )
    _finished(episode, 1.0)  # through the proxy it was given, the endpoint is not reached
    seen = json.loads(dump.read_text())
    env = seen["env"]
    assert (env["HF_TOKEN"], env["MODE"], env["N"]) == ("hf-secret", "fast", "3")
    assert env["HTTP_PROXY"] == SECRETS["HTTP_PROXY"] and "WANDB_API_KEY" not in env
    assert env["NO_PROXY"] == env["no_proxy"] == "internal.example,127.0.0.1"
    assert seen["record"]["ground_truth"] == "5"
    assert seen["record"]["extra_info"] == {"answer": "#### 5"}


def test_a_record_over_128_kib_reaches_a_command_agent_whole(tokenizer, tmp_path):
    prompt = "y" * 300_000  # past the 128 KiB limit of one environment string
    command = python_command(
        tmp_path,
        f"""
record = json.loads(sys.stdin.read())
chat("hi")
print(1.0 if record["prompt"] == "y" * {len(prompt)} else 0.0)
""",
    )
    (episode,) = run_episodes(tokenizer, [record("huge", prompt)], agent_command=command)
    _finished(episode, 1.0)


@pytest.mark.parametrize(
    ("value", "spec"),
    [
        (None, {}),
        (["HF_TOKEN", "WANDB_API_KEY"], {"HF_TOKEN": None, "WANDB_API_KEY": None}),
        ({"MODE": "fast", "N": 3, "HF_TOKEN": None}, {"MODE": "fast", "N": "3", "HF_TOKEN": None}),
    ],
)
def test_agent_env_takes_a_list_of_names_or_a_mapping_of_values(value, spec):
    config = MultiTurnConfig(enable=True, agent_command="sh", agent_env=value)
    assert config.agent_env_spec == spec


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        ("HF_TOKEN", "a list of names ([HF_TOKEN]) or a mapping"),
        (["MODE=fast"], "'MODE=fast' is not a name (a list passes names through"),
        ({"1BAD": "x"}, "'1BAD' is not an environment variable name"),
        ({"DEBUG": True}, "agent_env.DEBUG=True is invalid: a string or a number (quote"),
        ({"X": {"a": 1}}, "agent_env.X={'a': 1} is invalid"),
        ({"OPENAI_API_KEY": "k"}, "OPENAI_API_KEY is set per episode by the endpoint"),
    ],
)
def test_a_bad_agent_env_fails_at_startup_naming_the_key(value, msg):
    with pytest.raises(ConfigError, match=r"rollout\.multi_turn\.agent_env") as info:
        MultiTurnConfig(enable=True, agent_command="sh", agent_env=value)
    assert msg in str(info.value) and "\n" not in str(info.value)


def test_a_name_agent_env_passes_through_must_be_set_in_the_worker(monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    config = MultiTurnConfig(enable=True, agent_command="sh", agent_env=["NOT_SET_ANYWHERE"])
    with pytest.raises(ValueError, match="agent_env: NOT_SET_ANYWHERE is not set"):
        load_agent(config)


def test_agent_env_composes_from_the_command_line():
    from hydra import compose, initialize_config_dir

    from recipe.config import load_config, register_configs

    register_configs()
    overrides = [
        ["rollout.multi_turn.agent_env=[HF_TOKEN,WANDB_API_KEY]"],
        ["rollout.multi_turn.agent_env={MODE:fast,HF_TOKEN:null}"],
    ]
    specs = []
    for extra in overrides:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
            cfg = compose(
                config_name="config",
                overrides=[
                    "rollout.multi_turn.enable=true",
                    "rollout.multi_turn.agent_command=sh",
                    *extra,
                ],
            )
        specs.append(load_config(cfg).rollout.multi_turn.agent_env_spec)
    assert specs == [{"HF_TOKEN": None, "WANDB_API_KEY": None}, {"MODE": "fast", "HF_TOKEN": None}]


def test_a_function_agents_client_reaches_its_endpoint_past_a_proxy(
    tokenizer, tmp_path, monkeypatch
):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, PROXY)
    path = tmp_path / "agent.py"
    path.write_text(
        textwrap.dedent(
            f"""
            async def run(client, record):
                out = await client.chat.completions.create(
                    model="m", messages=[{{"role": "user", "content": "hi"}}])
                return 1.0 if out.choices[0].message.content == {REPLY!r} else 0.0
            """
        )
    )
    (episode,) = run_episodes(tokenizer, [record("p")], agent=f"{path}:run")
    _finished(episode, 1.0)
