"""A model turn's text as the OpenAI chat API returns it: ``content`` and ``tool_calls``.

``rollout.multi_turn.tool_parser`` names the model's tool-call format (as vLLM's
``--tool-call-parser`` does):

    hermes   ours: Qwen2.5 / Hermes / many chat templates: each call is
             ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` after optional text
    other    any parser vLLM registers (llama3_json, mistral, pythonic, qwen3_coder, ...),
             run through vLLM's own class (recipe/agent/vllm_tool_parsers.py; imports vLLM)

``recipe.agent.tool_parsers.make_tool_parser(name, tokenizer)`` builds the ``TurnParser``
(ours or vLLM's); ``check_tool_parser`` is the startup check.

``TurnParser.parse(text, call_ids, tools)`` returns the assistant message (``content``, and
``tool_calls`` with ids from ``call_ids``) and whether the text held a malformed call. A
malformed call (bad JSON, no name, arguments that are not an object, JSON nested past what
the decoder takes, anything else the parse raises) is never half-parsed: the whole turn
comes back as plain text, as the API returns text a model failed to format, and the caller
counts it (``agent/tool_parse_errors``). A parser never raises on a model's text: whatever
the model writes is the model's turn, not a failed request. The tokens the model sampled
are kept whatever the parse: this is only what the agent is shown.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

TOOL_PARSERS = ("hermes",)
"""Our own ``rollout.multi_turn.tool_parser`` values (vLLM's registered names are accepted
beside them by ``make_tool_parser``)."""

_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


@dataclass(slots=True)
class ParsedTurn:
    """One model turn as the chat API shows it."""

    content: str | None
    """Text outside the calls (None when the turn is only calls)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """``{"id", "type": "function", "function": {"name", "arguments"}}`` (arguments: JSON)."""
    malformed: bool = False
    """The text opened a call that could not be parsed: it is returned as plain text."""

    def message(self) -> dict[str, Any]:
        """The ``role: assistant`` message of a chat completion."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out

    @property
    def finish_reason(self) -> str | None:
        """``tool_calls`` when the turn called tools (else the engine's reason stands)."""
        return "tool_calls" if self.tool_calls else None


class TurnParser(abc.ABC):
    """One tool-call format: a model turn's text -> the assistant message."""

    name: str
    """The ``rollout.multi_turn.tool_parser`` value."""
    skip_special_tokens: bool = True
    """How the caller decodes a turn's ids (stop token excluded) before ``parse``: False
    where the format's markers are special tokens (vLLM's ``adjust_request`` says so)."""

    @abc.abstractmethod
    def parse(
        self, text: str, call_ids: Iterator[str], tools: list[dict[str, Any]] | None = None
    ) -> ParsedTurn:
        """``text`` (one model turn) as content and tool calls; each call takes the next id
        of ``call_ids``; ``tools``: the request's ``tools`` (OpenAI format)."""


class HermesParser(TurnParser):
    """Ours: needs no tokenizer and no vLLM."""

    name = "hermes"

    def parse(
        self, text: str, call_ids: Iterator[str], tools: list[dict[str, Any]] | None = None
    ) -> ParsedTurn:
        return _parse_hermes(text, call_ids)


def parse_tool_calls(text: str, parser: str, call_ids: Iterator[str]) -> ParsedTurn:
    """``text`` (one model turn, special tokens removed) as content and tool calls, by one of
    our parsers (``make_tool_parser`` also reaches vLLM's)."""
    if parser != "hermes":
        raise ValueError(
            f"rollout.multi_turn.tool_parser={parser!r}: allowed one of {list(TOOL_PARSERS)}"
        )
    return _parse_hermes(text, call_ids)


def _parse_hermes(text: str, call_ids: Iterator[str]) -> ParsedTurn:
    if _HERMES_OPEN not in text:
        return ParsedTurn(content=text)
    functions = []
    for body in _HERMES_CALL.findall(text):
        function = _hermes_call(body)
        if function is None:
            return ParsedTurn(content=text, malformed=True)
        functions.append(function)
    if not functions or text.count(_HERMES_OPEN) != len(functions):  # an unclosed call
        return ParsedTurn(content=text, malformed=True)
    calls = [{"id": next(call_ids), "type": "function", "function": f} for f in functions]
    content = _HERMES_CALL.sub("", text).strip()
    return ParsedTurn(content=content or None, tool_calls=calls)


def _hermes_call(body: str) -> dict[str, str] | None:
    """One call's ``function`` (``name``, ``arguments`` as JSON); None when malformed."""
    try:
        call = json.loads(body)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            arguments = json.loads(arguments)
        if not call["name"] or not isinstance(arguments, dict):
            return None
        return {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
    except Exception:  # bad JSON, nesting past the decoder's recursion limit, ...
        return None
