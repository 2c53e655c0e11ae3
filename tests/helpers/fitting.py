"""Fit a tiny model to one chat episode, so that an end-to-end test can count on what it
samples: the loss is on the assistant turns only, as the chat template renders them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fit_to_episode(
    path: Path,
    messages: list[dict[str, Any]],
    *,
    tools: list[Any] | None = None,
    max_steps: int = 300,
    target_loss: float = 0.003,
) -> None:
    """Train the model folder ``path`` in place on the assistant messages of ``messages``
    (rendered with ``tools``) until the loss is below ``target_loss`` or ``max_steps``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)

    def length(prefix: list[dict[str, Any]], generation: bool) -> int:
        text = tokenizer.apply_chat_template(
            prefix, tools=tools, tokenize=False, add_generation_prompt=generation
        )
        return len(tokenizer(text).input_ids)

    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    ids = tokenizer(text, return_tensors="pt").input_ids  # (1, T)
    labels = torch.full_like(ids, -100)  # loss on the model turns only
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start, end = length(messages[:i], True), length(messages[: i + 1], False)
            labels[0, start:end] = ids[0, start:end]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(max_steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < target_loss:
            break
    model.save_pretrained(path)
