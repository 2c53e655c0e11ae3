"""``AgentContext``: what an agent loop holds while it builds one episode.

    ctx.start(observation)          prompt ids (rendered once)
    await ctx.generate()  -------->  TurnEngine.generate_turn(context ids, budget, seed)
        "aborted" (a weight sync)    wait until the engine runs again, continue the same turn
                                     from context + its tokens so far (newer version stamped)
    ctx.append_observation(obs)     delta ids, mask 0, content cut to max_tool_response_length
    await ctx.call_env(awaitable)   timed (step_timeout_s); the engine keeps serving others
    ctx.finish(reason) / ctx.episode()

A checkpoint may end an episode while it waits for a paused engine (the only place one is
cut); ``state_dict`` / ``load_state_dict`` carry it, with the cut trajectory's tokens, to a
fresh context that continues that same turn.

Invariant: a model turn is never split into two turns by a sync (the agent sees one action
text), and an environment call is never cut by one (a sync only pauses engine requests).
Budgets: ``response_length`` bounds all tokens after the prompt, ``max_assistant_turns`` the
model turns, ``max_user_turns`` the observations; ``generate`` returns None once a budget is
spent, and the episode finishes as ``length``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from recipe.agent.config import MultiTurnConfig
from recipe.agent.episode import Episode, EpisodeTokens, Observation
from recipe.agent.render import ObservationRenderer
from recipe.observability.trace import now_us
from recipe.utils.metric_names import is_metric_part

logger = logging.getLogger(__name__)
T = TypeVar("T")
SliceSink = Callable[[str, float, float, dict[str, Any]], None]
"""``(name, start_us, end_us, args)`` of one trace slice."""


@dataclass(slots=True)
class TurnOutput:
    """One engine request's result."""

    ids: list[int]
    """Sampled token ids."""
    logprobs: list[float]
    """Rollout log-prob of each (same length)."""
    versions: list[int]
    """Policy version of each (same length)."""
    finish_reason: str
    """``stop`` (EOS), ``length`` (its budget) or ``aborted`` (cut by a pause)."""
    num_cached_tokens: int = 0
    """Context tokens the engine's prefix cache served (0 when it cannot tell)."""


@dataclass(slots=True, frozen=True)
class TurnEnd:
    """How one model turn ended (``sample_turn``)."""

    finish_reason: str
    """``stop`` (EOS) or ``length`` (its budget); never ``aborted``."""
    cuts: int
    """Times a weight sync cut the turn (each continued on the newer weights)."""
    num_cached_tokens: int
    """Context tokens the prefix cache served on the turn's first request."""


class TurnEngine(Protocol):
    """The engine side an ``AgentContext`` needs (the rollout worker implements it)."""

    async def generate_turn(
        self, context_ids: list[int], max_tokens: int, seed: int | None
    ) -> TurnOutput: ...

    async def wait_until_running(self) -> None: ...


class EpisodeCut(Exception):
    """Raised by ``TurnEngine.wait_until_running`` when the worker stops for good while an
    episode waits for it: the episode ends as ``aborted`` (kept in the ledger, not lost)."""


class EnvTimeoutError(TimeoutError):
    """An environment call ran past ``rollout.multi_turn.step_timeout_s``."""


class EnvRewardError(ValueError):
    """A step reward that is not a finite number (NaN, inf, a string): the environment's
    fault, so its episode ends as ``env_error`` instead of making its group's advantages NaN."""


class AgentContext:
    """One episode in the making (see the module docstring)."""

    def __init__(
        self,
        engine: TurnEngine,
        renderer: ObservationRenderer,
        config: MultiTurnConfig,
        *,
        response_length: int,
        seed: int | None = None,
        on_slice: SliceSink | None = None,
    ):
        """``on_slice(name, start_us, end_us, args)``: receives one trace slice per model
        turn (``turn``) and environment call (``env``), when given."""
        self._engine, self._renderer, self._config = engine, renderer, config
        self._response_length, self._seed = response_length, seed
        self._on_slice = on_slice
        self.tokens: EpisodeTokens | None = None
        self._texts: list[str] = []
        self._last_turn: list[int] = []
        self._turn: list[int] | None = None  # the model turn being generated, ids so far
        self._turn_budget = self._turn_cuts = 0
        self._rewards: list[float] = []
        self._info: dict[str, list[float]] = {}
        self._finish: tuple[str, str | None] | None = None
        self.num_turns = self.num_observations = self.num_tool_calls = 0
        self.num_tool_errors = self.num_truncated_observations = 0
        self.timed_out = False
        """An environment call ran past ``step_timeout_s`` (the episode ended there)."""
        self.env_s: list[float] = []

    # ---- building the sequence ---------------------------------------------------------

    def start(self, observation: Observation) -> None:
        """Render the first observation as the prompt (once per episode)."""
        if self.tokens is not None:
            raise RuntimeError("AgentContext.start() called twice in one episode")
        self.tokens = EpisodeTokens(self._renderer.prompt_ids(observation))

    @property
    def remaining_tokens(self) -> int:
        return self._response_length - self._require_tokens().num_response_tokens

    async def generate(self) -> str | None:
        """The next model turn's text; None when a budget is spent (see module docstring)."""
        tokens = self._require_tokens()
        if self._turn is None:  # a new turn (else: one cut for a checkpoint continues)
            if self.num_turns >= self._config.max_assistant_turns or self.remaining_tokens <= 0:
                return None
            budget = self.remaining_tokens
            if self._config.max_turn_tokens is not None:
                budget = min(budget, self._config.max_turn_tokens)
            self._turn, self._turn_budget, self._turn_cuts = [], budget, 0
        turn, budget = self._turn, self._turn_budget
        start_us = now_us()
        end = await sample_turn(self._engine, tokens, turn, budget, self._seed)
        self._turn_cuts += end.cuts
        self._turn = None
        self.num_turns += 1
        self._last_turn = turn
        if self._on_slice is not None:
            versions = sorted(set(tokens.versions[len(tokens.versions) - len(turn) :]))
            args = {"turn": self.num_turns, "tokens": len(turn), "versions": versions}
            self._on_slice("turn", start_us, now_us(), args | {"cuts": self._turn_cuts})
        text = self._renderer.tokenizer.decode(turn, skip_special_tokens=True)
        self._texts.append(text)
        return text

    def append_observation(self, observation: Observation) -> bool:
        """Append an observation after the last model turn; False (nothing appended) when
        no model turn could follow it (``max_user_turns``, ``max_assistant_turns`` or the
        token budget used up)."""
        tokens = self._require_tokens()
        if (
            self.num_observations >= self._config.max_user_turns
            or self.num_turns >= self._config.max_assistant_turns
        ):
            return False
        observation = self._cut(observation)
        ids = self._renderer.observation_ids(observation, self._last_turn)
        if len(ids) >= self.remaining_tokens:  # no room left for a model turn after it
            return False
        tokens.add_env(ids)
        self.num_observations += 1
        return True

    def _cut(self, observation: Observation) -> Observation:
        limit = self._config.max_tool_response_length
        renderer = self._renderer

        def cut(text: str) -> str:
            ids = renderer.encode(text)
            if len(ids) <= limit:
                return text
            self.num_truncated_observations += 1
            return renderer.tokenizer.decode(ids[:limit], skip_special_tokens=False)

        if isinstance(observation, str):
            return cut(observation)
        return [{**m, "content": cut(m["content"])} for m in observation]

    # ---- environment calls, rewards, the end -------------------------------------------

    async def call_env(self, call: Awaitable[T]) -> T:
        """Await an environment call under ``step_timeout_s``, timing it."""
        start, start_us, outcome = time.perf_counter(), now_us(), "ok"
        try:
            return await asyncio.wait_for(call, self._config.step_timeout_s)
        except TimeoutError as exc:
            outcome = "timeout"
            raise EnvTimeoutError(
                f"no answer within rollout.multi_turn.step_timeout_s="
                f"{self._config.step_timeout_s:g} s"
            ) from exc
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self.env_s.append(time.perf_counter() - start)
            if self._on_slice is not None:
                args = {"call": len(self.env_s), "outcome": outcome}
                self._on_slice("env", start_us, now_us(), args)

    def add_reward(self, reward: float) -> None:
        """Add one step's reward (the episode's is their sum); ``EnvRewardError`` naming the
        value when it is not a finite number."""
        self._rewards.append(finite_reward(reward))

    def add_info(self, info: dict[str, Any]) -> None:
        """The step's numeric ``info`` values, logged as ``agent/info/<key>``; a key that
        cannot be part of a metric key is dropped here, with one warning per key."""
        for key, value in info.items():
            if not is_metric_part(str(key)):
                _warn_dropped_info(str(key))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self._info.setdefault(key, []).append(float(value))

    def finish(self, reason: str, error: str | None = None) -> None:
        """End the episode (the first call counts)."""
        if self._finish is None:
            self._finish = (reason, error)

    def episode(self) -> Episode:
        """The episode built so far; ``length`` unless ``finish`` said otherwise."""
        reason, error = self._finish or ("length", None)
        tokens = self.tokens if self.tokens is not None else EpisodeTokens([])
        reward = 0.0 if reason == "env_error" else (sum(self._rewards) if self._rewards else None)
        return Episode(
            tokens=tokens,
            finish_reason=reason,
            reward=reward,
            num_turns=self.num_turns,
            num_tool_calls=self.num_tool_calls,
            num_tool_errors=self.num_tool_errors,
            num_truncated_observations=self.num_truncated_observations,
            env_s=list(self.env_s),
            error=error,
            timed_out=self.timed_out,
            info={k: sum(v) / len(v) for k, v in self._info.items()},
            response_text="\n".join(self._texts),
        )

    # ---- checkpoints (an episode cut while it waited for a paused engine) ---------------

    def state_dict(self) -> dict[str, Any]:
        """Everything but the token sequence (the cut trajectory carries that) needed to
        continue this episode where it waited: inside a model turn, ``turn`` its ids so far.
        JSON values."""
        return {
            "turn": None if self._turn is None else list(self._turn),
            "turn_budget": self._turn_budget,
            "turn_cuts": self._turn_cuts,
            "texts": list(self._texts),
            "last_turn": list(self._last_turn),
            "rewards": list(self._rewards),
            "info": {k: list(v) for k, v in self._info.items()},
            "counts": [
                self.num_turns,
                self.num_observations,
                self.num_tool_calls,
                self.num_tool_errors,
                self.num_truncated_observations,
            ],
            "env_s": list(self.env_s),
            "seed": self._seed,
        }

    def load_state_dict(self, tokens: EpisodeTokens, state: dict[str, Any]) -> None:
        """Continue a cut episode: ``tokens`` as the cut trajectory had them, ``state`` from
        ``state_dict``; the next ``generate`` continues the turn that was cut."""
        if self.tokens is not None:
            raise RuntimeError("AgentContext.load_state_dict() on an episode already started")
        self.tokens = tokens
        self._turn = None if state["turn"] is None else list(state["turn"])
        self._turn_budget, self._turn_cuts = state["turn_budget"], state["turn_cuts"]
        self._texts, self._last_turn = list(state["texts"]), list(state["last_turn"])
        self._rewards = [float(r) for r in state["rewards"]]
        self._info = {k: [float(x) for x in v] for k, v in state["info"].items()}
        (
            self.num_turns,
            self.num_observations,
            self.num_tool_calls,
            self.num_tool_errors,
            self.num_truncated_observations,
        ) = state["counts"]
        self.env_s = [float(x) for x in state["env_s"]]
        self._seed = state["seed"]

    def _require_tokens(self) -> EpisodeTokens:
        if self.tokens is None:
            raise RuntimeError("AgentContext.start(observation) must come first")
        return self.tokens


def finite_reward(reward: Any) -> float:
    """``reward`` as a float; ``EnvRewardError`` naming it when it is not a number (a string,
    a list, ...) or not finite (NaN, inf)."""
    try:
        if isinstance(reward, (str, bytes)):  # not a number, though float() parses "0.5"
            raise TypeError
        value = float(reward)
    except (TypeError, ValueError):
        raise EnvRewardError(
            f"reward {reward!r} ({type(reward).__name__}) is not a number"
        ) from None
    if not math.isfinite(value):
        raise EnvRewardError(f"reward {reward!r} is not a finite number")
    return value


async def sample_turn(
    engine: TurnEngine, tokens: EpisodeTokens, turn: list[int], budget: int, seed: int | None
) -> TurnEnd:
    """Sample one model turn onto ``tokens`` until EOS or ``budget`` tokens in ``turn`` (the
    turn's ids so far, extended in place). A request a weight sync aborts is continued from
    the context and the tokens it had once the engine runs again, so the turn is one piece
    whose later tokens carry the newer version. ``seed``: the episode's seed, offset by the
    tokens already in the sequence (None: unseeded). ``EpisodeCut`` from the wait propagates
    with ``turn`` holding what was sampled."""
    cuts, cached = 0, None
    while True:
        request_seed = None if seed is None else seed + tokens.num_response_tokens
        out = await engine.generate_turn(tokens.context_ids, budget - len(turn), request_seed)
        cached = out.num_cached_tokens if cached is None else cached
        tokens.add_model(out.ids, out.logprobs, out.versions)
        turn += out.ids
        if out.finish_reason != "aborted":
            return TurnEnd(out.finish_reason, cuts, cached)
        if len(turn) >= budget:
            return TurnEnd("length", cuts, cached)
        cuts += 1
        await engine.wait_until_running()  # the sync loads; then continue the turn


@functools.cache
def _warn_dropped_info(key: str) -> None:
    logger.warning(
        "an environment's StepResult.info has the key %r (a space or a slash): not an "
        "agent/info/<key> metric, not logged",
        key,
    )
