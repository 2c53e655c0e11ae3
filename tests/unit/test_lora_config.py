"""``actor.lora``: what vLLM cannot serve fails at startup with one line naming the key, and
``python -m recipe`` turns it into one ``error:`` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipe.config import load_config, register_configs
from recipe.utils.config_check import ConfigError
from recipe.workers.config import VLLM_LORA_RANKS, LoraConfig

REPO = Path(__file__).resolve().parents[2]


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return load_config(compose(config_name="config", overrides=overrides))


def test_lora_is_off_by_default_with_the_attention_and_mlp_projections_as_targets():
    lora = _compose([]).actor.lora
    assert lora.rank == 0 and not lora.enabled
    assert lora.target_modules == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip


@pytest.mark.parametrize("rank", VLLM_LORA_RANKS)
def test_every_rank_vllm_serves_is_accepted(rank):
    assert _compose([f"actor.lora.rank={rank}"]).actor.lora.enabled


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("actor.lora.rank=4", "rank 4 is not one vLLM serves; use one of 1, 8, 16"),
        ("actor.lora.rank=-8", "rank -8 is not one vLLM serves"),
        ("actor.lora.target_modules=[q_proj,embed_tokens]", "vLLM loads no LoRA on embeddings"),
        ("actor.lora.target_modules=[lm_head]", "vLLM loads no LoRA on embeddings"),
        ("actor.lora.target_modules=[]", "a non-empty list"),
        ("actor.lora.dropout=1.0", "in [0, 1)"),
        ("actor.lora.alpha=0", "a number > 0"),
    ],
)
def test_what_vllm_cannot_serve_fails_naming_the_key(override, says):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as info:
        _compose(["actor.lora.rank=8", override])
    message = str(info.value)
    assert message.startswith(f"{key}=") and says in message, message
    assert "\n" not in message


def test_a_plain_dict_builds_the_same_checks():
    with pytest.raises(ConfigError, match=r"actor\.lora\.rank=12"):
        LoraConfig(rank=12)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("actor.lora.rank=4", "error: actor.lora.rank=4 is invalid"),
        # Not keys at all: what vLLM refuses (DoRA, modules_to_save, LoRA bias) is not exposed.
        ("+actor.lora.use_dora=true", "error: unknown key 'actor.lora.use_dora'"),
        ("+actor.lora.modules_to_save=[lm_head]", "error: unknown key 'actor.lora.modules_to"),
    ],
)
def test_the_command_line_refuses_what_vllm_cannot_serve_with_one_line_and_exit_code_2(
    override, says, tmp_path
):
    result = subprocess.run(
        [sys.executable, "-m", "recipe", override, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(says), result.stderr[-2000:]
