"""A scripted stand-in for ``openai.AsyncOpenAI`` in unit tests of agents written against the
OpenAI API: each request is answered with the next scripted assistant message."""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion


class ScriptedClient:
    """``client.chat.completions.create`` answering each request with the next scripted
    assistant message (a dict), or raising it (an exception); the requests are kept."""

    def __init__(self, replies: list[dict[str, Any] | Exception]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = self
        self.completions = self

    async def create(self, **request: Any) -> ChatCompletion:
        self.requests.append(json.loads(json.dumps(request)))  # as sent, not as mutated later
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return ChatCompletion.model_validate(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "policy",
                "choices": [{"index": 0, "finish_reason": "stop", "message": reply}],
            }
        )
