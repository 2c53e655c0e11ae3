"""What the two Python agents share: the sandbox's settings, one run of the model's code, how
its output reads, and the score of a final answer.

    python_tool_agent   (env=math_python)        code from a ``python`` function-tool call
    python_block_agent  (env=math_python_block)  code from a markdown ```python block
        |                                              |
        +--> run_code(code, settings, stats) --> recipe.agent.sandbox.run_python_async
        +--> score(record, final turn)       --> the registry's scorer (boxed also as ####)

Both agents read the same ``PYTHON_TOOL_*`` variables (``ToolSettings.from_env``): the
sandbox is one tool however the model asks for it, so a node's limits (and, as root, the
account the code runs as) stay in force when a run switches from one protocol to the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recipe.agent.sandbox import SandboxResult, run_python_async
from recipe.protocol import PromptRecord
from recipe.reward.registry import get_scorer
from recipe.reward.scorers import last_boxed


def _number(env: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    text = env.get(name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={text!r}: expected a positive {kind.__name__}")
    return value


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """The sandbox's limits and the episode's length."""

    timeout_s: float = 5.0
    """Wall-clock deadline of one run (``PYTHON_TOOL_TIMEOUT_S``)."""
    memory_mb: int = 512
    """Address space of each process of a run (``PYTHON_TOOL_MEMORY_MB``)."""
    max_output_bytes: int = 4096
    """Bytes of stdout, and of stderr, read back (``PYTHON_TOOL_MAX_OUTPUT_BYTES``)."""
    max_turns: int = 8
    """Requests per episode (``PYTHON_TOOL_MAX_TURNS``); the run's
    ``rollout.multi_turn.max_assistant_turns`` may stop it first."""
    user: str | None = None
    """Run the code as this account (``PYTHON_TOOL_USER``; the worker must be root)."""
    python: str | None = None
    """The interpreter the code runs in (``PYTHON_TOOL_PYTHON``; default: the worker's)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ToolSettings:
        """From ``PYTHON_TOOL_*`` variables; ``ValueError`` naming a bad one."""
        default = cls()
        return cls(
            timeout_s=_number(env, "PYTHON_TOOL_TIMEOUT_S", default.timeout_s, float),
            memory_mb=_number(env, "PYTHON_TOOL_MEMORY_MB", default.memory_mb, int),
            max_output_bytes=_number(
                env, "PYTHON_TOOL_MAX_OUTPUT_BYTES", default.max_output_bytes, int
            ),
            max_turns=_number(env, "PYTHON_TOOL_MAX_TURNS", default.max_turns, int),
            user=env.get("PYTHON_TOOL_USER") or None,
            python=env.get("PYTHON_TOOL_PYTHON") or None,
        )


@dataclass(slots=True)
class EpisodeStats:
    """One episode's use of the sandbox (logged at DEBUG when it ends)."""

    tool_calls: int = 0
    """Programs run."""
    tool_seconds: float = 0.0
    """Their wall time together."""
    tool_timeouts: int = 0
    """Runs killed at the deadline."""
    tool_errors: int = 0
    """Function-tool calls that named another tool or gave no ``code`` string (never run)."""


def with_system_prompt(
    prompt: str | list[dict[str, Any]], system_prompt: str
) -> list[dict[str, Any]]:
    """The record's prompt as chat messages, with ``system_prompt`` unless it has its own."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if messages and messages[0].get("role") == "system":
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


async def run_code(code: str, settings: ToolSettings, stats: EpisodeStats) -> SandboxResult:
    """Run ``code`` in the sandbox under ``settings``, counted in ``stats``."""
    result = await run_python_async(
        code,
        timeout_s=settings.timeout_s,
        memory_mb=settings.memory_mb,
        max_output_bytes=settings.max_output_bytes,
        user=settings.user,
        python=settings.python,
    )
    stats.tool_calls += 1
    stats.tool_seconds += result.seconds
    stats.tool_timeouts += result.timed_out
    return result


def tool_output(result: SandboxResult, settings: ToolSettings) -> str:
    """What the model reads of one run: stdout, then stderr and how it ended when notable."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr}")
    if result.truncated:
        parts.append(f"[output cut at {settings.max_output_bytes} bytes]")
    if result.timed_out:
        parts.append(f"[killed: ran past the {settings.timeout_s:g} s time limit]")
    elif result.exit_code:
        parts.append(f"[exit status {result.exit_code}]")
    return "\n".join(p.rstrip("\n") for p in parts if p) or "[no output]"


def score(record: PromptRecord, final: str) -> float:
    """The registry's score of the final turn, its boxed answer also spelt ``#### answer``
    (what GSM8K's strict scorer reads), so one agent serves GSM8K and MATH rows."""
    if not final:
        return 0.0
    boxed = last_boxed(final)
    solution = final if boxed is None else f"{final}\n#### {boxed}"
    raw = get_scorer(record.data_source)(
        record.data_source, solution, record.ground_truth, record.extra_info
    )
    return float(raw["score"] if isinstance(raw, dict) else raw)
