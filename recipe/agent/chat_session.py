"""``ChatSession``: one episode's chat requests as token sequences the engine sampled.

An agent written against the chat API sends its whole conversation with every request. The
session never re-tokenises what the model generated: it keeps each segment's tokens as
sampled, and a request whose messages *extend* the segment's conversation (the earlier
messages equal, the assistant ones as this session returned them) only appends the new
messages, rendered as chat-template deltas after the sampled tokens (``ObservationRenderer``)::

    request 1  [system, user]                   -> segment 0: prompt rendered (tools too)
    reply      assistant (sampled: mask 1)      -> appended as sampled
    request 2  [system, user, assistant, tool]  -> extends segment 0: the tool message is a
                                                   delta (mask 0), the model continues
    request 3  [system, user', ...]             -> does not extend it (edited, summarised or
                                                   dropped history, a sub-agent): segment 1,
                                                   rendered from scratch, counted

``/v1/completions`` prompts follow the same rule on text: a prompt that starts with the
segment's text (its prompt, and each completion as returned) or with its token ids appends
only the rest; any other prompt starts a new segment.

Every segment becomes one training row of the episode (they share its reward and
advantage); none is ever silently re-tokenised. Message equality ignores what the client
adds (``refusal: None``, empty ``tool_calls``...): role, content, tool calls (name,
arguments, id) and ``tool_call_id`` must match.

A request is checked against ``room`` (the tokens the segment may still take; a new
segment's prompt: ``max_prompt``) before anything is appended: one that does not fit raises
``ContextTooLong`` and leaves the session as it was.
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

    @property
    def context_ids(self) -> list[int]:
        """What the engine continues from."""
        return self.tokens.prompt_ids + self.tokens.response_ids


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
    ) -> Segment:
        """The segment a chat request with ``messages`` continues, its new messages
        appended; ``room``: the most tokens it may append, ``max_prompt``: the longest
        prompt a new segment may start with (None: unbounded)."""
        if not messages:
            raise ValueError("a chat request needs at least one message")
        current = self.segments[-1] if self.segments else None
        if current is not None and current.text is None and extends(current.messages, messages):
            new = messages[len(current.messages) :]
            if new:
                ids = self.renderer.observation_ids(new, current.last_turn_ids)
                _check_room(len(ids), room)
                current.tokens.add_env(ids)
            current.messages = [dict(m) for m in messages]
            return current
        prompt = self.renderer.encode(
            self.renderer.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        )
        _check_room(len(prompt), max_prompt)
        return self._new([dict(m) for m in messages], prompt)

    def text_context(
        self, prompt: str | list[int], room: int | None = None, max_prompt: int | None = None
    ) -> Segment:
        """The segment a ``/v1/completions`` prompt continues (module docstring)."""
        current = self.segments[-1] if self.segments else None
        if current is not None and current.text is not None:
            held = current.context_ids
            if isinstance(prompt, str) and prompt.startswith(current.text):
                new = self.renderer.encode(prompt[len(current.text) :])
            elif isinstance(prompt, list) and prompt[: len(held)] == held:
                new = list(prompt[len(held) :])
            else:
                new = None
            if new is not None:
                _check_room(len(new), room)
                current.tokens.add_env(new)
                current.text = self._text_of(prompt, current.text, new)
                return current
        ids = self.renderer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("a completion request needs a prompt")
        _check_room(len(ids), max_prompt)
        segment = self._new([], ids)
        segment.text = prompt if isinstance(prompt, str) else self._decode(ids)
        return segment

    def _new(self, messages: list[Message], prompt_ids: list[int]) -> Segment:
        segment = Segment(messages, EpisodeTokens(prompt_ids))
        self.segments.append(segment)
        return segment

    def _text_of(self, prompt: str | list[int], held: str, new: list[int]) -> str:
        return prompt if isinstance(prompt, str) else held + self._decode(new)

    def _decode(self, ids: list[int]) -> str:
        return self.renderer.tokenizer.decode(ids, skip_special_tokens=True)

    def record(
        self,
        segment: Segment,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        message: Message,
    ) -> None:
        """The model's turn on ``segment``: its tokens as sampled, and ``message`` (what the
        client is shown) as the conversation's next message (a completions segment: its
        ``content`` appended to the segment's text)."""
        segment.tokens.add_model(ids, logprobs, versions)
        segment.last_turn_ids = list(ids)
        if segment.text is None:
            segment.messages.append(dict(message))
        else:
            segment.text += message.get("content") or ""


class ContextTooLong(ValueError):
    """A request's new tokens do not fit in what its segment may still take."""


def _check_room(num_tokens: int, room: int | None) -> None:
    if room is not None and num_tokens >= room:
        raise ContextTooLong(
            f"the request adds {num_tokens} tokens and leaves no room for a model turn "
            f"({room} tokens left in this episode's budget)"
        )


def extends(held: list[Message], request: list[Message]) -> bool:
    """``request`` is ``held`` plus new messages (module docstring's equality)."""
    if len(request) < len(held):
        return False
    return all(same_message(a, b) for a, b in zip(held, request, strict=False))


def same_message(a: Message, b: Message) -> bool:
    return _key(a) == _key(b)


def _key(message: Message) -> tuple[Any, ...]:
    calls = tuple(
        (
            call.get("id"),
            call.get("function", {}).get("name"),
            call.get("function", {}).get("arguments"),
        )
        for call in message.get("tool_calls") or ()
    )
    return (
        message.get("role"),
        _text(message.get("content")),
        calls,
        message.get("tool_call_id"),
        message.get("name"),
    )


def _text(content: Any) -> Any:
    """Content as text: None and "" alike; a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content
