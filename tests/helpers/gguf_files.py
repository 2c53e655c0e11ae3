"""GGUF files written by the ``gguf`` package from small random HF models, as llama.cpp's
converter writes them (its tensor names, Llama's rotary permutation of q/k, a byte-level BPE
vocabulary with merges, a chat template), so the converter is tested without a download.

The tensors are stored as F32: converting back must then give the source's weights exactly
(after the same cast to the target dtype), and so its logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EOS = "<|im_end|>"
BOS = "<|im_start|>"
CORPUS = ["the quick brown fox jumps over the lazy dog", "Natalia sold 48 clips in April."]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ARCHITECTURES = ("llama", "qwen2")


def build_tokenizer() -> Any:
    """A byte-level BPE with Qwen2's split and ~300 merged tokens, ChatML specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=[EOS, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=BOS)


def build_model(architecture: str, vocab_size: int, *, seed: int = 0) -> Any:
    """A random float32 causal LM: 2 layers, 2 query heads of 32, 1 KV head, untied head."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[architecture]
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=2.0**-20,  # exact in float32, which is how GGUF stores it
        rope_theta=10000.0,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    if architecture == "qwen2":  # its q/k/v biases start at zero; make them count
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(std=0.2)
    return model


def _permute_for_gguf(weight: Any, num_heads: int) -> Any:
    # llama.cpp stores Llama's q/k rows with each head's rotary halves interleaved; transformers
    # undoes this on load, so a file written without it would not round-trip.
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(model: Any, tokenizer: Any, path: Path, *, general_type: str = "model") -> Path:
    """``model`` and ``tokenizer`` as one GGUF file (F32 tensors) at ``path``."""
    import gguf

    config = model.config
    arch = config.model_type
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(general_type)
    writer.add_name(f"random {arch}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        data = tensor.detach().float()
        if arch == "llama" and name.endswith("q_proj.weight"):
            data = _permute_for_gguf(data, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            data = _permute_for_gguf(data, config.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        writer.add_tensor(gguf_name, data.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: Any, tokenizer: Any) -> None:
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_random_gguf(out_dir: Path, architecture: str, *, general_type: str = "model") -> tuple:
    """(the GGUF's path, the source model, the source tokenizer) in ``out_dir``."""
    tokenizer = build_tokenizer()
    model = build_model(architecture, len(tokenizer))
    path = write_gguf(
        model, tokenizer, out_dir / f"random-{architecture}.gguf", general_type=general_type
    )
    return path, model, tokenizer
