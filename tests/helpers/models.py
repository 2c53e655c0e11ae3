"""A random tiny Qwen2 written to disk, for tests whose responses must run long.

2 layers, 2 heads of 64, byte-level BPE, tied embeddings, float32. A *random* model rather than
the warm-started default one: a trained model ends its answers after a few tokens, and the pause
and fault tests need responses that run long enough to be cut mid-way. Its init is wide
(``initializer_range=0.2``) so next-token distributions are peaked, which keeps greedy decoding
away from near-ties between engines and batch shapes.
"""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"
CORPUS = ["the quick brown fox jumps over the lazy dog", "12+34=46 and 99-9=90 ?"]
"""What the tokenizer is trained on (20 copies): a vocabulary of 300 byte-level merges."""


def build_random_qwen2(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a random float32 Qwen2 HF directory (model, tokenizer, generation config)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out_dir)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    model.save_pretrained(out_dir)
    GenerationConfig(
        eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id
    ).save_pretrained(out_dir)
    return out_dir
