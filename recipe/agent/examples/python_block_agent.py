"""Math with Python the model writes as markdown code blocks, as an agent written against the
OpenAI API: ``python -m recipe env=math_python_block data.train_files=...`` (GSM8K or MATH).

    [system, user] --chat.completions (no tools)--> assistant turn
        a complete ```python block?  yes: run the last one in the sandbox, send its output
                                          back as a user message ("Output:" and a fenced
                                          block), ask again
                                     no:  the turn is the final answer -> scorer -> reward

Why a second protocol beside ``python_tool_agent``: small coder models (Qwen2.5-Coder 0.5B
and 1.5B) never call its ``python`` function tool, but the 1.5B writes a ```python block in
about a third of its replies and then guesses what the block prints. Here the block is run,
and only a reply after the last output can score: a turn that holds a block is never the
final answer, whatever answer it guessed.

Tokens: the model's turns are trained as sampled; each output message is a ``user`` message
the endpoint renders through the chat template as a delta after them (loss mask 0, see
``recipe.agent.chat_session``).

Blocks (``last_block``): a fence of three or more backticks at the start of a line (after
any indentation, as in a list item) whose info string is ``python``, ``py`` or ``python3``
(any case), closed by a line of only backticks, at least as many. The last complete block
is run, dedented. A blank block, or one whose fence never closes (a turn cut at its token
budget), is none. Fences of other languages are skipped whole, so a python block quoted
inside a ````markdown block is not run.

Output (``output_message``): stdout's head, then ``[stderr]`` and stderr's tail (where a
traceback says what failed), together at most ``PYTHON_TOOL_MAX_OUTPUT_BYTES``, then how the
run ended, as ``python_tool_agent`` words it; fenced with more backticks than the output
holds in a row, so printed fences cannot close it early.

Settings and reward are ``python_tool_agent``'s (``python_common``): the same
``PYTHON_TOOL_*`` variables, read at import (a bad one fails the run naming it), with
``PYTHON_TOOL_MAX_TURNS`` counting requests; the registry's scorer on the final reply, a
boxed answer also spelt ``####``. No final answer (the turns spent after a block, or the
endpoint's 400/429 for a spent budget) scores 0.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import textwrap
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
from recipe.agent.sandbox import SandboxResult
from recipe.protocol import PromptRecord

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a careful math assistant. You may write one Python 3 program per reply, in a "
    "```python fenced block (numpy and sympy may be available). It is run in a fresh "
    "interpreter and what it prints is sent back to you as the next message, so print the "
    "values you need and wait for the output before you use them. When you are done, give "
    "the final answer as \\boxed{ANSWER} at the end of a reply without a code block."
)
"""Prepended as the system message unless the record's prompt starts with one."""

PYTHON_INFO = frozenset({"python", "py", "python3"})
"""Info strings (lower-cased) of the blocks that are run."""

# An opening fence: backticks, then an info string whose first word names the language (a
# backtick in it makes the line inline code, not a fence); a closing one: backticks only.
_OPENING = re.compile(r"[ \t]*(`{3,})[ \t]*([^`\s]*)[^`]*")
_CLOSING = re.compile(r"[ \t]*(`{3,})[ \t]*")

SETTINGS = ToolSettings.from_env(os.environ)


async def run(client: openai.AsyncOpenAI, record: PromptRecord) -> float:
    """Ask, run the reply's python block, repeat until a reply without one; its score."""
    messages: list[Any] = first_messages(record.prompt)
    stats, final = EpisodeStats(), ""
    for _ in range(SETTINGS.max_turns):
        try:
            out = await client.chat.completions.create(model="policy", messages=messages)
        except (openai.BadRequestError, openai.RateLimitError):  # the episode's budget is spent
            break
        message = out.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        code = last_block(message.content)
        if code is None:
            final = message.content if isinstance(message.content, str) else ""
            break
        result = await run_code(code, SETTINGS, stats)
        messages.append({"role": "user", "content": output_message(result, SETTINGS)})
    logger.debug("episode %s: %s", record.uid, stats)
    return score(record, final)


def first_messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The record's prompt as chat messages, with ``SYSTEM_PROMPT`` unless it has its own."""
    return with_system_prompt(prompt, SYSTEM_PROMPT)


def last_block(text: object) -> str | None:
    """The code of the last complete, non-blank python block of ``text`` (module docstring);
    None when there is none or ``text`` is not a string."""
    if not isinstance(text, str):
        return None
    # Lone surrogates (possible in a str decoded from JSON) could not be written as main.py.
    text = text.encode("utf-8", "replace").decode("utf-8")
    found: str | None = None
    fence, is_python = "", False  # fence: the open block's backticks ("": outside a block)
    lines: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if not fence:
            opening = _OPENING.fullmatch(line)
            if opening:
                fence, is_python, lines = opening[1], opening[2].lower() in PYTHON_INFO, []
            continue
        closing = _CLOSING.fullmatch(line)
        if closing and len(closing[1]) >= len(fence):
            code = textwrap.dedent("\n".join(lines) + "\n")
            if is_python and code.strip():
                found = code
            fence = ""
        else:
            lines.append(line)
    return found


def output_message(result: SandboxResult, settings: ToolSettings) -> str:
    """The user message answering one run (module docstring)."""
    stdout, stderr = (s.encode("utf-8", "replace") for s in (result.stdout, result.stderr))
    budget = settings.max_output_bytes
    head = stdout[: budget - min(len(stderr), budget // 2)]
    tail = stderr[len(stderr) - min(len(stderr), budget - len(head)) :]
    shown = dataclasses.replace(
        result,
        stdout=head.decode("utf-8", "ignore"),
        stderr=tail.decode("utf-8", "ignore"),
        truncated=result.truncated or len(head) < len(stdout) or len(tail) < len(stderr),
    )
    body = tool_output(shown, settings)
    longest = max((len(ticks) for ticks in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"Output:\n{fence}\n{body}\n{fence}"
