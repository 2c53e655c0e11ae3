"""Scoring a prompt group the way every recipe does (``RewardFunction.score_group`` /
``ascore_group``): plain and ``async def`` functions, dict results whose extra numbers become
``reward/<key>`` metrics, and functions that fail, which must name themselves and the row."""

from __future__ import annotations

import asyncio
import re

import pytest

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward import RewardConfig, RewardError, RewardFunction
from recipe.run.metrics import sample_metrics

RECORD = PromptRecord(
    uid="train:my_task.jsonl:7",
    prompt=[{"role": "user", "content": "What is 2+3?"}],
    ground_truth="5",
    data_source="my_task",
    extra_info={"index": 7},
)


def _group(*texts: str) -> list[Trajectory]:
    return [
        Trajectory("train:my_task.jsonl:7", i, [1, 2], [3], [-0.5], [0], "stop", response_text=t)
        for i, t in enumerate(texts)
    ]


def _reward(tmp_path, body: str) -> RewardFunction:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return RewardFunction(RewardConfig(custom_fn=f"{path}:compute_score"))


PLAIN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(ground_truth in solution_str), "format_ok": 1.0, "pred": "x"}
"""
ASYNC = """
import asyncio
in_flight = 0
peak = 0
async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global in_flight, peak
    in_flight += 1
    peak = max(peak, in_flight)
    await asyncio.sleep(0.05)  # a reward service: the group's calls overlap
    in_flight -= 1
    return {"score": float(ground_truth in solution_str), "latency_ms": 50.0, "peak": peak}
"""


def test_a_dict_result_fills_rewards_and_its_numeric_extras_become_metrics(tmp_path):
    group = _group("it is 5", "it is 6", "5!")
    _reward(tmp_path, PLAIN).score_group(RECORD, group)
    assert [t.reward for t in group] == [1.0, 0.0, 1.0]
    assert group[0].reward_extras == {"format_ok": 1.0}  # the string "pred" is not a metric
    metrics = sample_metrics(group)
    assert metrics["reward/mean"] == pytest.approx(2 / 3)
    assert metrics["reward/format_ok"] == 1.0


def test_an_async_reward_function_scores_a_group_concurrently_in_both_entry_points(tmp_path):
    reward = _reward(tmp_path, ASYNC)
    group = _group(*(f"answer {i}" for i in range(4)), "answer 5")
    reward.score_group(RECORD, group)  # the sync recipes: on the function's own loop
    assert [t.reward for t in group] == [0, 0, 0, 0, 1.0]
    assert sample_metrics(group)["reward/latency_ms"] == 50.0
    # every call was in flight at once: the last to return saw all five started
    assert max(t.reward_extras["peak"] for t in group) == 5

    async def in_a_running_loop() -> list[Trajectory]:  # the fully async rollouter
        regroup = _group(*(f"{i} or 5" for i in range(8)))
        await reward.ascore_group(RECORD, regroup)
        return regroup

    regroup = asyncio.run(in_a_running_loop())
    assert all(t.reward == 1.0 for t in regroup)
    assert max(t.reward_extras["peak"] for t in regroup) == 8, "the 8 calls did not overlap"


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        (
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            "    if extra_info['index'] == 7:\n"
            "        raise KeyError('no reference for this row')\n"
            "    return 1.0\n",
            r"reward function reward.custom_fn='.*my_reward.py:compute_score' raised KeyError: "
            r"'no reference for this row' on prompt train:my_task.jsonl:7 \(response 0\)",
        ),
        (
            "def compute_score(**kw):\n    return float('nan')\n",
            r"reward function reward.custom_fn='.*my_reward.py:compute_score' returned a "
            r"non-finite score nan on prompt train:my_task.jsonl:7 \(response 0\)",
        ),
        (
            "def compute_score(**kw):\n    return None\n",
            r"reward function reward.custom_fn='.*my_reward.py:compute_score' returned NoneType "
            r"None; .* on prompt train:my_task.jsonl:7 \(response 0\)",
        ),
        (
            "async def compute_score(**kw):\n    raise ValueError('bad')\n",
            r"raised ValueError: bad on prompt train:my_task.jsonl:7 \(response 0\)",
        ),
    ],
    ids=["raises-on-one-row", "nan", "none", "async-raises"],
)
def test_a_failing_reward_function_names_itself_its_file_and_the_row(tmp_path, body, pattern):
    reward = _reward(tmp_path, body)
    with pytest.raises(RewardError) as info:
        reward.score_group(RECORD, _group("5"))
    message = str(info.value)
    assert "\n" not in message and re.search(pattern, message), message
    with pytest.raises(RewardError, match=re.escape("on prompt train:my_task.jsonl:7")):
        asyncio.run(reward.ascore_group(RECORD, _group("5")))


def test_a_plain_function_that_returns_a_coroutine_is_awaited(tmp_path):
    body = (
        "async def inner(solution_str, ground_truth):\n"
        "    return float(ground_truth in solution_str)\n"
        "\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return inner(solution_str, ground_truth)\n"
    )
    reward = _reward(tmp_path, body)
    group = _group("5", "6")
    reward.score_group(RECORD, group)
    assert [t.reward for t in group] == [1.0, 0.0]
    asyncio.run(reward.ascore_group(RECORD, regroup := _group("6", "5")))
    assert [t.reward for t in regroup] == [0.0, 1.0]


LOOP_BOUND = """
import asyncio

class Client:  # what a reward service's client keeps: a lock and a queue of its loop
    def __init__(self):
        self.lock, self.replies = asyncio.Lock(), asyncio.Queue()

    async def ask(self, text):
        async with self.lock:  # held across an await, as a connection pool would
            await self.replies.put(text)
            await asyncio.sleep(0.01)
            return await self.replies.get()

client = None
loops = set()

async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global client
    client = client or Client()  # created on the first call's loop, kept for the run
    loops.add(id(asyncio.get_running_loop()))
    return float(ground_truth in await client.ask(solution_str))
"""


def test_an_async_function_keeps_one_loop_for_every_caller(tmp_path):
    """Training and validation call from different threads and loops (a plain thread in the
    batch recipes, the rollouter's loop in fully_async): a client bound to the loop of the
    first call must keep working, so every call runs on the function's own loop."""
    import threading

    reward = _reward(tmp_path, LOOP_BOUND)
    first = _group("5", "6")
    reward.score_group(RECORD, first)  # from this plain thread
    on_a_loop = _group("a 5", "x")
    asyncio.run(reward.ascore_group(RECORD, on_a_loop))  # from another event loop
    in_a_thread = _group("5 5")
    worker = threading.Thread(target=reward.score_group, args=(RECORD, in_a_thread))
    worker.start()
    worker.join(10)
    assert [t.reward for t in first + on_a_loop + in_a_thread] == [1.0, 0.0, 1.0, 0.0, 1.0]
    module = reward._custom_fn.__globals__
    assert len(module["loops"]) == 1


def test_an_extra_key_that_cannot_name_a_metric_is_dropped_with_one_warning(tmp_path, caplog):
    reward = _reward(
        tmp_path,
        "def compute_score(**kw):\n    return {'score': 1.0, 'format ok': 1.0, 'a/b': 2.0}\n",
    )
    group = _group("5", "5")
    with caplog.at_level("WARNING", logger="recipe.reward"):
        reward.score_group(RECORD, group)
    assert all(t.reward_extras == {} for t in group)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "'format ok' (a name with a space or a slash)" in warned[0]
