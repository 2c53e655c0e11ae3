"""Turn prompts into the token ids the rollout engines receive.

Rendering follows verl: a tokenizer with a chat template renders the messages with
``add_generation_prompt=True`` and the resulting text is tokenised with
``add_special_tokens=False``, so the ids hold exactly what the template wrote (no second BOS).
A tokenizer without a chat template (a base model, or the embedded tiny model) gets plain
strings as they are; chat messages are joined by newlines, with a warning, because the roles
are lost.

Length is checked here, once, at startup: a prompt over ``data.max_prompt_length`` tokens is
an error naming its uid, never a silent truncation.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from recipe.data.loaders import DataError
from recipe.protocol import ChatMessages, PromptRecord

logger = logging.getLogger(__name__)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer: Any, prompt: str | ChatMessages) -> str:
    """The text the model sees for ``prompt``, generation prompt included when templated."""
    if has_chat_template(tokenizer):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if isinstance(prompt, str):
        return prompt
    _warn_chat_without_template(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    return "\n".join(message["content"] for message in prompt)


@functools.cache
def _warn_chat_without_template(tokenizer_name: str) -> None:
    # Cached: once per tokenizer, not once per prompt of a 20k-prompt dataset.
    logger.warning(
        "tokenizer %r has no chat template: chat messages are joined by newlines (roles are "
        "dropped); give the model a chat template or store plain-string prompts",
        tokenizer_name,
    )


def encode_prompts(
    tokenizer: Any, records: Sequence[PromptRecord], *, max_prompt_length: int
) -> list[list[int]]:
    """Token ids of each record's rendered prompt, in order.

    Raises ``DataError`` naming the uid of the first prompt that renders to no tokens or to
    more than ``max_prompt_length`` tokens (and how many such prompts there are).
    """
    if not records:
        return []
    texts = [render_prompt(tokenizer, record.prompt) for record in records]
    ids_per_prompt = [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    _check_lengths(records, ids_per_prompt, max_prompt_length)
    return ids_per_prompt


def _check_lengths(
    records: Sequence[PromptRecord], ids_per_prompt: list[list[int]], max_prompt_length: int
) -> None:
    empty = [r.uid for r, ids in zip(records, ids_per_prompt, strict=True) if not ids]
    if empty:
        raise DataError(f"prompt {empty[0]} renders to 0 tokens ({len(empty)} such prompts)")
    too_long = [
        (r.uid, len(ids))
        for r, ids in zip(records, ids_per_prompt, strict=True)
        if len(ids) > max_prompt_length
    ]
    if too_long:
        uid, num_tokens = too_long[0]
        longest = max(n for _, n in too_long)
        raise DataError(
            f"prompt {uid} has {num_tokens} tokens > data.max_prompt_length={max_prompt_length} "
            f"({len(too_long)} prompts are too long, the longest has {longest} tokens); "
            "raise data.max_prompt_length or filter the dataset"
        )
