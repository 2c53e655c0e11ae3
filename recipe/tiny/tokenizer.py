"""The byte-level BPE tokenizer of the tiny models: 256 byte tokens + eos + pad, no merges,
so every digit and operator is one token; saved as a Qwen2 tokenizer (``AutoTokenizer``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


# Qwen2's pre-tokenizer split: digits are isolated, punctuation runs are grouped.
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_alphabet() -> dict[int, str]:
    # Byte-level BPE maps each byte to a printable character; printable Latin-1 bytes map to
    # themselves and the rest are shifted above 255 (the usual GPT-2 convention).
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = (b for b in range(256) if b not in printable)
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return dict(sorted(table.items()))


def build_tokenizer(out_dir: Path, *, model_max_length: int) -> Any:
    """Write a byte-level BPE tokenizer (256 byte tokens + eos + pad) and reload it through
    ``AutoTokenizer``, as every component will, checking the round trip."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _byte_alphabet().items()}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], continuing_subword_prefix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(EOS_TOKEN, special=True), AddedToken(PAD_TOKEN, special=True)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.save_pretrained(out_dir)
    # AutoTokenizer rebuilds a qwen2 folder's tokenizer as Qwen2Tokenizer (vocab + merges +
    # Qwen2's pre-tokenizer); the tokenizer above is built to be exactly that.
    cfg_path = out_dir / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.update(
        tokenizer_class="Qwen2Tokenizer",
        unk_token=None,
        add_prefix_space=False,
        model_max_length=model_max_length,
    )
    cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    # The task relies on exact round trips and on one token per digit and operator.
    for text in ("0123456789", "12+34=46", "99-9=90", "hello world"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if tokenizer.decode(ids) != text:
            raise RuntimeError(f"tiny tokenizer does not round-trip {text!r}: {ids}")
    for char in "0123456789+-=":
        if len(tokenizer.encode(char, add_special_tokens=False)) != 1:
            raise RuntimeError(f"tiny tokenizer splits {char!r} into several tokens")
    return tokenizer
