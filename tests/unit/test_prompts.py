"""Unit tests of prompt rendering and encoding, with a small tokenizer built in the test."""

from __future__ import annotations

import logging

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from recipe.data import prompts
from recipe.data.loaders import DataError
from recipe.data.prompts import encode_prompts, render_prompt
from recipe.protocol import PromptRecord

pytestmark = pytest.mark.model  # builds a transformers tokenizer per test

WORDS = ["[UNK]", "<s>", "What", "is", "1", "+", "2", "?", "Be", "brief", "."]
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 1+2?"},
]


def make_tokenizer(*, chat_template: str | None) -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS + ROLE_TOKENS)}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    backend.add_special_tokens(ROLE_TOKENS)
    # A BOS post-processor, so that tests can tell whether encoding adds special tokens.
    backend.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def test_render_applies_chat_template_with_generation_prompt() -> None:
    tokenizer = make_tokenizer(chat_template=CHAT_TEMPLATE)
    assert render_prompt(tokenizer, CHAT) == (
        "<|system|> Be brief.\n<|user|> What is 1+2?\n<|assistant|>"
    )


def test_render_wraps_string_prompt_as_user_message_when_templated() -> None:
    tokenizer = make_tokenizer(chat_template=CHAT_TEMPLATE)
    assert render_prompt(tokenizer, "1+2?") == "<|user|> 1+2?\n<|assistant|>"


def test_render_without_template_keeps_strings_and_joins_chat_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tokenizer = make_tokenizer(chat_template=None)
    prompts._warn_chat_without_template.cache_clear()
    assert render_prompt(tokenizer, "1+2=") == "1+2="
    with caplog.at_level(logging.WARNING, logger="recipe.data.prompts"):
        assert render_prompt(tokenizer, CHAT) == "Be brief.\nWhat is 1+2?"
        assert render_prompt(tokenizer, CHAT) == "Be brief.\nWhat is 1+2?"
    warnings = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warnings) == 1


def test_encode_adds_no_special_tokens_beyond_the_template() -> None:
    tokenizer = make_tokenizer(chat_template=CHAT_TEMPLATE)
    bos = tokenizer.convert_tokens_to_ids("<s>")
    assert tokenizer("What")["input_ids"][0] == bos  # the tokenizer itself would add a BOS
    records = [
        PromptRecord("train:a:0", CHAT, "3", "math"),
        PromptRecord("train:a:1", "What is 2?", "2", "math"),
    ]
    ids = encode_prompts(tokenizer, records, max_prompt_length=64)
    expected_first = tokenizer.convert_tokens_to_ids(
        [
            "<|system|>",
            "Be",
            "brief",
            ".",
            "<|user|>",
            "What",
            "is",
            "1",
            "+",
            "2",
            "?",
            "<|assistant|>",
        ]
    )
    assert ids[0] == expected_first
    assert ids[1] == tokenizer.convert_tokens_to_ids(
        ["<|user|>", "What", "is", "2", "?", "<|assistant|>"]
    )
    assert all(bos not in prompt_ids for prompt_ids in ids)


def test_encode_without_template_tokenizes_the_plain_string() -> None:
    tokenizer = make_tokenizer(chat_template=None)
    ids = encode_prompts(tokenizer, [PromptRecord("u", "1+2", "3", "a")], max_prompt_length=3)
    assert ids == [tokenizer.convert_tokens_to_ids(["1", "+", "2"])]


def test_encode_rejects_prompt_over_max_length_naming_uid() -> None:
    tokenizer = make_tokenizer(chat_template=None)
    records = [
        PromptRecord("val:d.jsonl:0", "1+2", "3", "a"),
        PromptRecord("val:d.jsonl:1", "1+2+2", "5", "a"),
        PromptRecord("val:d.jsonl:2", "1+2+2+2", "7", "a"),
    ]
    with pytest.raises(
        DataError, match=r"val:d\.jsonl:1 has 5 tokens > data\.max_prompt_length=3"
    ) as e:
        encode_prompts(tokenizer, records, max_prompt_length=3)
    assert "2 prompts are too long, the longest has 7 tokens" in str(e.value)


def test_encode_rejects_prompt_that_renders_to_no_tokens() -> None:
    tokenizer = make_tokenizer(chat_template=None)
    with pytest.raises(DataError, match=r"prompt train:x:4 renders to 0 tokens"):
        encode_prompts(tokenizer, [PromptRecord("train:x:4", "   ", "1", "a")], max_prompt_length=8)


def test_encode_of_no_records_is_empty() -> None:
    assert encode_prompts(make_tokenizer(chat_template=None), [], max_prompt_length=8) == []
