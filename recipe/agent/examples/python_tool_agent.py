"""Math with a Python tool, as an agent written against the OpenAI API:
``python -m recipe env=math_python data.train_files=...`` (GSM8K or MATH rows).

    [system, user] --chat.completions(tools=[python])--> assistant turn
        tool_calls?  yes: run each call's code in the sandbox (recipe.agent.sandbox), append
                          the output as a role=tool message, ask again
                     no:  the turn is the final answer -> the registry's scorer -> reward

The code runs in a fresh subprocess per call with the limits below, so an episode waits on a
tool whose latency is real (an interpreter's start, the code's own run time, a timeout).
The endpoint parses the model's hermes ``<tool_call>`` text into ``tool_calls`` and renders
the ``tool`` messages back through the chat template; the model's tokens are trained as sampled.

Reward: the scorer the registry holds for the record's ``data_source``, on the final turn.
The system prompt asks for the answer in ``\\boxed{}`` (what the MATH scorer reads); GSM8K's
strict scorer reads the number after ``####``, so a boxed answer is also handed to it in that
spelling, and one agent serves both datasets. No final answer (the episode's budget spent:
the endpoint answers 400, or 429) scores 0.

Settings (``python_common.ToolSettings``, shared with the code-block agent
``python_block_agent``), read from the environment when the module is imported (a bad value
fails the run at startup naming the variable; a local Ray's workers inherit the launching
shell's environment): ``PYTHON_TOOL_TIMEOUT_S`` (5), ``PYTHON_TOOL_MEMORY_MB`` (512),
``PYTHON_TOOL_MAX_OUTPUT_BYTES`` (4096), ``PYTHON_TOOL_MAX_TURNS`` (8, requests per episode;
``rollout.multi_turn.max_assistant_turns`` may stop it first), ``PYTHON_TOOL_USER`` and
``PYTHON_TOOL_PYTHON`` (run the code as that account with that interpreter: see the
sandbox's limits when the worker runs as root).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import openai

from recipe.agent.examples.python_common import (
    EpisodeStats,
    ToolSettings,
    run_code,
    score,
    tool_output,
    with_system_prompt,
)
from recipe.protocol import PromptRecord

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a careful math assistant. You may call the `python` tool to run Python 3 code "
    "(numpy and sympy may be available); it returns what the code prints, so print the "
    "values you need. Each call starts a fresh interpreter. When you are done, give the "
    "final answer as \\boxed{ANSWER} at the end of your reply."
)
"""Prepended as the system message unless the record's prompt starts with one."""

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python 3 code in a fresh process; returns its stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The program to run."}},
                "required": ["code"],
            },
        },
    }
]

SETTINGS = ToolSettings.from_env(os.environ)


async def run(client: openai.AsyncOpenAI, record: PromptRecord) -> float:
    """Ask, run the tool calls, repeat until an answer; its score under the registry."""
    messages: list[Any] = first_messages(record.prompt)
    stats, final = EpisodeStats(), ""
    for _ in range(SETTINGS.max_turns):
        try:
            out = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS
            )
        except (openai.BadRequestError, openai.RateLimitError):  # the episode's budget is spent
            break
        message = out.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # None: a custom (non-function) tool
            name, arguments = (function.name, function.arguments) if function else ("?", "")
            content = await call_tool(name, arguments, stats)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    logger.debug("episode %s: %s", record.uid, stats)
    return score(record, final)


def first_messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's prompt as chat messages, with ``SYSTEM_PROMPT`` unless it has its own."""
    return with_system_prompt(prompt, SYSTEM_PROMPT)


async def call_tool(name: str, arguments: str, stats: EpisodeStats) -> str:
    """The ``tool`` message content answering one call (errors are told to the model)."""
    try:
        code = json.loads(arguments).get("code") if name == "python" else None
    except (json.JSONDecodeError, AttributeError):
        code = None
    if not isinstance(code, str):
        stats.tool_errors += 1
        return f'error: call the tool `python` with arguments {{"code": "<program>"}}, not {name}'
    return tool_output(await run_code(code, SETTINGS, stats), SETTINGS)
