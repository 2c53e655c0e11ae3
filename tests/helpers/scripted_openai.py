"""A scripted stand-in for ``openai.AsyncOpenAI`` in unit tests of agents written against the
OpenAI API: each request is answered with the next scripted assistant message; ``episode``
runs an agent's ``run(client, record)`` against one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from openai.types.chat import ChatCompletion

from recipe.protocol import PromptRecord


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


def assistant(content: Any) -> dict[str, Any]:
    """A scripted assistant message of ``content``."""
    return {"role": "assistant", "content": content}


def math_record(data_source: str = "math", truth: str = "42") -> PromptRecord:
    """The record "What is 6*7?" of ``data_source`` whose answer is ``truth``."""
    return PromptRecord(
        "train:q:0", [{"role": "user", "content": "What is 6*7?"}], truth, data_source
    )


def episode(
    run: Callable[[Any, PromptRecord], Awaitable[float]],
    replies: list[dict[str, Any] | Exception],
    record: PromptRecord | None = None,
) -> tuple[float, ScriptedClient]:
    """The reward of ``run`` on ``record`` (``math_record()``) answered by ``replies``, and the
    client (its requests)."""
    client = ScriptedClient(replies)
    return asyncio.run(run(client, record or math_record())), client
