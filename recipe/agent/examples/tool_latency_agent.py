"""The ``tool_latency`` episodes (``recipe.agent.builtin.ToolLatency``) as an agent written
against the OpenAI API: ``TURNS`` model turns, each followed by a tool whose latency has a
long tail (``SHORT_S``, or ``LONG_S`` with probability ``LONG_P``), its result appended to
the conversation. The workload of ``python -m recipe.tools.bench.e2e workload=agent``.

Plain-text prompts go through ``/v1/completions`` (the text so far, the tool's result
appended: the environment's observations, token for token); chat prompts through
``/v1/chat/completions`` with an ``add`` tool, the result as a ``role: tool`` message when
the model called it, a user message otherwise. The reward function scores the last turn.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import openai

from recipe.agent.builtin import draw_latency, episode_rng
from recipe.protocol import PromptRecord

TURNS, SHORT_S, LONG_S, LONG_P = 3, 0.05, 1.0, 0.1
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
_episodes: dict[str, int] = {}
_episodes_lock = threading.Lock()  # each episode runs in a thread of its own


async def run(client: openai.AsyncOpenAI, record: PromptRecord) -> None:
    with _episodes_lock:
        rng = episode_rng(record.uid, _episodes)
    if isinstance(record.prompt, str):
        await _text_episode(client, record.prompt, rng)
    else:
        await _chat_episode(client, list(record.prompt), rng)


async def _text_episode(client: openai.AsyncOpenAI, prompt: str, rng: Any) -> None:
    for turn in range(1, TURNS + 1):
        out = await client.completions.create(model="policy", prompt=prompt)
        text = out.choices[0].text
        await asyncio.sleep(draw_latency(rng, SHORT_S, LONG_S, LONG_P)[0])
        prompt += text + f" tool[{turn}]={len(text)}."


async def _chat_episode(client: openai.AsyncOpenAI, messages: list[Any], rng: Any) -> None:
    for turn in range(1, TURNS + 1):
        out = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = out.choices[0].message
        await asyncio.sleep(draw_latency(rng, SHORT_S, LONG_S, LONG_P)[0])
        messages.append(message.model_dump(exclude_none=True))
        result = f"tool[{turn}]={len(message.content or '')}"
        if message.tool_calls:
            calls = message.tool_calls
            messages += [{"role": "tool", "tool_call_id": c.id, "content": result} for c in calls]
        else:
            messages.append({"role": "user", "content": result})
