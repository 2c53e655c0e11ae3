"""``ChatEpisode``: one episode's OpenAI API requests, each turned into one model turn.

    POST /v1/chat/completions {model, messages, tools?, max_tokens?}
      chat_request(body)                    every field checked (bodies.py): 400 naming it
      ChatSession.context(messages, tools)  new messages as chat-template deltas after the
                                            sampled tokens (or a new segment, counted)
      sample_turn(...)                      one turn; a weight sync that cuts it is
                                            continued on the new weights: one completion
      tool parser (when tools were passed)  content + tool_calls; malformed: text, counted
      ChatSession.record(...)               the request's tokens and the turn, committed
      -> chat.completion {choices[0].message, finish_reason, usage}
    POST /v1/completions {model, prompt}    the same on text (or token ids)

Whose failure it is (``serve``): only an exception out of the engine's generate (the
``sample_turn`` call) is the engine's: it comes out as ``EngineFailure`` and the run's
replica supervisor gets it. Everything else a request can make fail (its fields, the chat
template rendering its messages, the tokenizer, the tool parser) is the request's: it is
answered 4xx (``RequestError``), counted (``agent/request_errors``), and the session is left
as it was (a request is committed only with its model turn), so the agent may go on.

The run samples, not the agent: ``temperature``, ``top_p``, ``seed`` and the other sampling
fields a request carries are ignored in favour of the run's settings (what the trainer's
log-probs assume); ``max_tokens`` / ``max_completion_tokens`` only lower the turn's budget.
Budgets: ``rollout.response_length`` bounds each segment's tokens after its prompt (the
length the trainer pads to), ``data.max_prompt_length`` a new segment's prompt,
``max_assistant_turns`` the episode's turns and ``max_turn_tokens`` one turn; a request
past a budget is refused as the API refuses a context that is too long (400
``context_length_exceeded``), and so is every later request: the episode ends as
``length``. One episode's requests run one at a time, in arrival order (the session is one
conversation; concurrent sub-agent calls wait their turn), at most
``MAX_REQUESTS_PER_EPISODE`` at once (429 beyond, counted). When the episode ends, requests
still in flight are cancelled (their engine requests aborted) and record nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from recipe.agent.chat_session import ChatSession, ContextTooLong, Continuation, Message
from recipe.agent.context import EpisodeCut, SliceSink, TurnEngine, sample_turn
from recipe.agent.endpoint.bodies import (
    BUDGET_CODE,
    RequestError,
    chat_request,
    completion_request,
)
from recipe.agent.endpoint.responses import SampledTurn, completion
from recipe.agent.episode import EpisodeTokens
from recipe.agent.tool_calls import ParsedTurn, TurnParser
from recipe.observability.trace import now_us
from recipe.utils.ray_errors import error_line

logger = logging.getLogger(__name__)

MAX_REQUESTS_PER_EPISODE = 16
"""Requests of one episode in the endpoint at once (one is served, the rest wait their
turn); more are refused (429, ``agent/requests_throttled``)."""


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    """The budgets of one endpoint episode (module docstring)."""

    response_length: int
    """Tokens after a segment's prompt (model turns and deltas)."""
    max_turns: int
    """Model turns of the whole episode."""
    max_turn_tokens: int | None = None
    """Tokens of one turn (None: what is left of ``response_length``)."""
    max_context: int | None = None
    """Prompt and response tokens the engine takes in one request (None: unbounded)."""
    max_prompt: int | None = None
    """Tokens of a new segment's prompt: the run's ``data.max_prompt_length`` (None:
    bounded by ``max_context`` only)."""


class EngineFailure(Exception):
    """The engine's generate failed inside a request: the run's failure (``error``, what
    the engine raised, goes to the replica supervisor), not the agent's."""

    def __init__(self, error: Exception):
        super().__init__(error_line(error))
        self.error = error


class ChatEpisode:
    """The requests of one episode (module docstring); counts what the metrics report."""

    def __init__(
        self,
        engine: TurnEngine,
        session: ChatSession,
        parser: TurnParser,
        limits: EpisodeLimits,
        *,
        vocab_size: int,
        seed: int | None = None,
        on_slice: SliceSink | None = None,
        tools_rendered: bool = True,
    ):
        self.session, self._engine, self._parser, self.limits = session, engine, parser, limits
        self._vocab_size, self._seed, self._on_slice = vocab_size, seed, on_slice
        self.renders_tools = tools_rendered
        """The chat template shows ``tools`` (``renders_tools``); else requests with tools
        are refused."""
        self._lock = asyncio.Lock()
        self._requests: set[asyncio.Task[dict[str, Any]]] = set()
        self._call_ids = (f"call_{uuid.uuid4().hex[:8]}_{i}" for i in itertools.count())
        self.num_requests = self.num_turns = self.num_tool_calls = 0
        self.num_tool_parse_errors = self.num_sync_cuts = 0
        self.num_request_errors = self.num_requests_throttled = 0
        self.model_s = 0.0
        self.refusal: str | None = None
        """Why a request was refused for a budget: the episode ends as ``length`` and every
        later request is refused the same way."""
        self.closed = False
        self.last_text = ""
        """The last model turn's content as the client saw it (what a reward scores)."""

    @property
    def budget_spent(self) -> bool:
        return self.refusal is not None

    async def serve(self, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        """The answer to a ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` body.
        Raises ``RequestError`` (the agent's), ``EngineFailure`` or ``EpisodeCut`` (the
        run's): the module docstring's rule."""
        if self.closed:
            raise RequestError(503, "this episode has ended")
        if len(self._requests) >= MAX_REQUESTS_PER_EPISODE:
            self.num_requests_throttled += 1
            raise RequestError(
                429,
                f"this episode has {MAX_REQUESTS_PER_EPISODE} requests in flight already "
                "(they are served one at a time): wait for their answers",
                "rate_limit_exceeded",
            )
        task = asyncio.ensure_future(self._answer(body, chat))
        self._requests.add(task)
        try:
            # No deadline of its own: the episode's (agent_timeout_s) ends it through close().
            await asyncio.wait({task})
        finally:
            self._requests.discard(task)
            if not task.done():  # the handler was cancelled (its client left): the turn too
                task.cancel()
                task.add_done_callback(_log_unseen_failure)
        if task.cancelled():
            raise RequestError(503, "the episode ended while this request was served")
        return task.result()

    def count_refused(self, error: RequestError) -> None:
        """Count a request the server refused before ``serve`` (a body it could not read)."""
        self.num_request_errors += int(error.is_agents)

    def close(self) -> None:
        """The episode ended: no request is served from now on and those in flight are
        cancelled (their engine requests aborted), so no turn is recorded after the
        episode was built."""
        self.closed = True
        for task in list(self._requests):
            task.cancel()

    async def _answer(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        try:
            return await (self._chat(body) if chat else self._complete(body))
        except RequestError as exc:
            self.count_refused(exc)
            raise
        except (EngineFailure, EpisodeCut):
            raise
        except Exception as exc:  # not the engine's generate: the request's content
            self.num_request_errors += 1
            logger.debug("agent endpoint request refused: %s", error_line(exc), exc_info=True)
            raise RequestError(
                400, f"the request cannot be served ({error_line(exc)}); the episode is unchanged"
            ) from exc

    async def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        request = chat_request(body)
        if request.tools is not None and not self.renders_tools:
            raise RequestError(
                400,
                "the model's chat template does not render 'tools' (the model would never "
                "see them): use a model or chat template with tool support",
            )
        async with self._lock:
            step = self._continue(
                lambda room, most: self.session.context(request.messages, request.tools, room, most)
            )
            turn = await self._sample(step, request.max_tokens, request.tools is not None)
            parsed = ParsedTurn(content=turn.text)
            if request.parse_tools:
                parsed = self._parser.parse(turn.text, self._call_ids, request.tools)
            message = parsed.message()
            self._record(step, turn, message)
            self.num_tool_parse_errors += int(parsed.malformed)
            self.num_tool_calls += len(parsed.tool_calls)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": parsed.finish_reason or turn.end.finish_reason,
            "logprobs": None,
        }
        return completion("chat.completion", request.model, choice, turn)

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        request = completion_request(body, self._vocab_size)
        async with self._lock:
            step = self._continue(
                lambda room, most: self.session.text_context(request.prompt, room, most)
            )
            turn = await self._sample(step, request.max_tokens, False)
            self._record(step, turn, {"role": "assistant", "content": turn.text})
        choice = {
            "index": 0,
            "text": turn.text,
            "finish_reason": turn.end.finish_reason,
            "logprobs": None,
        }
        return completion("text_completion", request.model, choice, turn)

    def _continue(self, context: Callable[[int | None, int | None], Continuation]) -> Continuation:
        """What the request adds, within the budgets (nothing is changed yet)."""
        if self.refusal is not None:
            self._refuse(f"the episode ended on a budget ({self.refusal})")
        if self.num_turns >= self.limits.max_turns:
            self._refuse(f"the episode used its {self.limits.max_turns} model turns")
        held = self.session.segments[-1] if self.session.segments else None
        room = None
        if held is not None:
            room = self._room(held.tokens.num_response_tokens, len(held.context_ids))
        try:
            step = context(room, self.limits.max_prompt)
        except ContextTooLong as exc:
            self._refuse(str(exc))
        if step.new and self._room(0, len(step.context_ids)) <= 0:
            self._refuse("the request's prompt leaves no room for a model turn")
        return step

    def _room(self, num_response_tokens: int, num_context_tokens: int) -> int:
        """Tokens a segment holding these may still take, for deltas and the turn."""
        room = self.limits.response_length - num_response_tokens
        if self.limits.max_context is not None:
            room = min(room, self.limits.max_context - num_context_tokens)
        return room

    def _refuse(self, reason: str) -> NoReturn:
        if self.refusal is None:
            self.refusal = reason
        raise RequestError(400, f"{reason}: the episode ends", BUDGET_CODE)

    async def _sample(
        self, step: Continuation, max_tokens: int | None, keep_markers: bool
    ) -> SampledTurn:
        budget = self._room(step.num_response_tokens, len(step.context_ids))
        if max_tokens is not None:
            budget = min(budget, max_tokens)
        if self.limits.max_turn_tokens is not None:
            budget = min(budget, self.limits.max_turn_tokens)
        if budget <= 0:
            self._refuse("no tokens left for a model turn")
        self.num_requests += 1
        tokens = EpisodeTokens(step.context_ids)
        seed = None if self._seed is None else self._seed + step.num_response_tokens
        start, start_us = time.perf_counter(), now_us()
        try:
            end = await sample_turn(self._engine, tokens, [], budget, seed)
        except EpisodeCut:
            raise
        except Exception as exc:  # the one call whose failure is the engine's
            raise EngineFailure(exc) from exc
        self.model_s += time.perf_counter() - start
        self.num_sync_cuts += end.cuts
        if self._on_slice is not None:
            args = {"turn": self.num_turns + 1, "tokens": tokens.num_response_tokens}
            versions = sorted(set(tokens.versions))
            self._on_slice("turn", start_us, now_us(), args | {"versions": versions})
        return SampledTurn(tokens, end, self._text(tokens.response_ids, keep_markers))

    def _text(self, ids: list[int], keep_markers: bool) -> str:
        """The turn as the client reads it: without the stop token; special tokens kept
        where the tool parser needs them (its call markers may be special tokens)."""
        renderer = self.session.renderer
        if ids and renderer.is_eos(ids[-1]):
            ids = ids[:-1]
        skip = not keep_markers or self._parser.skip_special_tokens
        return renderer.tokenizer.decode(ids, skip_special_tokens=skip)

    def _record(self, step: Continuation, turn: SampledTurn, message: Message) -> None:
        if self.closed:  # cancelled, but its turn came back first: the episode is built
            raise RequestError(503, "the episode ended while this request was served")
        sampled = turn.tokens
        self.session.record(step, sampled.response_ids, sampled.logprobs, sampled.versions, message)
        self.num_turns += 1
        self.last_text = message.get("content") or ""


def _log_unseen_failure(task: asyncio.Task[dict[str, Any]]) -> None:
    """A request that failed after its handler was gone: logged, not lost."""
    exc = None if task.cancelled() else task.exception()
    if exc is not None and not isinstance(exc, RequestError):
        logger.warning("agent endpoint request failed after its client left: %r", exc)


_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe_tool_7f3a", "description": "", "parameters": {}},
}


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the model a request's ``tools``."""
    messages = [{"role": "user", "content": "hi"}]
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=[_PROBE_TOOL], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # no template, or one that rejects tools
        return False
    return "probe_tool_7f3a" in text
