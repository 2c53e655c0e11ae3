"""The config surface: every preset composes, bad values fail naming the key, and the key set
changes only on purpose (update tests/unit/data/config_keys.txt in the same change)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.config import RecipeConfig, load_config, register_configs
from recipe.utils.config_check import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
KEYS_SNAPSHOT = Path(__file__).parent / "data" / "config_keys.txt"
MODES = sorted(p.stem for p in (CONFIG_DIR / "mode").glob("*.yaml"))


def _compose(overrides: list[str]) -> RecipeConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return load_config(compose(config_name="config", overrides=overrides))


def _flat_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        full = f"{prefix}{key}"
        if OmegaConf.is_dict(value):
            keys.extend(_flat_keys(value, full + "."))
        else:
            keys.append(full)
    return keys


def test_every_mode_preset_composes_and_validates():
    assert MODES == ["fully_async", "one_step_off", "sync"]
    for mode in MODES:
        cfg = _compose([f"mode={mode}"])
        assert cfg.mode == mode
        assert cfg.prompts_per_step > 0


def test_every_env_preset_composes_with_every_mode():
    for env in ("calculator", "retry"):
        for mode in MODES:
            cfg = _compose([f"env={env}", f"mode={mode}"])
            assert cfg.mode == mode and cfg.rollout.multi_turn.enable
            assert cfg.rollout.multi_turn.environment == env
    calculator = _compose(["env=calculator"])
    assert calculator.data.task == "calculator"
    assert calculator.model.tiny_warm_start == "calculator"


def test_default_mode_is_fully_async():
    assert _compose([]).mode == "fully_async"


def test_config_key_set_matches_snapshot():
    keys = sorted(_flat_keys(OmegaConf.structured(RecipeConfig)))
    expected = KEYS_SNAPSHOT.read_text().split()
    assert keys == expected, (
        "the config key set changed; if on purpose, update tests/unit/data/config_keys.txt"
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.n=0", "rollout.n"),
        ("async_training.staleness_threshold=-0.5", "async_training.staleness_threshold"),
        ("async_training.require_batches=0", "async_training.require_batches"),
        (
            "async_training.trigger_parameter_sync_step=0",
            "async_training.trigger_parameter_sync_step",
        ),
        ("actor.loss_agg_mode=sum", "actor.loss_agg_mode"),
        ("rollout.backend=sglang", "rollout.backend"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("model.dtype=int8", "model.dtype"),
        ("checkpoint_engine.backend=smoke", "checkpoint_engine.backend"),
        ("data.difficulty=9", "data.difficulty"),
        ("data.source=s3", "data.source"),
        ("trainer.device=tpu", "trainer.device"),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
        ("logger.backends=[console,mlflow]", "logger.backends"),
        ("checkpoint_engine.on_failure=ignore", "checkpoint_engine.on_failure"),
        ("checkpoint_engine.max_retries=-1", "checkpoint_engine.max_retries"),
        ("rollout.max_restarts=-1", "rollout.max_restarts"),
    ],
)
def test_invalid_value_fails_naming_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        _compose([override])
    message = str(info.value)
    assert message.startswith(key) or f"{key}=" in message, message
    assert "\n" not in message


def test_batch_sizes_that_do_not_divide_fail_in_sync_mode():
    with pytest.raises(ConfigError, match=r"data.train_batch_size=30 .*multiple of"):
        _compose(["mode=sync", "data.train_batch_size=30", "actor.ppo_mini_batch_size=16"])


def test_knob_without_effect_in_mode_warns(caplog):
    with caplog.at_level("WARNING"):
        _compose(["mode=sync", "async_training.staleness_threshold=0.3"])
    assert "async_training.staleness_threshold has no effect in mode=sync" in caplog.text


def test_cli_prints_composed_config():
    out = subprocess.run(
        [sys.executable, "-m", "recipe", "--cfg", "job", "mode=sync"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    ).stdout
    assert "mode: sync" in out and "trigger_parameter_sync_step" in out


def test_cli_invalid_value_exits_with_one_line_naming_the_key(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "recipe", "rollout.n=0", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert error_lines == ["error: rollout.n=0 is invalid: allowed a number > 0"], proc.stderr
    assert "Traceback" not in proc.stderr
