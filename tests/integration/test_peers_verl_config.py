"""verl's side of the peer benchmark composes with verl's own config: the pinned verl wheel
(ci/peers/verl-kit.txt) is fetched from the package registry, its Hydra config trees read out of
it, and the benchmark's overrides composed on top, as ``verl.trainer.main_ppo`` (verl) and
``verl.experimental.fully_async_policy.fully_async_main`` (verl_async) do at their start. A
key verl does not have, or a value of the wrong type, fails here on the CPU instead of after
verl's three-minute start-up on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig

from recipe.tools.bench.peers import verl
from recipe.tools.bench.peers.terms import Terms

REPO = Path(__file__).resolve().parents[2]
CONFIG_PREFIX = "verl/trainer/config/"
ASYNC_CONFIG = "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"


def _pinned_verl() -> str:
    """The ``verl==X`` line of the kit's list."""
    for line in (REPO / "ci/peers/verl-kit.txt").read_text().splitlines():
        if line.split("#")[0].strip().startswith("verl=="):
            return line.split("#")[0].strip()
    raise AssertionError("ci/peers/verl-kit.txt pins no verl")


@pytest.fixture(scope="module")
def verl_config_dir(tmp_path_factory) -> Path:
    """verl's config tree, out of its wheel (kept under $RECIPE_CACHE_DIR/peers)."""
    cache = Path(os.environ.get("RECIPE_CACHE_DIR", Path.home() / ".cache/fully_async_rl"))
    wheels = cache / "peers"
    requirement = _pinned_verl()
    version = requirement.split("==")[1]
    found = sorted(wheels.glob(f"verl-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", "--dest", str(wheels), requirement]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        found = sorted(wheels.glob(f"verl-{version}-*.whl"))
    out = tmp_path_factory.mktemp("verl")
    with zipfile.ZipFile(found[0]) as wheel:
        members = [m for m in wheel.namelist() if m.startswith(CONFIG_PREFIX)]
        wheel.extractall(out, members)
        # the fully async trainer's config, beside the trees it names by package
        text = wheel.read(ASYNC_CONFIG).decode()
    (out / CONFIG_PREFIX / Path(ASYNC_CONFIG).name).write_text(
        text.replace("- pkg://verl.trainer.config", "- file://" + str(out / CONFIG_PREFIX))
    )
    return out / CONFIG_PREFIX


def _compose(config_dir: Path, terms: Terms, tmp_path: Path, system: str = "verl") -> DictConfig:
    argv, _ = verl.verl_command(terms, tmp_path / "run", tmp_path / "site", system)
    assert argv[3] == verl.ENTRY[system]
    name = "ppo_trainer" if system == "verl" else Path(ASYNC_CONFIG).stem
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=name, overrides=argv[4:])


def test_the_benchmarks_overrides_compose_with_verls_config(verl_config_dir, tmp_path):
    terms = Terms(
        model=tmp_path / "model",
        train_file=tmp_path / "train.parquet",
        val_file=tmp_path / "val.parquet",
        prompts=16,
        n=4,
        response_length=300,
        steps=5,
    )
    cfg = _compose(verl_config_dir, terms, tmp_path)
    model, actor, rollout = (cfg.actor_rollout_ref[k] for k in ("model", "actor", "rollout"))
    assert cfg.algorithm.adv_estimator == "grpo" and not cfg.algorithm.use_kl_in_reward
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n) == (16, 16, 4)
    assert cfg.data.max_response_length == 300 and cfg.trainer.total_training_steps == 5
    assert model.override_config.attn_implementation == "sdpa" and model.use_fused_kernels
    assert list(actor.optim.betas) == [0.9, 0.99] and actor.optim.lr == terms.lr
    assert (rollout.name, rollout.tensor_model_parallel_size) == ("vllm", 1)
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.reward.custom_reward_function.path.endswith(
        "recipe/tools/bench/peers/verl_reward.py"
    )


def test_a_variant_replaces_its_key_and_a_key_verl_lacks_fails(verl_config_dir, tmp_path):
    terms = Terms(
        model=tmp_path / "m",
        train_file=tmp_path / "t",
        val_file=tmp_path / "v",
        verl_extra=("actor_rollout_ref.model.use_fused_kernels=False",),
    )
    assert not _compose(verl_config_dir, terms, tmp_path).actor_rollout_ref.model.use_fused_kernels
    typo = Terms(
        model=tmp_path / "m",
        train_file=tmp_path / "t",
        val_file=tmp_path / "v",
        verl_extra=("actor_rollout_ref.model.use_fused_kernel=True",),
    )
    with pytest.raises(ConfigCompositionException, match=r"use_fused_kernel\b"):
        _compose(verl_config_dir, typo, tmp_path)


def test_verl_async_composes_with_verls_fully_async_config(verl_config_dir, tmp_path):
    """The keys its trainer and rollouter assert on (``fully_async_rollouter.py``,
    ``fully_async_trainer.py`` in verl 0.9.1) and the one-GPU ("only hybrid") layout."""
    terms = Terms(
        model=tmp_path / "m", train_file=tmp_path / "t", val_file=tmp_path / "v", steps=6, prompts=8
    )
    cfg = _compose(verl_config_dir, terms, tmp_path, "verl_async")
    assert not cfg.actor_rollout_ref.hybrid_engine
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (0, 1)
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs
    assert cfg.actor_rollout_ref.actor.use_rollout_log_probs  # its config's own default
    assert (cfg.rollout.nnodes, cfg.trainer.n_gpus_per_node) == (0, 1)
    assert cfg.async_training.use_dynamic_resource_scheduling
    assert cfg.async_training.trigger_parameter_sync_step >= 1
    assert cfg.rollout.total_rollout_steps == 48 and cfg.trainer.test_freq == 3
