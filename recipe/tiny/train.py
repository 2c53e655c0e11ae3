"""Training and decoding loops of the tiny-model builders: a seeded SFT loop and greedy or
sampled decoding without padding (contexts batched by length)."""

from __future__ import annotations

import time
from typing import Any


def sft_loop(
    model: Any,
    data: tuple[Any, Any, Any],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    seed: int,
) -> dict[str, Any]:
    """``steps`` AdamW steps on ``(input_ids, labels, attention_mask)`` rows in a seeded
    order (epoch-wise permutations); the model is left in eval mode."""
    import torch

    input_ids, labels, attention_mask = data
    gen = torch.Generator().manual_seed(seed)
    # fused: ATen's vectorised kernel. The default per-tensor step takes sqrt from MKL's VML,
    # whose last bit differs between hosts whatever MKL_CBWR says.
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup_steps))
    started = time.perf_counter()
    order = torch.empty(0, dtype=torch.long)
    recent_losses: list[float] = []
    model.train()
    for _ in range(steps):
        if len(order) < batch_size:
            order = torch.cat([order, torch.randperm(len(input_ids), generator=gen)])
        idx, order = order[:batch_size], order[batch_size:]
        out = model(
            input_ids=input_ids[idx], attention_mask=attention_mask[idx], labels=labels[idx]
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        recent_losses = [*recent_losses[-19:], out.loss.item()]
    model.eval()
    return {
        "sft_steps": steps,
        "sft_seconds": round(time.perf_counter() - started, 2),
        "sft_final_loss": round(sum(recent_losses) / max(len(recent_losses), 1), 4),
    }


def generate_answers(
    model: Any, tokenizer: Any, prompts: list[str], *, max_new_tokens: int, generator: Any = None
) -> list[str | None]:
    """Decode each prompt greedily (``generator`` None) or by sampling at temperature 1.

    Returns the text before eos, or None when no eos came within ``max_new_tokens``.
    """
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    responses = generate_ids(
        model,
        encoded,
        eos=tokenizer.eos_token_id,
        max_new_tokens=max_new_tokens,
        generator=generator,
    )
    return [None if r is None else tokenizer.decode(r) for r in responses]


def generate_ids(
    model: Any, contexts: list[list[int]], *, eos: int, max_new_tokens: int, generator: Any = None
) -> list[list[int] | None]:
    """Token-level ``generate_answers``: the ids before eos of each context's continuation
    (None: no eos within ``max_new_tokens``). Contexts are batched by length, so no padding
    (and no position shift) is ever needed."""
    import torch

    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(contexts):
        by_len.setdefault(len(ids), []).append(i)
    responses: list[list[int] | None] = [None] * len(contexts)
    with torch.no_grad():
        for idxs in by_len.values():
            seq_bt = torch.tensor([contexts[i] for i in idxs])
            for _ in range(max_new_tokens):
                logits_bv = model(input_ids=seq_bt).logits[:, -1].float()
                if generator is None:
                    nxt_b = logits_bv.argmax(-1)
                else:
                    probs_bv = torch.softmax(logits_bv, -1)
                    nxt_b = torch.multinomial(probs_bv, 1, generator=generator)[:, 0]
                seq_bt = torch.cat([seq_bt, nxt_b[:, None]], dim=1)
            for row, i in zip(seq_bt.tolist(), idxs, strict=True):
                response = row[len(contexts[i]) :]
                if eos in response:
                    responses[i] = response[: response.index(eos)]
    return responses
