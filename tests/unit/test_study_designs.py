"""Every study design in configs/study composes into a valid config for each of its runs: a
misspelt key or a bad value fails here, on the CPU, not in a GPU sitting's first call."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipe.config import RecipeConfig, load_config, register_configs
from recipe.tools.study.design import StudyDesign
from recipe.tools.study.harness import Harness
from recipe.utils.overrides import check_command_line

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "configs"
DESIGNS = sorted((CONFIG_DIR / "study").glob("*.yaml"))


def _hydra_overrides(command: list[str]) -> list[str]:
    """The ``key=value`` arguments of a ``python -m recipe`` command, Hydra's own left out."""
    start = command.index("recipe") + 1
    return [arg for arg in command[start:] if not arg.startswith("hydra.")]


def _valid(overrides: list[str]) -> None:
    register_configs()
    check_command_line(overrides, RecipeConfig, CONFIG_DIR)  # unknown keys, verl's names, types
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        load_config(compose(config_name="config", overrides=overrides))


def test_every_design_file_is_checked():
    assert {p.stem for p in DESIGNS} >= {
        "gsm8k",
        "gsm8k_long",
        "math",
        "math_python_pilot",
        "math_python_block_pilot",
    }


@pytest.mark.parametrize("path", DESIGNS, ids=[p.stem for p in DESIGNS])
def test_each_run_of_a_design_composes_into_a_valid_config(path, tmp_path):
    design = StudyDesign.load(path)
    harness = Harness(design, tmp_path / "records", tmp_path / "out", "", device="cpu")
    harness.data = str(tmp_path / "data")  # the overrides' {data}; nothing is read here
    segments = [1, 2] if design.segment_s is not None else [0]
    # Runs differ in mode, warm-up or not, and seed: one of each of the first two kinds.
    kinds = {(spec.mode, spec.warmup): spec for spec in reversed(design.runs())}
    for spec in kinds.values():
        for segment in segments:
            _valid(_hydra_overrides(harness.train_command(spec, segment)))
    eval_args = [a.replace("{data}", harness.data) for a in design.eval_overrides]
    _valid([*design.run_overrides(design.runs()[0], harness.data), *eval_args])


def test_a_misspelt_key_in_a_design_fails_here(tmp_path):
    text = (CONFIG_DIR / "study" / "gsm8k_long.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("rollout.response_length=2048", "rollout.respons_length=2048"))
    design = StudyDesign.load(bad)
    harness = Harness(design, tmp_path / "records", tmp_path / "out", "", device="cpu")
    with pytest.raises(ValueError, match="respons_length"):
        _valid(_hydra_overrides(harness.train_command(design.runs()[0], 1)))
