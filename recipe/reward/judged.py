"""How ``RewardFunction`` uses ``reward.judge`` (recipe/reward/judge/).

    reward.judge set, no custom_fn     the judge scores every data source (pointwise or
                                       pairwise, its score in [0, 1] is the reward)
    custom_fn(..., judge)              the user's function gets ``judge``: ``await
                                       judge(response)`` is the judge's pointwise score of that
                                       response in [0, 1], so a rule and the judge combine
    custom_fn(...) without ``judge``   the judge is not called

Pairwise judging needs two responses: a lone one (validation's single greedy answer per
prompt) is scored pointwise with the built-in rubric (``judge_group``).

The judge's calls go to an external OpenAI-compatible endpoint (``reward.judge.base_url``) or
to the run's own judge engines (``reward.judge.model``, the named actor of
recipe/workers/judge_server.py), from whichever process scores.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward.config import RewardConfig
from recipe.reward.judge import Judge, JudgeConfig
from recipe.reward.judge.backend import EndpointBackend, JudgeBackend
from recipe.reward.judge.remote import ActorBackend

JudgeOfResponse = Callable[[str], Awaitable[float]]
"""What a custom reward function's ``judge`` argument is: response text -> pointwise score."""


def make_judge(cfg: JudgeConfig) -> Judge | None:
    """The run's judge, or None without ``reward.judge.model`` / ``base_url``."""
    if not cfg.enabled:
        return None
    backend: JudgeBackend = EndpointBackend(cfg) if cfg.base_url else ActorBackend()
    return Judge(cfg, backend)


def check_judge_use(cfg: RewardConfig, custom_fn: Any) -> bool:
    """Whether ``custom_fn`` takes the judge (a parameter named ``judge``); ``ValueError`` when
    it does and no judge is configured, or when pairwise judging is asked of a function
    (pairwise scores a whole group, not one response)."""
    if custom_fn is None or "judge" not in _parameters(custom_fn):
        return False
    if not cfg.judge.enabled:
        raise ValueError(
            f"reward.custom_fn={cfg.custom_fn!r} takes a `judge` argument but reward.judge has "
            "no model or base_url: set one of them"
        )
    if cfg.judge.mode != "pointwise":
        raise ValueError(
            f"reward.custom_fn={cfg.custom_fn!r} takes a `judge` argument, which scores one "
            f"response: it needs reward.judge.mode=pointwise (got {cfg.judge.mode!r})"
        )
    return True


def _parameters(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C function without a signature
        return set()


async def judge_group(judge: Judge, record: PromptRecord, trajs: list[Trajectory]) -> list[float]:
    """The judge's scores of ``trajs``, responses to ``record``. A pairwise judge scores a
    lone response (a validation's one greedy answer, or the one response of a group that an
    environment did not score itself) pointwise, with the built-in rubric: there is no
    other response to compare it with."""
    if judge.cfg.mode == "pairwise" and len(trajs) == 1:
        [traj] = trajs
        uid = f"{record.uid} (response {traj.sample_index})"
        return [
            await judge.score_one(record.prompt, traj.response_text, record.ground_truth, uid=uid)
        ]
    return await judge.score_group(record, trajs) if trajs else []


def judge_of(judge: Judge, record: PromptRecord, traj: Trajectory) -> JudgeOfResponse:
    """The ``judge`` argument of a custom function scoring ``traj``: the judge's pointwise
    score of a response text (usually ``solution_str``) to ``record``'s prompt."""
    return functools.partial(
        _score_one,
        judge,
        record.prompt,
        ground_truth=record.ground_truth,
        uid=f"{record.uid} (response {traj.sample_index})",
    )


async def _score_one(
    judge: Judge, prompt: Any, response: str, *, ground_truth: str, uid: str
) -> float:
    return await judge.score_one(prompt, response, ground_truth, uid=uid)
