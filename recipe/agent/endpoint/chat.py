"""``ChatEpisode``: one episode's OpenAI API requests, each turned into one model turn.

    POST /v1/chat/completions {model, messages, tools?, max_tokens?}
      ChatSession.context(messages, tools)  new messages as chat-template deltas after the
                                            sampled tokens (or a new segment, counted)
      sample_turn(...)                      one turn; a weight sync that cuts it is
                                            continued on the new weights: one completion
      tool parser (when tools were passed)  content + tool_calls; malformed: text, counted
      -> chat.completion {choices[0].message, finish_reason, usage}
    POST /v1/completions {model, prompt}    the same on text (or token ids)

The run samples, not the agent: ``temperature``, ``top_p``, ``seed`` and the other sampling
fields a request carries are ignored in favour of the run's settings (what the trainer's
log-probs assume); ``max_tokens`` / ``max_completion_tokens`` only lower the turn's budget.
Budgets: ``rollout.response_length`` bounds each segment's tokens after its prompt (the
length the trainer pads to), ``max_assistant_turns`` the episode's turns and
``max_turn_tokens`` one turn; a request past a budget is refused as the API refuses a
context that is too long (400 ``context_length_exceeded``) and the episode ends as
``length``. One episode's requests run one at a time, in arrival order (the session is one
conversation; concurrent sub-agent calls wait their turn).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any, NoReturn

from recipe.agent.chat_session import ChatSession, ContextTooLong, Message, Segment
from recipe.agent.context import SliceSink, TurnEnd, TurnEngine, sample_turn
from recipe.agent.episode import EpisodeTokens
from recipe.agent.tool_calls import ParsedTurn, TurnParser
from recipe.observability.trace import now_us


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


class RequestError(Exception):
    """A request the endpoint refuses, answered as the OpenAI API answers errors."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": None, "code": self.code}}


@dataclass(slots=True)
class SampledTurn:
    """One model turn on a segment, before the client is shown it."""

    tokens: EpisodeTokens
    """The segment's context as prompt, the turn's tokens as response."""
    end: TurnEnd
    text: str
    """The turn decoded (special tokens removed)."""

    def usage(self) -> dict[str, Any]:
        prompt = len(self.tokens.prompt_ids)
        completion = self.tokens.num_response_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.end.num_cached_tokens},
        }


class ChatEpisode:
    """The requests of one episode (module docstring); counts what the metrics report."""

    def __init__(
        self,
        engine: TurnEngine,
        session: ChatSession,
        parser: TurnParser,
        limits: EpisodeLimits,
        *,
        seed: int | None = None,
        on_slice: SliceSink | None = None,
        tools_rendered: bool = True,
    ):
        self.session, self._engine, self._parser, self.limits = session, engine, parser, limits
        self._seed, self._on_slice = seed, on_slice
        self.renders_tools = tools_rendered
        """The chat template shows ``tools`` (``renders_tools``); else requests with tools
        are refused."""
        self._lock = asyncio.Lock()
        self._call_ids = (f"call_{uuid.uuid4().hex[:8]}_{i}" for i in itertools.count())
        self.num_requests = self.num_turns = self.num_tool_calls = 0
        self.num_tool_parse_errors = self.num_sync_cuts = 0
        self.model_s = 0.0
        self.budget_spent = False
        """A request was refused for a budget: the episode ends as ``length``."""
        self.last_text = ""
        """The last model turn's content as the client saw it (what a reward scores)."""

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A ``chat.completion`` for a ``/v1/chat/completions`` body."""
        messages = _messages(body)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError(400, "'tools' must be a list of tool definitions")
        if tools is not None and not self.renders_tools:
            raise RequestError(
                400,
                "the model's chat template does not render 'tools' (the model would never "
                "see them): use a model or chat template with tool support",
            )
        async with self._lock:
            segment = self._segment(
                lambda room, most: self.session.context(messages, tools, room, most)
            )
            turn = await self._sample(segment, body)
            parsed = ParsedTurn(content=turn.text)
            if tools is not None and body.get("tool_choice") != "none":
                parsed = self._parser.parse(turn.text, self._call_ids, tools)
            self.num_tool_parse_errors += int(parsed.malformed)
            self.num_tool_calls += len(parsed.tool_calls)
            message = parsed.message()
            self._record(segment, turn, message)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": parsed.finish_reason or turn.end.finish_reason,
            "logprobs": None,
        }
        return _completion("chat.completion", body, choice, turn)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A ``text_completion`` for a ``/v1/completions`` body."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # one prompt in a batch of one
        ok_ids = isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)
        if not (isinstance(prompt, str) or ok_ids) or not prompt:
            raise RequestError(400, "'prompt' must be one non-empty string or list of token ids")
        async with self._lock:
            segment = self._segment(
                lambda room, most: self.session.text_context(prompt, room, most)
            )
            turn = await self._sample(segment, body)
            self._record(segment, turn, {"role": "assistant", "content": turn.text})
        choice = {
            "index": 0,
            "text": turn.text,
            "finish_reason": turn.end.finish_reason,
            "logprobs": None,
        }
        return _completion("text_completion", body, choice, turn)

    def _segment(self, context: Any) -> Segment:
        """The request's segment, its new tokens appended, within the budgets."""
        if self.num_turns >= self.limits.max_turns:
            self._refuse(f"the episode used its {self.limits.max_turns} model turns")
        held = self.session.segments[-1] if self.session.segments else None
        room = self._room(held) if held is not None else None
        most = None if self.limits.max_context is None else self.limits.max_context - 1
        try:
            segment = context(room, most)
        except ContextTooLong as exc:
            self._refuse(str(exc))
        except ValueError as exc:
            raise RequestError(400, str(exc)) from exc
        if segment is not held and self._room(segment) <= 0:
            self._refuse("the request's prompt leaves no room for a model turn")
        return segment

    def _room(self, segment: Segment) -> int:
        """Tokens ``segment`` may still take, for deltas and the turn."""
        room = self.limits.response_length - segment.tokens.num_response_tokens
        if self.limits.max_context is not None:
            room = min(room, self.limits.max_context - len(segment.context_ids))
        return room

    def _refuse(self, reason: str) -> NoReturn:
        self.budget_spent = True
        raise RequestError(400, f"{reason}: the episode ends", "context_length_exceeded")

    async def _sample(self, segment: Segment, body: dict[str, Any]) -> SampledTurn:
        budget = self._room(segment)
        for key in ("max_completion_tokens", "max_tokens"):
            asked = body.get(key)
            if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
                budget = min(budget, asked)
        if self.limits.max_turn_tokens is not None:
            budget = min(budget, self.limits.max_turn_tokens)
        if budget <= 0:
            self._refuse("no tokens left for a model turn")
        self.num_requests += 1
        tokens = EpisodeTokens(list(segment.context_ids))
        seed = None if self._seed is None else self._seed + segment.tokens.num_response_tokens
        start, start_us = time.perf_counter(), now_us()
        end = await sample_turn(self._engine, tokens, [], budget, seed)
        self.model_s += time.perf_counter() - start
        self.num_sync_cuts += end.cuts
        if self._on_slice is not None:
            args = {"turn": self.num_turns + 1, "tokens": tokens.num_response_tokens}
            versions = sorted(set(tokens.versions))
            self._on_slice("turn", start_us, now_us(), args | {"versions": versions})
        return SampledTurn(tokens, end, self._text(tokens.response_ids, body))

    def _text(self, ids: list[int], body: dict[str, Any]) -> str:
        """The turn as the client reads it: without the stop token; special tokens kept
        where the tool parser needs them (its call markers may be special tokens)."""
        renderer = self.session.renderer
        if ids and renderer.is_eos(ids[-1]):
            ids = ids[:-1]
        skip = not body.get("tools") or self._parser.skip_special_tokens
        return renderer.tokenizer.decode(ids, skip_special_tokens=skip)

    def _record(self, segment: Segment, turn: SampledTurn, message: Message) -> None:
        sampled = turn.tokens
        self.session.record(
            segment, sampled.response_ids, sampled.logprobs, sampled.versions, message
        )
        self.num_turns += 1
        self.last_text = message.get("content") or ""


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


def _messages(body: dict[str, Any]) -> list[Message]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a 'role'")
    if body.get("n", 1) not in (1, None):
        raise RequestError(400, "only n=1 is served (each request is one model turn)")
    return messages


def _completion(
    kind: str, body: dict[str, Any], choice: dict[str, Any], turn: SampledTurn
) -> dict[str, Any]:
    """The response object; ``system_fingerprint`` names the weights version that sampled
    the turn's last token (``policy-v<N>``), so an agent can log which policy answered."""
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    versions = turn.tokens.versions
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": str(body.get("model") or "policy"),
        "system_fingerprint": f"policy-v{versions[-1]}" if versions else None,
        "choices": [choice],
        "usage": turn.usage(),
    }


def stream_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``chat.completion`` as the ``chat.completion.chunk`` events of ``stream=true``: the
    message in one delta, then the finish reason and usage (the turn is sampled whole
    before the first chunk, so a sync inside it is never seen)."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    return [
        base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        base
        | {
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"],
        },
    ]
