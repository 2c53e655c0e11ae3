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

Every segment becomes one trajectory of the episode (they share its reward); none is ever
silently re-tokenised. Message equality ignores what the client adds (``refusal: None``,
empty ``tool_calls``...): role, content, tool calls (name, arguments, id) and
``tool_call_id`` must match.
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

    def context(self, messages: list[Message], tools: list[Any] | None = None) -> Segment:
        """The segment a request with ``messages`` continues, its new messages appended."""
        if not messages:
            raise ValueError("a chat request needs at least one message")
        current = self.segments[-1] if self.segments else None
        if current is not None and extends(current.messages, messages):
            new = messages[len(current.messages) :]
            if new:
                current.tokens.add_env(self.renderer.observation_ids(new, current.last_turn_ids))
            current.messages = [dict(m) for m in messages]
            return current
        prompt = self.renderer.encode(
            self.renderer.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=False
            )
        )
        segment = Segment([dict(m) for m in messages], EpisodeTokens(prompt))
        self.segments.append(segment)
        return segment

    def record(
        self,
        segment: Segment,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        message: Message,
    ) -> None:
        """The model's turn on ``segment``: its tokens as sampled, and ``message`` (what the
        client is shown) as the conversation's next message."""
        segment.tokens.add_model(ids, logprobs, versions)
        segment.last_turn_ids = list(ids)
        segment.messages.append(dict(message))


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
