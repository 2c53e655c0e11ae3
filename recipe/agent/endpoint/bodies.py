"""Request bodies of the agent endpoint, checked field by field before anything is rendered.

    /v1/chat/completions  -> ChatRequest        messages, tools, tool_choice, max_tokens, stream
    /v1/completions       -> CompletionRequest  prompt (text or token ids), max_tokens, stream

A field the endpoint cannot serve is refused here with a 400 that names it
(``messages[2].tool_calls[0].function: ...``), so the common malformed bodies never reach the
chat template, the tokenizer or the engine. These checks are the cheap ones; whatever still
fails later on a request's content (a template's ``raise_exception``, a tokenizer's decode)
is the request's too (``ChatEpisode`` answers it 400), never the engine's.

Fields the run decides are not checked: ``temperature``, ``top_p``, ``seed`` and the other
sampling fields are ignored (the run samples), so any value is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

BUDGET_CODE = "context_length_exceeded"
"""The error code of a request refused for a budget (the episode ends as ``length``)."""


class RequestError(Exception):
    """A request the endpoint refuses, answered as the OpenAI API answers errors."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": None, "code": self.code}}

    @property
    def is_agents(self) -> bool:
        """A malformed request (4xx), not a budget, a busy episode or the server's fault:
        what ``agent/request_errors`` counts."""
        return 400 <= self.status < 500 and self.status != 429 and self.code != BUDGET_CODE


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A ``/v1/chat/completions`` body, checked."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    """None when the request has none (an empty list is none)."""
    parse_tools: bool
    """Turn the model's text into ``tool_calls`` (tools given, ``tool_choice`` not "none")."""
    max_tokens: int | None
    """``max_completion_tokens`` or ``max_tokens`` (the smaller): only lowers the budget."""
    stream: bool
    model: str


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A ``/v1/completions`` body, checked."""

    prompt: str | list[int]
    """Text, or token ids of this model's vocabulary."""
    max_tokens: int | None
    stream: bool
    model: str


def chat_request(body: dict[str, Any]) -> ChatRequest:
    """``body`` checked (``RequestError`` 400 naming the first bad field)."""
    _check_n(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _bad("'tools' must be a list of tool definitions")
        for i, tool in enumerate(tools):
            _check_tool(tool, f"tools[{i}]")
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str | dict):
        raise _bad("'tool_choice' must be a string or an object")
    return ChatRequest(
        messages=messages,
        tools=tools or None,
        parse_tools=bool(tools) and choice != "none",
        max_tokens=_max_tokens(body),
        stream=_stream(body),
        model=_model(body),
    )


def completion_request(body: dict[str, Any], vocab_size: int) -> CompletionRequest:
    """``body`` checked; token ids must lie in ``[0, vocab_size)``."""
    _check_n(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, list):
        for i, token in enumerate(prompt):
            if isinstance(token, bool) or not isinstance(token, int):
                raise _bad(f"prompt[{i}] must be a token id (an integer), not {_kind(token)}")
            if not 0 <= token < vocab_size:
                raise _bad(
                    f"prompt[{i}]={token} is not a token id of this model (0..{vocab_size - 1})"
                )
    elif not isinstance(prompt, str):
        raise _bad("'prompt' must be one string or one list of token ids")
    if not prompt:
        raise _bad("'prompt' is empty")
    return CompletionRequest(
        prompt=prompt, max_tokens=_max_tokens(body), stream=_stream(body), model=_model(body)
    )


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object, not {_kind(message)}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise _bad(f"{where}.role must be a non-empty string")
    _check_content(message.get("content"), f"{where}.content")
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise _bad(f"{where}.{key} must be a string")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list")
    for i, call in enumerate(calls):
        _check_call(call, f"{where}.tool_calls[{i}]")


def _check_content(content: Any, where: str) -> None:
    """None, text, or a list of text parts (the policy reads text only)."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of text parts, not {_kind(content)}")
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise _bad(f"{where}[{i}] must be a text part ({{'type': 'text', 'text': ...}})")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{i}].text must be a string")


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise _bad(f"{where} must be an object, not {_kind(call)}")
    if call.get("id") is not None and not isinstance(call["id"], str):
        raise _bad(f"{where}.id must be a string")
    function = call.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{where}.function must be an object with 'name' and 'arguments'")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _bad(f"{where}.function.name must be a non-empty string")
    if not isinstance(function.get("arguments"), str | dict):
        raise _bad(f"{where}.function.arguments must be a JSON string")


def _check_tool(tool: Any, where: str) -> None:
    if not isinstance(tool, dict):
        raise _bad(f"{where} must be an object, not {_kind(tool)}")
    if tool.get("type", "function") != "function":
        raise _bad(f"{where}.type must be 'function'")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{where}.function must be an object")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise _bad(f"{where}.function.name must be a non-empty string")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise _bad(f"{where}.function.description must be a string")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise _bad(f"{where}.function.parameters must be an object (a JSON schema)")


def _check_n(body: dict[str, Any]) -> None:
    if body.get("n", 1) not in (1, None) or isinstance(body.get("n"), bool):
        raise _bad("only n=1 is served (each request is one model turn)")


def _max_tokens(body: dict[str, Any]) -> int | None:
    asked = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _bad(f"'{key}' must be a positive integer")
        asked.append(value)
    return min(asked) if asked else None


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("'stream' must be true or false")
    return bool(stream)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else "policy"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _bad(message: str) -> RequestError:
    return RequestError(400, message)
