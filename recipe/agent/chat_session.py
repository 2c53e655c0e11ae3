"""``ChatSession``: one episode's chat requests as token sequences the engine sampled.

An agent written against the chat API sends its whole conversation with every request. The
session never re-tokenises what the model generated: it keeps each segment's tokens as
sampled, and a request whose messages *extend* the segment's conversation (the earlier
messages equal, the assistant ones as this session returned them) and whose ``tools`` are
the segment's only appends the new messages, rendered as chat-template deltas after the
sampled tokens (``ObservationRenderer``)::

    request 1  [system, user]                   -> segment 0: prompt rendered (tools too)
    reply      assistant (sampled: mask 1)      -> appended as sampled
    request 2  [system, user, assistant, tool]  -> extends segment 0: the tool message is a
                                                   delta (mask 0), the model continues
    request 3  [system, user', ...]             -> does not extend it (edited, summarised or
                                                   dropped history, a sub-agent): segment 1,
                                                   rendered from scratch, counted
    request 4  segment 1's messages + 1, and    -> tools are part of the prompt (templates
               tools added, removed or changed     render them first): segment 2, rendered
                                                   from scratch with the new tools, counted

``/v1/completions`` prompts follow the same rule on text: a prompt that starts with the
segment's text (its prompt, and each completion as returned) or with its token ids appends
only the rest; any other prompt starts a new segment.

Every segment becomes one training row of the episode (they share its reward and
advantage); none is ever silently re-tokenised. Message equality ignores what the client
adds (``refusal: None``, empty ``tool_calls``...): role, content, tool calls (name,
arguments, id) and ``tool_call_id`` must match.

A request becomes a ``Continuation`` first: what it would append, checked against ``room``
(the tokens the segment may still take) or, for a new segment, ``max_prompt``, with nothing
in the session changed. ``record`` commits it together with the model's turn, so a request
that fails before its turn is sampled (a budget, a template that rejects its messages, the
engine) leaves the session exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipe.agent.episode import EpisodeTokens
from recipe.agent.render import ObservationRenderer

Message = dict[str, Any]


@dataclass(slots=True)
class Segment:
    """One linear token sequence of an episode: a prompt, then model turns and deltas."""

    messages: list[Message]
    """The conversation these tokens hold, as the client sees it."""
    tokens: EpisodeTokens
    """Prompt, sampled turns (mask 1, their log-probs and versions) and deltas (mask 0)."""
    last_turn_ids: list[int] = field(default_factory=list)
    """The last model turn's ids (a delta after it closes that turn first)."""
    text: str | None = None
    """A ``/v1/completions`` segment: its prompt and completions as text (None: chat)."""
    tools: list[Any] | None = None
    """The ``tools`` rendered into the prompt (None: none)."""

    @property
    def context_ids(self) -> list[int]:
        """What the engine continues from."""
        return self.tokens.prompt_ids + self.tokens.response_ids


@dataclass(slots=True)
class Continuation:
    """What one request adds to the session, not yet part of it (``ChatSession.record``
    commits it with the model's turn)."""

    segment: Segment
    """The segment the request continues, or a new one."""
    new: bool
    """``segment`` is new: not in the session until recorded."""
    delta_ids: list[int] = field(default_factory=list)
    """Tokens appended (mask 0) before the model's turn: the new messages or text."""
    messages: list[Message] = field(default_factory=list)
    """A chat segment's conversation with the request's messages."""
    text: str | None = None
    """A completions segment's text with the request's prompt."""

    @property
    def context_ids(self) -> list[int]:
        """What the engine continues from."""
        return self.segment.context_ids + self.delta_ids

    @property
    def num_response_tokens(self) -> int:
        """The segment's tokens after its prompt, the delta included."""
        return self.segment.tokens.num_response_tokens + len(self.delta_ids)


class ChatSession:
    """The segments of one episode (module docstring)."""

    def __init__(self, renderer: ObservationRenderer) -> None:
        self.renderer = renderer
        self.segments: list[Segment] = []

    @property
    def num_new_segments(self) -> int:
        """Requests that did not extend the conversation (``agent/segments_mean`` - 1)."""
        return max(len(self.segments) - 1, 0)

    def context(
        self,
        messages: list[Message],
        tools: list[Any] | None = None,
        room: int | None = None,
        max_prompt: int | None = None,
    ) -> Continuation:
        """What a chat request with ``messages`` (and ``tools``) adds: its new messages
        after the segment it extends, or a new segment. ``room``: the most tokens it may
        append (exclusive: one is left for the turn), ``max_prompt``: the most tokens a new
        segment's prompt may have (None: unbounded). The session is not changed."""
        if not messages:
            raise ValueError("a chat request needs at least one message")
        tools = tools or None
        current = self.segments[-1] if self.segments else None
        if (
            current is not None
            and current.text is None
            and current.tools == tools
            and extends(current.messages, messages)
        ):
            new = messages[len(current.messages) :]
            ids = self.renderer.observation_ids(new, current.last_turn_ids) if new else []
            _check_room(len(ids), room)
            return Continuation(current, False, ids, [dict(m) for m in messages])
        prompt = self.renderer.encode(
            self.renderer.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
        )
        _check_prompt(len(prompt), max_prompt)
        segment = Segment([], EpisodeTokens(prompt), tools=tools)
        return Continuation(segment, True, messages=[dict(m) for m in messages])

    def text_context(
        self, prompt: str | list[int], room: int | None = None, max_prompt: int | None = None
    ) -> Continuation:
        """What a ``/v1/completions`` prompt adds (module docstring); the session is not
        changed."""
        current = self.segments[-1] if self.segments else None
        if current is not None and current.text is not None:
            held = current.context_ids
            if isinstance(prompt, str) and prompt.startswith(current.text):
                new: list[int] | None = self.renderer.encode(prompt[len(current.text) :])
            elif isinstance(prompt, list) and prompt[: len(held)] == held:
                new = list(prompt[len(held) :])
            else:
                new = None
            if new is not None:
                _check_room(len(new), room)
                text = prompt if isinstance(prompt, str) else current.text + self._decode(new)
                return Continuation(current, False, new, text=text)
        ids = self.renderer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("a completion request needs a prompt")
        _check_prompt(len(ids), max_prompt)
        text = prompt if isinstance(prompt, str) else self._decode(ids)
        return Continuation(Segment([], EpisodeTokens(ids), text=""), True, text=text)

    def _decode(self, ids: list[int]) -> str:
        return self.renderer.tokenizer.decode(ids, skip_special_tokens=True)

    def record(
        self,
        step: Continuation,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        message: Message,
    ) -> Segment:
        """Commit ``step`` with the model's turn: its tokens as sampled, and ``message``
        (what the client is shown) as the conversation's next message (a completions
        segment: its ``content`` appended to the segment's text). Returns the segment."""
        segment = step.segment
        if not len(ids) == len(logprobs) == len(versions):  # checked before anything changes
            raise ValueError(
                f"a model turn has {len(ids)} tokens, {len(logprobs)} log-probs and "
                f"{len(versions)} versions"
            )
        if step.new:
            self.segments.append(segment)
        segment.tokens.add_env(step.delta_ids)
        segment.tokens.add_model(ids, logprobs, versions)
        segment.last_turn_ids = list(ids)
        if step.text is None:
            segment.messages = [*step.messages, dict(message)]
        else:
            segment.text = step.text + (message.get("content") or "")
        return segment


class ContextTooLong(ValueError):
    """A request's new tokens do not fit in what its segment may still take."""


def _check_room(num_tokens: int, room: int | None) -> None:
    if room is not None and num_tokens >= room:
        raise ContextTooLong(
            f"the request adds {num_tokens} tokens and leaves no room for a model turn "
            f"({room} tokens left in this episode's budget)"
        )


def _check_prompt(num_tokens: int, max_prompt: int | None) -> None:
    if max_prompt is not None and num_tokens > max_prompt:
        raise ContextTooLong(
            f"the request starts a new segment with a prompt of {num_tokens} tokens, over the "
            f"run's prompt budget of {max_prompt} (data.max_prompt_length)"
        )


def extends(held: list[Message], request: list[Message]) -> bool:
    """``request`` is ``held`` plus new messages (module docstring's equality)."""
    if len(request) < len(held):
        return False
    return all(same_message(a, b) for a, b in zip(held, request, strict=False))


def same_message(a: Message, b: Message) -> bool:
    return _key(a) == _key(b)


def _key(message: Message) -> tuple[Any, ...]:
    """What two messages must share to be equal; total on any JSON value (a malformed
    message compares unequal, it never raises)."""
    if not isinstance(message, dict):
        return (message,)
    calls = message.get("tool_calls") or ()
    return (
        message.get("role"),
        _text(message.get("content")),
        tuple(_call_key(call) for call in calls) if isinstance(calls, list) else calls,
        message.get("tool_call_id"),
        message.get("name"),
    )


def _call_key(call: Any) -> tuple[Any, ...]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        return (call,)
    return (call.get("id"), function.get("name"), function.get("arguments"))


def _text(content: Any) -> Any:
    """Content as text: None and "" alike; a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return content
