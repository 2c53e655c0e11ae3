"""The OpenAI-compatible agent endpoint (recipe/agent/endpoint): a real HTTP server, the
`openai` client users write their agents with, agent files loaded by path as users name
them, and a scripted engine in place of vLLM (tests/helpers/agent_endpoint.py: what it
"samples" is set by each test, and it can cut a turn the way a weight sync does)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from recipe.agent.config import MultiTurnConfig
from recipe.agent.metrics import agent_metrics
from recipe.agent.runner import EpisodeRunner
from recipe.protocol import ENV_TOKEN_VERSION, PromptRecord
from recipe.tiny import EOS_TOKEN, build_tokenizer
from tests.helpers.agent_endpoint import (
    RECORD,
    ScriptedEngine,
    ids_of,
    make_endpoint,
    run_episode,
)
from tests.helpers.chat_templates import TOOLS, TOOLS_TEMPLATE

pytestmark = pytest.mark.model  # builds a transformers tokenizer

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=4096)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def _agent_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_agent.py"
    path.write_text(textwrap.dedent(body))
    return f"{path}:run"


TOOL_AGENT = """
    import json

    TOOLS = {tools}

    async def run(client, record):
        messages = [{{"role": "user", "content": record.prompt}}]
        first = await client.chat.completions.create(
            model="anything", messages=messages, tools=TOOLS, temperature=1.7, seed=1
        )
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls", first
        call = message.tool_calls[0]
        args = json.loads(call.function.arguments)
        messages += [
            message.model_dump(exclude_none=True),
            {{"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}},
        ]
        final = await client.chat.completions.create(
            model="anything", messages=messages, tools=TOOLS, max_tokens=50
        )
        usage = final.usage
        assert usage.prompt_tokens_details.cached_tokens == 3, usage
        return 1.0 if "5" in final.choices[0].message.content else 0.0
"""


def test_a_tool_agent_trains_on_exactly_the_tokens_the_engine_sampled(tokenizer, tmp_path):
    spec = _agent_file(tmp_path, TOOL_AGENT.format(tools=json.dumps(TOOLS)))
    engine = ScriptedEngine(tokenizer, [f"Let me add. {CALL}", "It is 5."])
    episode = run_episode(make_endpoint(tokenizer, spec), engine, budget=400)

    assert episode.finish_reason == "stop" and episode.reward == 1.0, episode.error
    assert (episode.num_turns, episode.num_tool_calls, episode.segments) == (2, 1, [])
    tokens = episode.tokens
    model = [t for t, m in zip(tokens.response_ids, tokens.loss_mask, strict=True) if m]
    assert model == engine.sampled  # trained tokens are the engine's, nothing re-tokenised
    assert set(tokens.logprobs[i] for i, m in enumerate(tokens.loss_mask) if m) == {-0.25}
    env_versions = {v for v, m in zip(tokens.versions, tokens.loss_mask, strict=True) if not m}
    assert env_versions == {ENV_TOKEN_VERSION}
    # The sequence: the prompt rendered once with the tools, the first turn as sampled, the
    # tool message as the template's delta, the second turn as sampled.
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": RECORD.prompt}],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tokens.prompt_ids == ids_of(tokenizer, prompt)
    eos = [tokenizer.eos_token_id]
    first, last = (
        ids_of(tokenizer, f"Let me add. {CALL}") + eos,
        ids_of(tokenizer, "It is 5.") + eos,
    )
    response = tokens.response_ids
    assert response[: len(first)] == first and response[-len(last) :] == last
    delta = tokenizer.decode(response[len(first) : -len(last)], skip_special_tokens=False)
    tool_turn = f"<|im_start|>user\n<tool_response>5</tool_response>{EOS_TOKEN}\n"
    assert delta == "\n" + tool_turn + "<|im_start|>assistant\n"
    # The run's sampling, not the agent's: its seed, its budgets; max_tokens only lowers.
    done_before_second = len(engine.calls[1]["context"]) - len(tokens.prompt_ids)
    assert [c["seed"] for c in engine.calls] == [7, 7 + done_before_second]
    assert engine.calls[1]["max_tokens"] == 50


def test_a_turn_cut_by_a_weight_sync_is_one_completion_with_both_versions(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        async def run(client, record):
            out = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": record.prompt}]
            )
            assert out.choices[0].message.content == "The answer is 5.", out
            assert out.choices[0].finish_reason == "stop"
            return None
        """,
    )
    engine = ScriptedEngine(tokenizer, ["The answer is 5."], cut_at=6)
    episode = run_episode(make_endpoint(tokenizer, spec), engine)
    assert episode.finish_reason == "stop" and episode.reward is None
    assert episode.response_text == "The answer is 5."
    assert episode.tokens.versions == [0] * 6 + [1] * (len(engine.sampled) - 6)
    assert len(engine.calls) == 2  # the cut request and its continuation
    assert engine.calls[1]["context"] == engine.calls[0]["context"] + engine.sampled[:6]


def test_edited_history_trains_each_segment_with_the_episode(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        async def run(client, record):
            first = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": record.prompt}]
            )
            summary = [{"role": "user", "content": "Earlier you said: " +
                        first.choices[0].message.content + " Sure?"}]
            await client.chat.completions.create(model="m", messages=summary)
            return 0.5
        """,
    )
    engine = ScriptedEngine(tokenizer, ["Five.", "Yes, five."])
    episode = run_episode(make_endpoint(tokenizer, spec), engine)
    assert episode.num_segments == 2 and len(episode.segments) == 1
    traj = episode.to_trajectory("p-0", 0)
    assert traj.episode["segments"] == 2.0 and traj.reward == 0.5
    first = traj.segments[0]
    assert sum(first.loss_mask) == len(ids_of(tokenizer, "Five.")) + 1
    assert tokenizer.decode(traj.prompt_ids).endswith(f"Sure?{EOS_TOKEN}\n<|im_start|>assistant\n")


def test_requests_without_the_episodes_key_are_refused(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        import openai

        async def run(client, record):
            other = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="ep-guess",
                                       max_retries=0)
            try:
                await other.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}])
            except openai.AuthenticationError as exc:
                assert exc.status_code == 401
            else:
                raise AssertionError("a wrong key was served")
            finally:
                await other.close()
            models = await client.models.list()
            assert [m.id for m in models.data] == ["policy"]
            out = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in out if c.choices])
            return 1.0 if text == "Hello." else 0.0
        """,
    )
    engine = ScriptedEngine(tokenizer, ["Hello."])
    episode = run_episode(make_endpoint(tokenizer, spec), engine)
    assert episode.finish_reason == "stop" and episode.reward == 1.0, episode.error
    assert len(engine.calls) == 1  # the refused request never reached the engine


def test_a_malformed_tool_call_comes_back_as_text_and_is_counted(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        f"""
        async def run(client, record):
            out = await client.chat.completions.create(
                model="m", messages=[{{"role": "user", "content": "add"}}], tools={TOOLS!r})
            choice = out.choices[0]
            assert choice.message.tool_calls is None and choice.finish_reason == "stop"
            assert choice.message.content.startswith("<tool_call>")
            return 0.0
        """,
    )
    engine = ScriptedEngine(tokenizer, ['<tool_call>{"name": "add", "arguments": [1]}'])
    episode = run_episode(make_endpoint(tokenizer, spec), engine)
    assert episode.finish_reason == "stop", episode.error
    assert episode.num_tool_parse_errors == 1
    assert episode.to_trajectory("p", 0).episode["tool_parse_errors"] == 1.0


def test_a_budget_refuses_the_request_and_the_episode_ends_as_length(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        import openai

        async def run(client, record):
            messages = [{"role": "user", "content": record.prompt}]
            while True:
                try:
                    out = await client.chat.completions.create(model="m", messages=messages)
                except openai.BadRequestError as exc:
                    assert exc.code == "context_length_exceeded", exc
                    return None
                messages += [out.choices[0].message.model_dump(exclude_none=True),
                             {"role": "user", "content": "More."}]
        """,
    )
    engine = ScriptedEngine(tokenizer, ["One.", "Two.", "Three."])
    episode = run_episode(make_endpoint(tokenizer, spec, max_assistant_turns=2), engine)
    assert episode.finish_reason == "length" and episode.num_turns == 2
    assert len(engine.calls) == 2


@pytest.mark.parametrize(
    ("body", "finish", "error", "timed_out"),
    [
        ("raise RuntimeError('tool server down')", "env_error", "tool server down", False),
        ("import asyncio\n    await asyncio.sleep(30)", "env_error", "agent_timeout_s", True),
        ("return 'five'", "env_error", "expected a float", False),
        ("return None", "env_error", "no model request", False),
    ],
)
def test_an_agent_that_fails_ends_its_episode_as_env_error(
    tokenizer, tmp_path, body, finish, error, timed_out
):
    spec = _agent_file(tmp_path, f"async def run(client, record):\n    {body}\n")
    engine = ScriptedEngine(tokenizer, ["x"])
    episode = run_episode(make_endpoint(tokenizer, spec, agent_timeout_s=0.5), engine)
    assert episode.finish_reason == finish and error in (episode.error or ""), episode.error
    assert episode.timed_out == timed_out
    assert episode.to_trajectory("p", 0).reward == 0.0


def test_an_engine_failure_is_the_runs_not_the_agents(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        async def run(client, record):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
        """,
    )
    engine = ScriptedEngine(tokenizer, [], fail=RuntimeError("EngineDeadError: core died"))
    with pytest.raises(RuntimeError, match="core died"):
        run_episode(make_endpoint(tokenizer, spec), engine)


def test_a_checkpoint_cut_ends_the_episode_as_aborted_to_start_again(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        async def run(client, record):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
        """,
    )
    config = MultiTurnConfig(enable=True, agent=spec)
    runner = EpisodeRunner(config, tokenizer, [tokenizer.eos_token_id])
    runner.endpoint.server._host = "127.0.0.1"
    engine = ScriptedEngine(tokenizer, ["a long answer"], cut_at=2, wait_cut=True)

    async def go():
        try:
            return await runner.run_group(engine, RECORD, budgets=[64], seeds=[1])
        finally:
            await runner.close()

    (traj,) = asyncio.run(go())
    assert traj.finish_reason == "aborted" and traj.agent_state is None
    assert not runner.saves_state


def test_a_resumed_group_runs_its_cut_agent_episodes_again_and_counts_them(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        """
        async def run(client, record):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": record.prompt}])
        """,
    )
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=spec), tokenizer, [0])
    runner.endpoint.server._host = "127.0.0.1"
    engine = ScriptedEngine(tokenizer, ["first", "again"], cut_at=2, wait_cut=True)

    async def go(**kwargs):
        try:
            return await runner.run_group(engine, RECORD, budgets=[64], seeds=[1], **kwargs)
        finally:
            await runner.close()

    (cut,) = asyncio.run(go())
    assert cut.finish_reason == "aborted" and cut.episode["restarted"] == 0.0
    kept = replace(cut, sample_index=1, finish_reason="stop", response_text="kept")
    engine.wait_cut = False
    runner = EpisodeRunner(MultiTurnConfig(enable=True, agent=spec), tokenizer, [0])
    runner.endpoint.server._host = "127.0.0.1"

    async def resumed():
        try:
            return await runner.run_group(
                engine, RECORD, budgets=[64, 64], seeds=[1, 2], resume=[cut, kept]
            )
        finally:
            await runner.close()

    again, same = asyncio.run(resumed())
    assert same is kept  # finished before the checkpoint: not run again
    assert again.finish_reason == "stop" and again.episode["restarted"] == 1.0
    assert cut.response_ids == [] and again.response_ids  # from the prompt, not the cut
    assert engine.calls[-1]["context"] == again.prompt_ids == cut.prompt_ids
    assert agent_metrics([again, same])["agent/episodes_restarted"] == 1.0


COMMAND_AGENT = """
import json, os, sys, urllib.request

record = json.loads(sys.stdin.read())
assert "RECIPE_RECORD" not in os.environ and "ground_truth" not in record  # stdin only
body = {"model": "m", "messages": [{"role": "user", "content": record["prompt"]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
if answer != "Five.":
    sys.exit(f"unexpected answer {answer!r}")
print("log line")
print(json.dumps({"reward": 0.75}))
"""


def test_a_command_agent_talks_to_its_episode_over_http(tokenizer, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(COMMAND_AGENT)
    endpoint = make_endpoint(tokenizer, command=f"{sys.executable} {script}")
    episode = run_episode(endpoint, ScriptedEngine(tokenizer, ["Five."]))
    assert episode.finish_reason == "stop" and episode.reward == 0.75, episode.error
    failing = make_endpoint(tokenizer, command=f"{sys.executable} {script}")
    episode = run_episode(failing, ScriptedEngine(tokenizer, ["Six."]))
    assert episode.finish_reason == "env_error"
    assert "exited with 1: unexpected answer 'Six.'" in episode.error


@pytest.mark.parametrize(
    ("overrides", "msg"),
    [
        ({"agent": "nowhere.py:run"}, "nowhere.py"),
        ({"agent_command": "no-such-program --flag"}, "command not found: 'no-such-program'"),
        ({"agent": "AGENT:sync_run"}, "is not an async function"),
        ({"agent": "AGENT:run", "environment": "calculator"}, "one of environment"),
        ({"agent": "AGENT:run", "tool_parser": "no_such_format"}, "no_such_format"),
    ],
)
def test_bad_agent_settings_fail_at_startup_naming_the_key(tokenizer, tmp_path, overrides, msg):
    path = tmp_path / "a.py"
    path.write_text("async def run(client, record):\n    pass\n\ndef sync_run(c, r):\n    pass\n")
    values = {k: v.replace("AGENT", str(path)) for k, v in overrides.items()}
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")) as info:
        EpisodeRunner(MultiTurnConfig(enable=True, **values), tokenizer, [1])
    assert "rollout.multi_turn." in str(info.value)


def test_tools_under_a_template_that_ignores_them_are_refused(tokenizer, tmp_path):
    spec = _agent_file(
        tmp_path,
        f"""
        import openai

        async def run(client, record):
            try:
                await client.chat.completions.create(
                    model="m", messages=[{{"role": "user", "content": "hi"}}], tools={TOOLS!r})
            except openai.BadRequestError as exc:
                raise RuntimeError(exc.message)
        """,
    )
    plain = build_tokenizer(tmp_path / "plain", model_max_length=4096)
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        + EOS_TOKEN
        + "\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    episode = run_episode(make_endpoint(plain, spec), ScriptedEngine(plain, ["x"]))
    assert episode.finish_reason == "env_error"
    assert "chat template does not render 'tools'" in episode.error


def test_the_readme_agent_runs_as_written(tokenizer, tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = readme.split("```python\n# my_agent.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_agent.py").write_text(code)
    record = PromptRecord("p-1", "What is 2 + 3?", "5", "test")
    engine = ScriptedEngine(tokenizer, [CALL, "The answer is 5."])
    endpoint = make_endpoint(tokenizer, f"{tmp_path / 'my_agent.py'}:run")

    async def go():
        try:
            return await endpoint.run_episode(engine, record, 400, 1)
        finally:
            await endpoint.close()

    episode = asyncio.run(go())
    assert episode.finish_reason == "stop" and episode.reward == 1.0, episode.error
    assert episode.num_tool_calls == 1 and episode.num_turns == 2


def test_concurrent_first_episodes_share_one_server(tokenizer, tmp_path):
    """A worker's first episodes arrive together: they must all bind to one server (a
    second one, unreferenced, would be collected with their connections open)."""
    from recipe.agent.endpoint.server import AgentServer

    async def go():
        server = AgentServer("127.0.0.1")

        async def url():
            await server.start()
            return server.base_url

        try:
            return await asyncio.gather(*(url() for _ in range(32)))
        finally:
            await server.close()

    urls = asyncio.run(go())
    assert len(set(urls)) == 1 and urls[0].startswith("http://127.0.0.1:")
