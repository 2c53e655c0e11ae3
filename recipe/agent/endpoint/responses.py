"""What an agent endpoint request gets back: ``chat.completion`` / ``text_completion`` objects
as the OpenAI API shapes them, and their events under ``stream=true`` (``chat.completion.chunk``
/ ``text_completion`` chunks).

``system_fingerprint`` names the weights version that sampled the turn's last token
(``policy-v<N>``), so an agent can log which policy answered; ``usage`` counts the turn's
context and tokens, ``prompt_tokens_details.cached_tokens`` what the prefix cache served.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from recipe.agent.context import TurnEnd
from recipe.agent.episode import EpisodeTokens


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


def completion(kind: str, model: str, choice: dict[str, Any], turn: SampledTurn) -> dict[str, Any]:
    """The response object of ``kind`` (``chat.completion`` or ``text_completion``)."""
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    versions = turn.tokens.versions
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"policy-v{versions[-1]}" if versions else None,
        "choices": [choice],
        "usage": turn.usage(),
    }


def stream_chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as the events of ``stream=true``: the message (of a ``chat.completion``:
    ``chat.completion.chunk`` deltas) or the text (of a ``text_completion``: its chunks) in
    one, then the finish reason and usage (the turn is sampled whole before the first chunk,
    so a sync inside it is never seen)."""
    choice = completion["choices"][0]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    if completion["object"] == "text_completion":
        base["object"] = "text_completion"
        text = {"index": 0, "text": choice["text"], "finish_reason": None, "logprobs": None}
        end = {"index": 0, "text": "", "finish_reason": choice["finish_reason"], "logprobs": None}
        return [base | {"choices": [text]}, base | {"choices": [end], "usage": completion["usage"]}]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
    base["object"] = "chat.completion.chunk"
    return [
        base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        base
        | {
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"],
        },
    ]
