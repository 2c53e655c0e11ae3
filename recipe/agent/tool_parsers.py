"""``rollout.multi_turn.tool_parser`` to a ``TurnParser``: ours (``hermes``, no vLLM import)
or one vLLM registers (``recipe.agent.vllm_tool_parsers``, imported only then).

Kept apart from ``tool_calls`` (the parsed turn and our parser) and from
``vllm_tool_parsers`` (which builds on ``tool_calls``) so neither imports the other back.
"""

from __future__ import annotations

from typing import Any

from recipe.agent.tool_calls import TOOL_PARSERS, HermesParser, TurnParser


def make_tool_parser(name: str, tokenizer: Any) -> TurnParser:
    """The parser ``rollout.multi_turn.tool_parser=name`` selects, for the model's (HF)
    ``tokenizer``. Raises a one-line ``ValueError`` for an unknown name (listing the names)
    or a vLLM parser that does not work with this tokenizer."""
    if name == HermesParser.name:
        return HermesParser()
    # Imported here: vLLM takes seconds to import and hermes must not need it.
    from recipe.agent.vllm_tool_parsers import VllmTurnParser

    return VllmTurnParser(name, tokenizer, builtin=TOOL_PARSERS)


def check_tool_parser(name: str, tokenizer: Any = None) -> None:
    """Startup check of ``rollout.multi_turn.tool_parser``: the name is known and, given the
    model's ``tokenizer``, the parser builds on it. Raises a one-line ``ValueError``."""
    if name == HermesParser.name:
        return
    from recipe.agent.vllm_tool_parsers import check_vllm_parser

    check_vllm_parser(name, tokenizer, builtin=TOOL_PARSERS)
