"""Episodes cut for a checkpoint and continued mid-way (``EpisodeRunner``, a fake engine):
a continued episode is the episode an uninterrupted run builds, token for token, whether
the cut fell inside a model turn or after an environment step; environments without state
start again; broken state hooks are contained or rejected at startup."""

from __future__ import annotations

import asyncio
import json

import pytest

from recipe.agent.builtin import ToolLatency
from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import EpisodeCut, TurnOutput
from recipe.agent.runner import EpisodeRunner
from recipe.protocol import PromptRecord
from recipe.tiny import build_tokenizer
from tests.helpers import agent_envs

pytestmark = pytest.mark.model  # builds a transformers tokenizer

RECORD = PromptRecord("p-0", "Add 2 and 3.", "5", "arith")
TURN_TOKENS = 5


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), model_max_length=512)


class PausingEngine:
    """Turns of exactly ``max_tokens`` tokens whose ids and log-probs follow from the context
    length. ``abort=(call, k)``: that call returns ``k`` tokens as ``aborted`` (a pause);
    ``k=0`` means the pause came before the call (during the environment step before it).
    The paused engine then serves a new version, or with ``cut`` ends the episode the way
    ``RolloutWorker.cut_episodes`` does."""

    def __init__(self, abort=None, cut=False, version=0):
        self.abort, self.cut, self.version = abort, cut, version
        self.paused, self.num_calls = False, 0
        self.calls: list[tuple[int, int, int | None]] = []  # served: (context, max, seed)

    async def generate_turn(self, context_ids, max_tokens, seed):
        call, self.num_calls = self.num_calls, self.num_calls + 1
        if self.abort is not None and self.abort[0] == call:
            self.paused = True
            if self.abort[1] > 0:
                self.calls.append((len(context_ids), max_tokens, seed))
                return self._tokens(context_ids, self.abort[1], "aborted")
            await self.wait_until_running()  # as the worker does before an engine request
        self.calls.append((len(context_ids), max_tokens, seed))
        return self._tokens(context_ids, max_tokens, "length")

    def _tokens(self, context_ids, count, finish):
        ids = [10 + (len(context_ids) + j) % 23 for j in range(count)]
        return TurnOutput(ids, [-0.01 * i for i in ids], [self.version] * count, finish)

    async def wait_until_running(self):
        if self.paused and self.cut:
            raise EpisodeCut("cut for a checkpoint")
        if self.paused:
            self.paused, self.version = False, self.version + 1


def _runner(tokenizer, environment, **kwargs):
    config = MultiTurnConfig(
        enable=True,
        environment=environment,
        environment_kwargs=kwargs,
        max_turn_tokens=TURN_TOKENS,
        max_assistant_turns=6,
        max_user_turns=6,
    )
    return EpisodeRunner(config, tokenizer, [tokenizer.eos_token_id])


def _group(runner, engine, record=RECORD, resume=None, n=1):
    return asyncio.run(
        runner.run_group(engine, record, budgets=[200] * n, seeds=[7] * n, resume=resume)
    )


def _same_episode(a, b):
    for name in ("prompt_ids", "response_ids", "rollout_logprobs", "token_versions"):
        assert getattr(a, name) == getattr(b, name), name
    assert (a.loss_mask, a.finish_reason, a.reward) == (b.loss_mask, b.finish_reason, b.reward)
    assert a.response_text == b.response_text
    assert {k: v for k, v in a.episode.items() if k != "env_s"} == {
        k: v for k, v in b.episode.items() if k != "env_s"
    }


SAVED = f"{agent_envs.PATH}:SavedTurns"


@pytest.mark.parametrize(
    "abort",
    [(1, 2), (0, 3), (2, 0), (1, 0)],
    ids=["inside turn 2", "inside turn 1", "after step 2", "after step 1"],
)
def test_an_episode_cut_for_a_checkpoint_continues_as_the_uninterrupted_one(tokenizer, abort):
    runner = _runner(tokenizer, SAVED, turns=3, step_s=0.0)
    whole = PausingEngine(abort=abort)
    (reference,) = _group(runner, whole)
    assert reference.finish_reason == "stop" and reference.episode["turns"] == 3

    first = PausingEngine(abort=abort, cut=True)
    (cut,) = _group(runner, first)
    assert cut.finish_reason == "aborted" and cut.agent_state is not None
    assert json.loads(json.dumps(cut.agent_state)) == cut.agent_state  # a checkpoint's JSON
    state = cut.agent_state
    if abort[1] == 0:  # the environment step finished before the cut
        assert state["turn"] == [] and state["counts"][2] == abort[0]
    else:
        assert len(state["turn"]) == abort[1]

    second = PausingEngine(version=1)  # a resumed run serves the pushed version
    (continued,) = _group(runner, second, resume=[cut])
    _same_episode(continued, reference)
    assert continued.agent_state is None
    assert first.calls + second.calls == whole.calls  # same contexts, budgets and seeds


def test_finished_members_pass_through_and_unsaved_episodes_start_again(tokenizer):
    runner = _runner(tokenizer, f"{agent_envs.PATH}:FixedTurns", turns=2, step_s=0.0)
    assert not runner.saves_state
    (cut,) = _group(runner, PausingEngine(abort=(1, 2), cut=True))
    assert cut.finish_reason == "aborted" and cut.agent_state is None
    (done,) = _group(runner, PausingEngine())
    again = _group(runner, PausingEngine(version=1), resume=[done, cut], n=2)
    assert again[0] is done or again[0] == done
    assert again[1].finish_reason == "stop" and again[1].episode["turns"] == 2
    assert set(again[1].token_versions) - {-1} == {1}  # generated anew on version 1


def test_state_that_is_not_json_restarts_the_episode_and_a_failed_load_is_an_env_error(
    tokenizer, caplog
):
    runner = _runner(tokenizer, f"{agent_envs.PATH}:UnsaveableTurns", turns=3, step_s=0.0)
    with caplog.at_level("WARNING"):
        (cut,) = _group(runner, PausingEngine(abort=(1, 2), cut=True))
    assert cut.finish_reason == "aborted" and cut.agent_state is None
    assert "UnsaveableTurns.state_dict() on prompt p-0" in caplog.text

    saved = _runner(tokenizer, SAVED, turns=3, step_s=0.0)
    (cut,) = _group(saved, PausingEngine(abort=(1, 2), cut=True))
    unloadable = _runner(tokenizer, f"{agent_envs.PATH}:UnloadableTurns", turns=3, step_s=0.0)
    (failed,) = _group(unloadable, PausingEngine(version=1), resume=[cut])
    assert (failed.finish_reason, failed.reward) == ("env_error", 0.0)
    assert failed.response_ids == cut.response_ids  # nothing generated after the failure


def test_an_environment_with_only_one_state_hook_fails_at_startup(tokenizer):
    with pytest.raises(ValueError, match=r"rollout\.multi_turn\.environment: HalfSaved"):
        _runner(tokenizer, f"{agent_envs.PATH}:HalfSaved")


@pytest.mark.parametrize(
    ("name", "kwargs", "record"),
    [
        ("calculator", {}, PromptRecord("c-1", "12+34-5=", "41", "calculator")),
        ("retry", {}, PromptRecord("r-1", "2+3=", "5", "arithmetic")),
        ("tool_latency", {"short_s": 0.0, "long_s": 0.0, "long_p": 0.5}, RECORD),
    ],
)
def test_builtin_environments_continue_from_their_saved_state(
    tokenizer, name, kwargs, record, monkeypatch
):
    """The fake engine's turns are never right answers: the episodes run out of turns or
    attempts, so the environment's own counters decide when they end."""
    runner = _runner(tokenizer, name, **kwargs)
    assert runner.saves_state
    monkeypatch.setattr(ToolLatency, "_episodes", {})  # same latency draws in both runs
    (reference,) = _group(runner, PausingEngine(abort=(1, 0)), record)
    monkeypatch.setattr(ToolLatency, "_episodes", {})
    (cut,) = _group(runner, PausingEngine(abort=(1, 0), cut=True), record)
    (continued,) = _group(runner, PausingEngine(version=1), record, resume=[cut])
    _same_episode(continued, reference)
    assert reference.episode["turns"] >= 2
    if name == "tool_latency":
        assert {k: v for k, v in continued.episode.items() if k.startswith("info/")} == {
            k: v for k, v in reference.episode.items() if k.startswith("info/")
        }
