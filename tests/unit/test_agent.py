"""recipe.agent with a scripted engine: token/mask/version bookkeeping across turns, a turn
cut by a weight sync, an environment step spanning one, tool errors, environment errors,
chat-template deltas, budgets and loading from import paths."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
from pathlib import Path

import pytest

from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import AgentContext, TurnOutput
from recipe.agent.env_loop import EnvironmentLoop, SingleTurnEnvironment
from recipe.agent.episode import ENV_VERSION
from recipe.agent.interface import Environment, StepResult
from recipe.agent.loading import agent_loop_factory
from recipe.agent.metrics import agent_metrics
from recipe.agent.render import ObservationRenderer
from recipe.protocol import PromptRecord
from recipe.tiny import EOS_TOKEN, build_tokenizer

pytestmark = pytest.mark.model  # builds a transformers tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    + EOS_TOKEN
    + "\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RECORD = PromptRecord("p-0", "Add 2 and 3.", "5", "arith")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=512)


@pytest.fixture
def chat_tokenizer(tmp_path):
    tok = build_tokenizer(tmp_path, model_max_length=512)
    tok.chat_template = CHAT_TEMPLATE
    return tok


class ScriptedEngine:
    """Answers turn k with ``turns[k]`` (text); ``cut_after`` tokens into a turn it aborts
    once, as a pause would, and the sync then bumps the version."""

    def __init__(self, tokenizer, turns, cut_after=None, stop=True):
        self.tok, self.turns, self.cut_after, self.stop = tokenizer, list(turns), cut_after, stop
        self.version, self.calls = 0, []

    async def generate_turn(self, context_ids, max_tokens, seed):
        self.calls.append((list(context_ids), max_tokens))
        ids = self.tok.encode(self.turns[0], add_special_tokens=False)
        if self.stop:
            ids = [*ids, self.tok.eos_token_id]
        if self.cut_after is not None:
            ids, rest = ids[: self.cut_after], ids[self.cut_after :]
            self.turns[0] = self.tok.decode(rest, skip_special_tokens=True)
            self.cut_after = None
            return TurnOutput(ids, [-0.5] * len(ids), [self.version] * len(ids), "aborted")
        ids = ids[:max_tokens]
        self.turns.pop(0)
        finish = "stop" if self.stop and len(ids) < max_tokens + 1 else "length"
        return TurnOutput(ids, [-0.25] * len(ids), [self.version] * len(ids), finish)

    async def wait_until_running(self):
        self.version += 1  # the sync loaded new weights


def _run(env, engine, tokenizer, length=200, **overrides):
    config = MultiTurnConfig(**{"enable": True, "environment": "single_turn", **overrides})
    renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id], config.observation_role)
    ctx = AgentContext(engine, renderer, config, response_length=length)
    asyncio.run(EnvironmentLoop(env).run(ctx, RECORD))
    return ctx.episode()


class Calculator(Environment):
    """Answers 'calc: a+b' with the sum, ends on 'answer: x'."""

    def __init__(self, delay_s: float = 0.0, on_step=None):
        self.delay_s, self.on_step = delay_s, on_step

    async def reset(self, record):
        return record.prompt

    async def step(self, action):
        if action.startswith("answer:"):
            return StepResult(reward=float(action.split(":")[1].strip() == "5"), done=True)
        if self.on_step is not None:
            self.on_step()
        await asyncio.sleep(self.delay_s)  # a slow tool
        a, b = action.split(":")[1].split("+")
        return StepResult(observation=f" ={int(a) + int(b)}\n", info={"calls": 1})


def _check_invariants(episode, tokenizer):
    tokens = episode.tokens
    n = len(tokens.response_ids)
    assert len(tokens.loss_mask) == len(tokens.logprobs) == len(tokens.versions) == n
    for mask, lp, version in zip(tokens.loss_mask, tokens.logprobs, tokens.versions, strict=True):
        assert (mask == 0) == (version == ENV_VERSION) and (mask == 1 or lp == 0.0)


def test_single_turn_is_one_model_turn_scored_by_the_reward_function(tokenizer):
    engine = ScriptedEngine(tokenizer, ["5"])
    episode = _run(SingleTurnEnvironment(), engine, tokenizer)
    assert episode.finish_reason == "stop" and episode.reward is None and episode.num_turns == 1
    assert episode.tokens.prompt_ids == tokenizer.encode(RECORD.prompt, add_special_tokens=False)
    assert episode.tokens.loss_mask == [1, 1] and episode.response_text == "5"
    _check_invariants(episode, tokenizer)


def test_tool_turns_append_observations_with_mask_zero_and_sum_step_rewards(tokenizer):
    engine = ScriptedEngine(tokenizer, ["calc: 2+3", "answer: 5"])
    episode = _run(Calculator(), engine, tokenizer)
    assert (episode.finish_reason, episode.reward) == ("stop", 1.0)
    assert (episode.num_turns, episode.num_tool_calls, episode.num_tool_errors) == (2, 2, 0)
    observation = tokenizer.encode(" =5\n", add_special_tokens=False)
    first = [*tokenizer.encode("calc: 2+3", add_special_tokens=False), tokenizer.eos_token_id]
    tokens = episode.tokens
    assert tokens.response_ids[: len(first) + len(observation)] == first + observation
    assert tokens.loss_mask[len(first) : len(first) + len(observation)] == [0] * len(observation)
    # The second turn continued from everything so far, never re-rendered.
    assert engine.calls[1][0] == tokens.prompt_ids + first + observation
    assert episode.info == {"calls": 1.0}
    _check_invariants(episode, tokenizer)


def test_a_turn_cut_by_a_sync_continues_in_place_on_the_new_version(tokenizer):
    engine = ScriptedEngine(tokenizer, ["answer: 5"], cut_after=3)
    episode = _run(Calculator(), engine, tokenizer)
    assert episode.num_turns == 1 and episode.response_text == "answer: 5"
    versions = episode.tokens.versions
    assert versions[:3] == [0, 0, 0] and set(versions[3:]) == {1}
    prompt = episode.tokens.prompt_ids
    assert engine.calls[1][0] == prompt + episode.tokens.response_ids[:3]
    assert engine.calls[1][1] == engine.calls[0][1] - 3  # the turn's budget, less what it had
    assert episode.reward == 1.0


def test_an_environment_step_spanning_a_sync_is_not_cut_and_the_next_turn_is_newer(tokenizer):
    engine = ScriptedEngine(tokenizer, ["calc: 2+3", "answer: 5"])

    def sync_during_step():
        engine.version += 1

    episode = _run(Calculator(delay_s=0.01, on_step=sync_during_step), engine, tokenizer)
    assert episode.finish_reason == "stop" and episode.num_tool_errors == 0
    model = episode.tokens.model_versions()
    first_len = len(tokenizer.encode("calc: 2+3", add_special_tokens=False)) + 1
    assert set(model[:first_len]) == {0} and set(model[first_len:]) == {1}


def test_a_step_past_its_timeout_ends_the_episode_as_an_env_error(tokenizer):
    engine = ScriptedEngine(tokenizer, ["calc: 2+3", "answer: 5"])
    episode = _run(Calculator(delay_s=1.0), engine, tokenizer, step_timeout_s=0.05)
    assert (episode.finish_reason, episode.timed_out) == ("env_error", True)
    assert episode.error == (
        "step: EnvTimeoutError: no answer within rollout.multi_turn.step_timeout_s=0.05 s"
    )
    traj = episode.to_trajectory("p", 0)
    assert traj.episode["env_timeouts"] == 1.0 and traj.reward == 0.0
    assert agent_metrics([traj])["agent/env_timeouts"] == 1.0


def test_a_blocking_step_past_its_timeout_is_abandoned_and_logged_once(tokenizer, caplog):
    release = threading.Event()

    class Hung(Calculator):
        def step(self, action):  # blocking: runs in a worker thread
            release.wait(10)
            return StepResult(done=True)

    engine = ScriptedEngine(tokenizer, ["calc: 2+3"])
    threading.Timer(1.0, release.set).start()  # asyncio.run waits for the thread at its end
    with caplog.at_level(logging.WARNING, logger="recipe.agent.env_loop"):
        episode = _run(Hung(), engine, tokenizer, step_timeout_s=0.05)
    assert episode.env_s[-1] < 0.5  # the episode went on without the thread
    assert episode.finish_reason == "env_error" and episode.timed_out
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("Hung.step: no answer within")


def _pair(episode):
    return episode.tokens.response_ids, episode.tokens.loss_mask


def test_an_environment_that_raises_ends_its_episode_with_reward_zero(tokenizer):
    class Broken(Calculator):
        async def step(self, action):
            raise KeyError("no such tool")

    episode = _run(Broken(), ScriptedEngine(tokenizer, ["calc: 1+1"]), tokenizer)
    assert (episode.finish_reason, episode.reward) == ("env_error", 0.0)
    assert episode.error == "step: KeyError: 'no such tool'"


@pytest.mark.parametrize(
    ("reward", "error"),
    [
        (math.nan, "reward nan is not a finite number"),
        (-math.inf, "reward -inf is not a finite number"),
        ("0.5", "reward '0.5' (str) is not a number"),
        ([1.0], "reward [1.0] (list) is not a number"),
    ],
)
def test_a_step_reward_that_is_not_a_finite_number_ends_its_episode_as_an_env_error(
    tokenizer, caplog, reward, error
):
    class Faulty(Calculator):
        async def step(self, action):
            return StepResult(observation=" =2\n", reward=reward)

    engine = ScriptedEngine(tokenizer, ["calc: 1+1", "calc: 2+2"])
    with caplog.at_level(logging.WARNING, logger="recipe.agent.env_loop"):
        episode = _run(Faulty(), engine, tokenizer)
    assert (episode.finish_reason, episode.reward) == ("env_error", 0.0)
    assert episode.error == f"step: EnvRewardError: {error}"
    assert len(engine.calls) == 1  # no turn after the faulty step
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"Faulty.step: {error}; the episode ends as env_error"]
    assert agent_metrics([episode.to_trajectory("p", 0)])["agent/env_errors"] == 1.0


def test_an_agent_loop_adding_a_nan_reward_is_refused_by_the_context(tokenizer):
    config = MultiTurnConfig(enable=True, environment="single_turn")
    renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id], config.observation_role)
    ctx = AgentContext(ScriptedEngine(tokenizer, []), renderer, config, response_length=10)
    ctx.add_reward(0.5)
    with pytest.raises(ValueError, match=r"^reward nan is not a finite number$"):
        ctx.add_reward(math.nan)
    assert ctx.episode().reward == 0.5


def test_an_info_key_that_cannot_name_a_metric_is_dropped_with_one_warning(tokenizer, caplog):
    class Reporting(Calculator):
        async def step(self, action):
            return StepResult(done=True, info={"tool latency": 1.0, "calls": 2})

    engine = ScriptedEngine(tokenizer, ["calc: 1+1"])
    with caplog.at_level(logging.WARNING, logger="recipe.agent.context"):
        episode = _run(Reporting(), engine, tokenizer)
    assert episode.info == {"calls": 2.0}
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "an environment's StepResult.info has the key 'tool latency' (a space or a slash)"
    ]


def test_budgets_end_an_episode_as_length_and_long_observations_are_cut(tokenizer):
    engine = ScriptedEngine(tokenizer, ["calc: 2+3"] * 3)

    class Chatty(Calculator):
        async def step(self, action):
            return StepResult(observation="x" * 500)

    episode = _run(Chatty(), engine, tokenizer, max_assistant_turns=2, max_tool_response_length=7)
    assert episode.finish_reason == "length" and episode.num_turns == 2
    env_tokens = [t for t, m in zip(*_pair(episode), strict=True) if m == 0]
    assert len(env_tokens) == 7 and tokenizer.decode(env_tokens) == "x" * 7
    assert episode.num_truncated_observations == 1
    assert episode.to_trajectory("p-0", 0).episode["truncated_observations"] == 1.0
    short = _run(Chatty(), ScriptedEngine(tokenizer, ["calc: 2+3"] * 9), tokenizer, length=12)
    assert short.tokens.num_response_tokens <= 12 and short.finish_reason == "length"


def test_chat_observations_are_exact_token_deltas_after_the_model_turn(chat_tokenizer):
    tok = chat_tokenizer
    renderer = ObservationRenderer(tok, [tok.eos_token_id])
    turn = [*tok.encode("calc: 2+3", add_special_tokens=False), tok.eos_token_id]
    prompt = renderer.prompt_ids("Add 2 and 3.")
    delta = renderer.observation_ids("=5", turn)
    conversation = [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "calc: 2+3"},
        {"role": "user", "content": "=5"},
    ]
    whole = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert prompt + turn + delta == tok.encode(whole, add_special_tokens=False)
    cut = renderer.observation_ids("=5", turn[:-1])  # no EOS: the whole close comes first
    assert tok.decode(cut).startswith(EOS_TOKEN + "\n<|im_start|>user")


def test_a_template_that_rerenders_history_fails_at_startup(chat_tokenizer):
    chat_tokenizer.chat_template = "{{ messages | length }}" + CHAT_TEMPLATE
    with pytest.raises(ValueError, match="not prefix-stable"):
        ObservationRenderer(chat_tokenizer, [chat_tokenizer.eos_token_id])


ENV_FILE = """
from recipe.agent import Environment, StepResult

class Echo(Environment):
    def __init__(self, suffix="!"):
        self.suffix = suffix
    async def reset(self, record):
        return record.prompt + self.suffix
    async def step(self, action):
        return StepResult(reward=1.0, done=True)

class Half(Environment):
    async def reset(self, record):
        return record.prompt

class NotAnEnv:
    pass
"""


def test_environments_load_from_a_file_with_kwargs_and_bad_specs_name_the_key(tmp_path, tokenizer):
    path = tmp_path / "my_env.py"
    path.write_text(ENV_FILE)
    spec = f"{path}:Echo"
    make = agent_loop_factory(
        MultiTurnConfig(enable=True, environment=spec, environment_kwargs={"suffix": "?"})
    )
    assert make() is not make()  # one loop (and environment) per episode
    episode = _run(make().environment, ScriptedEngine(tokenizer, ["ok"]), tokenizer)
    assert episode.reward == 1.0
    assert tokenizer.decode(episode.tokens.prompt_ids) == RECORD.prompt + "?"
    cases = {
        f"{path}:Half": "does not implement step",
        f"{path}:NotAnEnv": "does not subclass recipe.agent.interface.Environment",
        f"{path}:Missing": "its classes: Echo, Environment, Half, NotAnEnv, StepResult",
        f"{tmp_path / 'nope.py'}:Echo": "file not found",
        "Echo": "allowed 'path/to/file.py:class'",
    }
    for bad, message in cases.items():
        with pytest.raises(ValueError, match=r"rollout\.multi_turn\.environment") as err:
            agent_loop_factory(MultiTurnConfig(enable=True, environment=bad))
        assert message in str(err.value)
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.environment_kwargs"):
        agent_loop_factory(
            MultiTurnConfig(enable=True, environment=spec, environment_kwargs={"x": 1})
        )


def test_config_names_the_key_of_a_bad_value():
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.environment=None"):
        MultiTurnConfig(enable=True)
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.observation_role"):
        MultiTurnConfig(observation_role="system")


def test_an_episode_trains_on_model_tokens_only_and_its_versions_skip_observations(tokenizer):
    from recipe.workers.trainer.batch import TrainBatch

    engine = ScriptedEngine(tokenizer, ["calc: 2+3", "answer: 5"])
    engine.version = 3
    episode = _run(Calculator(), engine, tokenizer)
    traj = episode.to_trajectory("p-0", 0)
    assert (traj.min_version, traj.max_version, traj.reward) == (3, 3, 1.0)
    assert traj.episode["turns"] == 2 and traj.episode["env_reward"] == 1.0
    batch = TrainBatch.from_trajectories([traj], pad_token_id=0)
    num_prompt = len(traj.prompt_ids)
    mask = batch.response_mask_bt[0, num_prompt : num_prompt + len(traj.response_ids)]
    assert mask.tolist() == [bool(m) for m in traj.loss_mask] and not all(mask.tolist())
    assert not batch.response_mask_bt[0, :num_prompt].any()


def test_the_documented_environment_runs_its_tool_and_counts_a_tool_error(tmp_path, tokenizer):
    readme = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    source = readme.split("```python\n# my_env.py\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my_env.py"
    path.write_text(source)
    config = MultiTurnConfig(
        enable=True, environment=f"{path}:Calculator", environment_kwargs={"max_calls": 2}
    )
    record = PromptRecord("p-1", "What is 12*7?", "84", "arithmetic")
    renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id])
    engine = ScriptedEngine(tokenizer, ["calc: 1/0", "calc: 12*7", "answer: 84"])
    ctx = AgentContext(engine, renderer, config, response_length=200)
    asyncio.run(agent_loop_factory(config)().run(ctx, record))
    episode = ctx.episode()
    assert (episode.finish_reason, episode.reward, episode.num_tool_errors) == ("stop", 1.0, 1)
    shown = tokenizer.decode([t for t, m in zip(*_pair(episode), strict=True) if m == 0])
    assert "error: division by zero" in shown and "= 84" in shown


def test_agent_metrics_count_episodes_and_too_many_environment_errors_stop_the_run(tokenizer):
    from recipe.agent.metrics import EnvironmentFailureError, agent_metrics, check_env_errors
    from recipe.faults import RunFailure

    ok = _run(Calculator(), ScriptedEngine(tokenizer, ["calc: 2+3", "answer: 5"]), tokenizer)

    class Broken(Calculator):
        async def step(self, action):
            raise OSError("sandbox down")

    bad = _run(Broken(), ScriptedEngine(tokenizer, ["calc: 1+1"]), tokenizer)
    trajs = [ok.to_trajectory("p-0", 0), bad.to_trajectory("p-1", 0)]
    metrics = agent_metrics(trajs)
    assert metrics["agent/turns_mean"] == 1.5 and metrics["agent/env_errors"] == 1.0
    assert metrics["agent/finish_env_error"] == metrics["agent/finish_stop"] == 0.5
    assert 0 < metrics["agent/model_token_ratio"] < 1
    assert metrics["agent/info/calls"] == 1.0  # the one episode that reported it
    check_env_errors(trajs, 0.5, "my_env.py:Calc")  # 1 of 2 is not more than half
    with pytest.raises(EnvironmentFailureError, match=r"my_env\.py:Calc.*prompt 'p-1'") as err:
        check_env_errors(trajs, 0.25, "my_env.py:Calc")
    assert isinstance(err.value, RunFailure)
    assert agent_metrics([]) == {}


def test_builtin_calculator_episodes_are_the_token_sequences_its_warm_start_trains_on(tokenizer):
    from recipe.agent.builtin import Calculator as BuiltinCalculator
    from recipe.tiny.calculator import encode_episodes

    record = PromptRecord("c-0", "12+34-5=", "41", "calculator")
    engine = ScriptedEngine(tokenizer, ["12+34", "46-5", "41"])
    config = MultiTurnConfig(enable=True, environment="calculator", max_turn_tokens=8)
    renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id])
    ctx = AgentContext(engine, renderer, config, response_length=48)
    asyncio.run(EnvironmentLoop(BuiltinCalculator()).run(ctx, record))
    episode = ctx.episode()
    assert episode.finish_reason == "stop" and episode.reward == 1.0
    assert (episode.num_turns, episode.num_tool_calls, episode.num_tool_errors) == (3, 3, 0)
    input_ids, labels, _ = encode_episodes([record], tokenizer)
    tokens = episode.tokens
    assert [*tokens.prompt_ids, *tokens.response_ids] == input_ids[0].tolist()
    trained = [int(label != -100) for label in labels[0].tolist()]
    assert trained == [0] * len(tokens.prompt_ids) + list(tokens.loss_mask)
    assert episode.to_trajectory("c-0", 0).episode["info/calls"] == 2.0


def test_a_blocking_environment_runs_in_a_thread_and_never_stalls_other_episodes(tokenizer):
    import threading

    loop_threads: set[int] = set()
    all_four_in_step = threading.Barrier(4, timeout=10.0)  # broken unless the steps overlap

    class Blocking(Environment):
        def reset(self, record):  # plain functions: a blocking tool
            return record.prompt

        def step(self, action):
            loop_threads.add(threading.get_ident())
            all_four_in_step.wait()
            return StepResult(reward=1.0, done=True)

    async def both():
        config = MultiTurnConfig(enable=True, environment="single_turn")
        renderer = ObservationRenderer(tokenizer, [tokenizer.eos_token_id])
        ctxs = [
            AgentContext(ScriptedEngine(tokenizer, ["x"]), renderer, config, response_length=50)
            for _ in range(4)
        ]
        await asyncio.gather(*(EnvironmentLoop(Blocking()).run(c, RECORD) for c in ctxs))
        return [c.episode() for c in ctxs]

    episodes = asyncio.run(both())
    assert all(e.reward == 1.0 for e in episodes)  # four blocking steps side by side
    assert threading.get_ident() not in loop_threads


def test_a_constructor_that_rejects_its_arguments_fails_at_startup_naming_the_key():
    config = MultiTurnConfig(
        enable=True, environment="retry", environment_kwargs={"max_attempts": 0}
    )
    with pytest.raises(ValueError, match=r"environment_kwargs=.*max_attempts=0\): allowed >= 1"):
        agent_loop_factory(config)


def test_each_turn_and_environment_call_is_a_trace_slice_on_its_episode_track(tokenizer):
    from recipe.agent.runner import EpisodeRunner
    from recipe.observability.request_trace import RequestTrace
    from recipe.observability.trace import EPISODE_TID_BASE

    runner = EpisodeRunner(
        MultiTurnConfig(enable=True, environment="retry"), tokenizer, [tokenizer.eos_token_id]
    )
    trace = RequestTrace()
    record = PromptRecord("p-2", "2+3=", "5", "arithmetic")
    cut = ScriptedEngine(tokenizer, ["4", "5"], cut_after=1)  # a sync inside the first turn
    (traj,) = asyncio.run(runner.run_group(cut, record, budgets=[64], seeds=[1], trace=trace))
    assert traj.episode["turns"] == 2.0 and traj.reward == 0.5  # right at the second attempt
    events = [e for e in trace.drain(0) if e["ph"] == "X"]
    turns = [e["args"] for e in events if e["name"] == "turn"]
    assert [(t["cuts"], t["versions"]) for t in turns] == [(1, [0, 1]), (0, [1])]
    assert [e["args"]["call"] for e in events if e["name"] == "env"] == [1, 2, 3]  # reset, 2 steps
    assert {e["tid"] for e in events} == {EPISODE_TID_BASE}

    both = ScriptedEngine(tokenizer, ["5", "5"])
    asyncio.run(runner.run_group(both, record, budgets=[64, 64], seeds=[1, 2], trace=trace))
    events = [e for e in trace.drain(0) if e["ph"] == "X"]
    assert sorted(e["args"]["sample"] for e in events if e["name"] == "turn") == [0, 1]
    assert {e["tid"] for e in events} == {EPISODE_TID_BASE, EPISODE_TID_BASE + 1}
    for track in (EPISODE_TID_BASE, EPISODE_TID_BASE + 1):  # a track's slices never overlap
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == track)
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(mine))
