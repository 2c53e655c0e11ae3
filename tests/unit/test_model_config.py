"""HFModelConfig: loads any local HF causal-LM directory, names the path on every failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.model import HFModelConfig, ModelPathError


def _write_tiny_causal_lm(path: Path, *, generation_config: dict | None) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    path.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["1+2=3"], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>", "<pad>"])
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>"
    ).save_pretrained(path)
    Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=64,
    ).save_pretrained(path)
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config))
    return path


def test_missing_path_names_the_path(tmp_path):
    with pytest.raises(ModelPathError, match=r"model.path='.*nope': no such directory"):
        HFModelConfig(tmp_path / "nope")


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelPathError, match=r"no config\.json"):
        HFModelConfig(tmp_path)


def test_a_file_is_not_a_model_directory(tmp_path):
    file = tmp_path / "model.bin"
    file.write_bytes(b"")
    with pytest.raises(ModelPathError, match="not a directory"):
        HFModelConfig(file)


def test_non_causal_lm_is_rejected_with_its_model_type(tmp_path):
    from transformers import ViTConfig

    ViTConfig().save_pretrained(tmp_path)
    with pytest.raises(ModelPathError, match=r"model_type='vit' is not a causal LM"):
        HFModelConfig(tmp_path)


def test_eos_and_pad_come_from_generation_config_first(tmp_path):
    model = HFModelConfig(
        _write_tiny_causal_lm(
            tmp_path / "m", generation_config={"eos_token_id": [7, 8], "pad_token_id": 9}
        )
    )
    assert model.eos_token_ids == [7, 8] and model.eos_token_id == 7
    assert model.pad_token_id == 9


def test_eos_and_pad_fall_back_to_the_tokenizer(tmp_path):
    model = HFModelConfig(_write_tiny_causal_lm(tmp_path / "m", generation_config=None))
    tok = model.tokenizer
    assert model.generation_config is None
    assert model.eos_token_ids == [tok.eos_token_id]
    assert model.pad_token_id == tok.pad_token_id


def test_get_processor_falls_back_to_the_tokenizer(tmp_path):
    model = HFModelConfig(_write_tiny_causal_lm(tmp_path / "m", generation_config=None))
    assert model.get_processor() is model.tokenizer
