"""HFModelConfig: loads any local HF causal-LM directory, names the path on every failure
(and, for a directory without weights or tokenizer files, what is missing and what is there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipe.model import HFModelConfig, ModelPathError

pytestmark = pytest.mark.model  # builds tokenizers, loads transformers configs


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
    # HFModelConfig checks that weight files exist; these tests never load them.
    (path / "model.safetensors").write_bytes(b"")
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


def test_directory_without_weights_names_what_it_found(tmp_path):
    model_dir = _write_tiny_causal_lm(tmp_path / "m", generation_config=None)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelPathError, match=r"no model weights \(expected \*\.safetensors") as err:
        HFModelConfig(model_dir)
    assert "found: config.json, tokenizer.json, tokenizer_config.json" in str(err.value)


def test_sharded_weights_with_a_missing_shard_name_the_shard(tmp_path):
    model_dir = _write_tiny_causal_lm(tmp_path / "m", generation_config=None)
    (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelPathError, match=r"2 weight files, 1 of them missing") as err:
        HFModelConfig(model_dir)
    assert "(model-00002-of-00002.safetensors)" in str(err.value)


def test_sharded_weights_load_when_every_shard_is_there(tmp_path):
    model_dir = _write_tiny_causal_lm(tmp_path / "m", generation_config=None)
    weight_map = {"a": "model.safetensors"}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert HFModelConfig(model_dir).hf_config.model_type == "qwen2"


@pytest.mark.parametrize("kept", [[], ["tokenizer_config.json"]], ids=["none", "config only"])
def test_directory_without_tokenizer_files_names_what_it_found(tmp_path, kept):
    model_dir = _write_tiny_causal_lm(tmp_path / "m", generation_config=None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name not in kept:
            (model_dir / name).unlink()
    with pytest.raises(
        ModelPathError, match=r"no tokenizer files \(expected tokenizer.json"
    ) as err:
        HFModelConfig(model_dir)
    assert "found: " + ", ".join(sorted(["config.json", "model.safetensors", *kept])) in str(
        err.value
    )


def test_a_remote_code_tokenizer_needs_no_vocabulary_file(tmp_path):
    model_dir = _write_tiny_causal_lm(tmp_path / "m", generation_config=None)
    (model_dir / "tokenizer.json").unlink()
    auto_map = {"AutoTokenizer": ["tok.MyTokenizer", None]}
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    HFModelConfig(model_dir)  # the file check passes; loading it is the remote code's business
