"""The reward component: score one decoded response against its ground truth.

    PromptRecord.data_source --> registry (built-in scorers) --+
                                 or reward.custom_fn ----------+--> fn(...) --> RewardResult

Scoring functions keep verl's calling convention (keyword arguments ``data_source``,
``solution_str``, ``ground_truth``, ``extra_info``) and may return a number, a bool or a dict
with a ``"score"`` key (extra numeric keys become ``extras``, e.g. ``acc``), so reward
functions written for verl work unchanged. ``RewardFunction`` turns whatever they return into
a typed ``RewardResult`` and fails loudly on anything else.

A reward function may also be an ``async def`` (a call to a reward service, a sandbox): a
group's responses are then scored concurrently, always on one event loop of the function's
own (a thread started on first use), whoever calls: ``score_group`` from a plain thread,
``ascore_group`` from another event loop (the fully async rollouter's), training and
validation alike. A client the function keeps across calls (an HTTP session, an
``asyncio.Lock``) is bound to that loop and stays valid for the whole run.

Whatever a function raises, or a return value that is no score (None, NaN, a string), stops
the run with a ``RewardError`` naming the function and the prompt's uid (``split:file:row``):
a reward that cannot be computed is never a silent 0.

``RewardFunction.check_data_sources`` is meant for startup: a dataset source without a scorer
fails before any generation, not at the first batch.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from recipe.protocol import PromptRecord, Trajectory
from recipe.reward.config import RewardConfig
from recipe.reward.custom import load_custom_fn
from recipe.reward.judge import JudgeError
from recipe.reward.judged import check_judge_use, judge_group, judge_of, make_judge
from recipe.reward.registry import Scorer, get_scorer, known_data_sources, register_scorer
from recipe.reward.results import RewardResult, to_reward_result

__all__ = [
    "RewardConfig",
    "RewardError",
    "RewardFunction",
    "RewardResult",
    "get_scorer",
    "known_data_sources",
    "register_scorer",
]

logger = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """A reward function raised, or returned something that is not a score, for a prompt;
    the message names the function (and its file) and the prompt's uid."""


class RewardFunction:
    """Scores responses with the registry's scorers, or with ``reward.custom_fn`` for all.

    Pickles as its config, so a Ray actor that receives it reloads ``custom_fn`` itself
    (a function loaded from a file is not importable by name on another process).
    """

    def __init__(self, cfg: RewardConfig, response_length: int | None = None) -> None:
        """``response_length``: ``rollout.response_length``, which the overlong buffer ends
        at (required with ``reward.overlong_buffer.enable``)."""
        self.cfg = cfg
        self.response_length = response_length
        overlong = cfg.overlong_buffer
        if overlong.enable and (response_length is None or overlong.len > response_length):
            raise ValueError(
                f"reward.overlong_buffer.len={overlong.len} is invalid: allowed up to "
                f"rollout.response_length={response_length}"
            )
        self._custom_fn: Scorer | None = load_custom_fn(cfg.custom_fn) if cfg.custom_fn else None
        self._judge = make_judge(cfg.judge)
        self._passes_judge = check_judge_use(cfg, self._custom_fn)
        self._loop: asyncio.AbstractEventLoop | None = None  # where async fns run
        self._loop_lock = threading.Lock()

    def __reduce__(self) -> tuple[type[RewardFunction], tuple[RewardConfig, int | None]]:
        return (RewardFunction, (self.cfg, self.response_length))

    def check_data_sources(self, sources: set[str]) -> None:
        """Raise ``ValueError`` naming every source in ``sources`` that has no scorer."""
        if self._custom_fn is not None or self._judge is not None:
            return
        known = set(known_data_sources())
        missing = sorted(s for s in sources if s not in known)
        if missing:
            raise ValueError(
                f"no reward scorer for data_source {', '.join(repr(s) for s in missing)}; known "
                f"data sources: {', '.join(known_data_sources())}. Set reward.custom_fn="
                "'path/to/file.py:function' (or 'package.module:function') to score them"
            )

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> RewardResult:
        fn = self._scorer(data_source)
        raw = fn(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
        )
        return to_reward_result(raw, fn_name=self._fn_name(fn))

    def score_groups(self, records: list[PromptRecord], groups: list[list[Trajectory]]) -> None:
        """``score_group`` of every (record, group) pair; an async function or the judge
        scores all groups at once (vLLM batches a judge's calls across groups)."""
        if not self._is_async():
            for record, trajs in zip(records, groups, strict=True):
                self.score_group(record, trajs)
            return

        async def every_group() -> None:
            pairs = zip(records, groups, strict=True)
            await asyncio.gather(*(self._score_concurrently(r, t) for r, t in pairs))

        self._on_own_loop(every_group()).result()

    def drain_metrics(self) -> dict[str, float]:
        """The judge's ``judge/*`` metrics since the previous call (empty without a judge)."""
        return self._judge.drain_metrics() if self._judge is not None else {}

    def score_group(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """Fill ``reward`` and ``reward_extras`` of each response to ``record`` (in place);
        ``RewardError`` naming the function and the prompt if one cannot be scored. Not for
        a thread that runs an event loop: there, await ``ascore_group``."""
        if self._is_async():
            self._on_own_loop(self._score_concurrently(record, trajs)).result()
            return
        for traj in filter(scored_here, trajs):
            raw = self._call(record, traj)
            if inspect.isawaitable(raw):  # a plain function that returned a coroutine
                raw = self._on_own_loop(self._awaited(record, traj, raw)).result()
            _fill(traj, self._checked(record, traj, raw))
        self._shape(trajs)

    async def ascore_group(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """``score_group`` from a coroutine: an async function scores the responses
        concurrently on its own loop (this one waits for it); a plain one runs in line
        (rule-based scorers take microseconds)."""
        if self._is_async():
            await asyncio.wrap_future(self._on_own_loop(self._score_concurrently(record, trajs)))
            return
        for traj in filter(scored_here, trajs):
            raw = self._call(record, traj)
            if inspect.isawaitable(raw):
                future = self._on_own_loop(self._awaited(record, traj, raw))
                raw = await asyncio.wrap_future(future)
            _fill(traj, self._checked(record, traj, raw))
        self._shape(trajs)

    async def _score_concurrently(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """Every response of the group at once (on the function's own loop)."""
        if self._judge is not None and self._custom_fn is None:
            await self._judged(record, trajs)
            return

        async def one(traj: Trajectory) -> RewardResult:
            raw = self._call(record, traj)
            if inspect.isawaitable(raw):
                raw = await self._awaited(record, traj, raw)
            return self._checked(record, traj, raw)

        scored = [t for t in trajs if scored_here(t)]
        for traj, result in zip(scored, await asyncio.gather(*map(one, scored)), strict=True):
            _fill(traj, result)
        self._shape(trajs)

    async def _judged(self, record: PromptRecord, trajs: list[Trajectory]) -> None:
        """The judge's scores of the group (``reward.judge`` without ``custom_fn``)."""
        assert self._judge is not None
        scored = [t for t in trajs if scored_here(t)]
        try:
            scores = await judge_group(self._judge, record, scored)
        except JudgeError as err:
            raise RewardError(f"reward.judge: {err}") from err
        for traj, score in zip(scored, scores, strict=True):
            _fill(traj, RewardResult(score=score))
        self._shape(trajs)

    def _is_async(self) -> bool:
        if self._judge is not None:
            return True
        return self._custom_fn is not None and inspect.iscoroutinefunction(self._custom_fn)

    def _on_own_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the function's own loop; its ``concurrent.futures.Future``."""
        return asyncio.run_coroutine_threadsafe(coro, self._own_loop())

    def _shape(self, trajs: list[Trajectory]) -> None:
        """Reward shaping after scoring (every response of the group, environment rewards
        included): DAPO's soft overlong punishment."""
        overlong = self.cfg.overlong_buffer
        if not overlong.enable:
            return
        assert self.response_length is not None
        for traj in trajs:
            penalty = overlong.penalty(traj.num_response_tokens, self.response_length)
            traj.reward += penalty
            traj.reward_extras = {**traj.reward_extras, "overlong_penalty": penalty}

    def _call(self, record: PromptRecord, traj: Trajectory) -> Any:
        fn = self._scorer(record.data_source)
        extra: dict[str, Any] = {}
        if self._passes_judge:
            assert self._judge is not None
            extra["judge"] = judge_of(self._judge, record, traj)
        try:
            return fn(
                data_source=record.data_source,
                solution_str=traj.response_text,
                ground_truth=record.ground_truth,
                extra_info=record.extra_info,
                **extra,
            )
        except Exception as err:
            raise self._error(record, traj, err) from err

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        """The one loop async reward functions run on, in a daemon thread of its own."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="reward-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    async def _awaited(self, record: PromptRecord, traj: Trajectory, raw: Any) -> Any:
        try:
            return await raw
        except Exception as err:
            raise self._error(record, traj, err) from err

    def _checked(self, record: PromptRecord, traj: Trajectory, raw: Any) -> RewardResult:
        fn = self._scorer(record.data_source)
        try:
            return to_reward_result(raw, fn_name=self._fn_name(fn))
        except (TypeError, ValueError) as err:
            raise RewardError(
                f"{err} on prompt {record.uid} (response {traj.sample_index})"
            ) from err

    def _error(self, record: PromptRecord, traj: Trajectory, err: Exception) -> RewardError:
        fn = self._scorer(record.data_source)
        return RewardError(
            f"reward function {self._fn_name(fn)} raised {type(err).__name__}: "
            f"{_first_line(err)} on prompt {record.uid} (response {traj.sample_index})"
        )

    def _scorer(self, data_source: str) -> Scorer:
        """``reward.custom_fn`` for every source, else the registry's scorer of this one."""
        return self._custom_fn if self._custom_fn is not None else get_scorer(data_source)

    def _fn_name(self, fn: Scorer) -> str:
        if self._custom_fn is not None:
            return f"reward.custom_fn={self.cfg.custom_fn!r}"
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def scored_here(traj: Trajectory) -> bool:
    """Whether the reward function scores ``traj``: not a multi-turn episode whose
    environment gave its reward, nor one that ended in an environment error (reward 0)."""
    return not traj.episode.get("env_reward") and traj.finish_reason != "env_error"


def _fill(traj: Trajectory, result: RewardResult) -> None:
    traj.reward = result.score
    traj.reward_extras = result.extras


def _first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0][:300] if lines else "(no message)"
