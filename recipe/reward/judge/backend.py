"""How a judge call reaches a model: the typed request and reply, the ``JudgeBackend``
protocol, and ``EndpointBackend``, an external OpenAI-compatible server.

    Judge --JudgeCall--> JudgeBackend.complete --JudgeReply--> Judge (parse, retry)
                            |- EndpointBackend: POST {base_url}/chat/completions
                            '- the run's own judge engines (served elsewhere)

A backend makes one attempt per call: deadlines, retries and the concurrency bound are the
``Judge``'s, so every backend behaves alike under them.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Protocol

from recipe.reward.judge.config import JudgeConfig

EMPTY_API_KEY = "EMPTY"
"""The key sent when ``reward.judge.api_key_env`` is unset (what local servers expect)."""


@dataclass(frozen=True, slots=True)
class JudgeCall:
    """One request to the judge model."""

    messages: list[dict[str, str]]
    """Chat messages: ``[{"role": "user", "content": rendered template}]``, and on a retry
    after an unreadable verdict that, the judge's reply and a correction."""
    temperature: float
    """Sampling temperature."""
    top_p: float
    """Nucleus sampling mass."""
    max_tokens: int
    """The reply budget in tokens."""
    seed: int | None
    """Sampling seed (None: the server's choice)."""
    choices: tuple[str, ...] | None = None
    """The reply must be one of these (constrained decoding); None: free text. Only sent to
    a backend that ``constrains``."""


@dataclass(frozen=True, slots=True)
class JudgeReply:
    """The judge model's answer to one ``JudgeCall``."""

    text: str
    """The reply's text (the verdict is parsed from it)."""
    prompt_tokens: int
    """Tokens of the request as the server counted them (0 when it did not say)."""
    completion_tokens: int
    """Tokens of the reply (0 when the server did not say)."""


class JudgeBackend(Protocol):
    """Answers judge calls; one attempt per call, an exception when it fails."""

    constrains: bool
    """Whether its replies keep to ``JudgeCall.choices`` (constrained decoding: the run's own
    vLLM engines; not an endpoint, not the HF engine)."""

    async def complete(self, call: JudgeCall) -> JudgeReply: ...


class EndpointBackend:
    """``JudgeBackend`` over an OpenAI-compatible server (``reward.judge.base_url``).

    The ``openai`` package is imported here, not in a call: its import takes about half a
    second, which would block the event loop and eat the first call's deadline. The client
    is made on the first call, on the calling event loop (its HTTP connections belong to
    that loop), and again if a later call comes from another loop. It never retries by
    itself (``max_retries=0``): the ``Judge`` does, and counts them. It does not constrain
    replies: servers other than vLLM refuse vLLM's parameter for ``choices``.
    """

    constrains = False

    def __init__(self, cfg: JudgeConfig) -> None:
        if cfg.base_url is None or not cfg.endpoint_model:
            raise ValueError("EndpointBackend needs reward.judge.base_url and endpoint_model")
        from openai import AsyncOpenAI  # only runs that call an endpoint need the package

        self.cfg = cfg
        self._client_type = AsyncOpenAI
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __reduce__(self) -> tuple[type[EndpointBackend], tuple[JudgeConfig]]:
        return (EndpointBackend, (self.cfg,))  # a process of its own makes its own client

    async def complete(self, call: JudgeCall) -> JudgeReply:
        extra: dict[str, Any] = {} if call.seed is None else {"seed": call.seed}
        response = await self._client_on_this_loop().chat.completions.create(
            model=self.cfg.endpoint_model,
            messages=call.messages,
            temperature=call.temperature,
            top_p=call.top_p,
            max_tokens=call.max_tokens,
            **extra,
        )
        if not response.choices:
            raise RuntimeError(f"the judge endpoint {self.cfg.base_url} returned no choices")
        usage = response.usage
        return JudgeReply(
            text=response.choices[0].message.content or "",
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else 0,
        )

    async def close(self) -> None:
        """Close the client's connections (call on the loop that made them)."""
        if self._client is not None:
            client, self._client, self._loop = self._client, None, None
            await client.close()

    def _client_on_this_loop(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = self._client_type(
                base_url=self.cfg.base_url,
                api_key=os.environ.get(self.cfg.api_key_env) or EMPTY_API_KEY,
                max_retries=0,
                timeout=self.cfg.timeout_s,
            )
            self._loop = loop
        return self._client
