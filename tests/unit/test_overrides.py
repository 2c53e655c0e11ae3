"""Command-line overrides are checked before Hydra composes them (recipe/utils/overrides.py):
every refusal is one line naming the key, an unknown key comes with the closest known keys or
with our name for verl's key (recipe/utils/verl_keys.py), and what Hydra accepts still passes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from recipe.config import RecipeConfig
from recipe.launch import CONFIG_DIR
from recipe.utils.overrides import (
    OverrideError,
    _OverrideChecker,
    check_command_line,
    closest_keys,
    schema_keys,
)
from recipe.utils.verl_keys import VERL_KEYS, VERL_PREFIXES

KEYS = schema_keys(RecipeConfig)


def _check(*argv: str) -> None:
    check_command_line(list(argv), RecipeConfig, CONFIG_DIR)


def _refusal(*argv: str) -> str:
    with pytest.raises(OverrideError) as err:
        _check(*argv)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def _flat_keys(node, prefix: str = "") -> set[str]:
    keys = set()
    for name in node:
        key = prefix + str(name)
        keys.add(key)
        child = OmegaConf.select(node, str(name), throw_on_missing=False)
        if OmegaConf.is_dict(child):
            keys |= _flat_keys(child, key + ".")
    return keys


def test_schema_keys_are_the_keys_of_the_composed_schema():
    assert set(KEYS) == _flat_keys(OmegaConf.structured(RecipeConfig))


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["mode=sync", "actor.lr=1e-5", "rollout.n=8", "data.train_files=[/a.parquet]"],
        ["trainer.total_training_steps=null", "actor.lr=${oc.env:LR,1e-5}", "++actor.lr=2e-5"],
        ["actor.betas=[0.9,0.95]", "logger.backends=[console]", "model.path=/some/dir"],
        ["hydra.run.dir=/tmp/run", "+hydra.job.env_set.FOO=1", "hydra.job.chdir=false"],
        ["--cfg", "job", "mode=one_step_off"],
        ["-m", "actor.lr=1e-5,1e-4", "mode=sync,fully_async"],
    ],
    ids=["nothing", "our keys", "null interpolation ++", "lists", "hydra keys", "--cfg", "sweep"],
)
def test_overrides_hydra_accepts_pass(argv):
    _check(*argv)


@pytest.mark.parametrize(
    "argv",
    [["--help", "actor.lrr=1"], ["--config-name", "other", "x=1"], ["--version"], ["--cfg"]],
    ids=["help", "another config", "version", "argparse error"],
)
def test_help_other_config_trees_and_bad_flags_are_left_to_hydra(argv):
    _check(*argv)


def test_unknown_key_names_the_closest_keys():
    message = _refusal("actor.lrr=1e-5")
    assert message.startswith("unknown key 'actor.lrr' in 'actor.lrr=1e-5': did you mean actor.lr")


def test_unknown_top_level_key_lists_the_sections():
    message = _refusal("foo=1")
    assert "'foo'" in message and "the top-level keys are mode, model, data" in message


def test_an_added_unknown_key_is_unknown_too():
    assert "unknown key 'rollout.temprature'" in _refusal("+rollout.temprature=0.7")


@pytest.mark.parametrize(
    ("key", "close", "first"),
    [
        ("trainer.lr", ["actor.lr"], "actor.lr"),
        ("logger.backend", ["logger.backends"], "logger.backends"),
        ("rollout.temprature", ["rollout.temperature"], "rollout.temperature"),
        ("actr.lr", ["actor.lr"], "actor.lr"),
    ],
)
def test_suggestions_rank_the_closest_key_first(key, close, first):
    suggestions = closest_keys(key, list(KEYS))
    assert suggestions[0] == first and set(close) <= set(suggestions)
    assert not any(key.startswith(s + ".") for s in suggestions)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.lr=abc", "actor.lr='abc' is invalid: expected a number"),
        ("rollout.n=1.5", "rollout.n=1.5 is invalid: expected an integer"),
        ("rollout.n=[1,2]", "rollout.n=[1, 2] is invalid: expected an integer"),
        ("actor.betas=0.9", "actor.betas=0.9 is invalid: expected a list"),
        ("trainer.total_training_steps=x", "expected an integer or null"),
        ("actor=3", "actor=3 is invalid: expected a section"),
    ],
)
def test_value_of_the_wrong_type_names_the_key_and_the_type(override, expected):
    assert expected in _refusal(override)


def test_unknown_mode_preset_lists_the_presets():
    message = _refusal("mode=bogus")
    assert (
        message == "mode='bogus' is invalid: allowed one of 'fully_async', 'one_step_off', 'sync'"
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("hydra.job.env_set.FOO=1", "+hydra.job.env_set.FOO=1"),  # a missing +
        ("+actor.lr=1", "An item is already at 'actor.lr'"),  # a + too many
        ("actor.lr=1,2", "add --multirun"),  # a sweep without --multirun
        ("~actor.lr", "~actor.lr"),
        ("hydra.foo=1", "hydra.foo"),
    ],
)
def test_other_hydra_refusals_are_one_line(override, named):
    assert named in _refusal(override)


def test_unparseable_override_is_named():
    assert _refusal("actor.lr=[1,").startswith("'actor.lr=[1,' is not an override: ")


@pytest.mark.parametrize("entry", VERL_KEYS, ids=[e.verl for e in VERL_KEYS])
def test_verl_table_names_keys_that_exist_here(entry):
    assert entry.verl not in KEYS, "a key of ours; the table would shadow it"
    assert entry.ours and set(entry.ours) <= set(KEYS), entry.ours
    if entry.how:
        assert len(set(re.findall(r"{(\d)}", entry.how))) == len(entry.ours)


@pytest.mark.parametrize("entry", VERL_KEYS, ids=[e.verl for e in VERL_KEYS])
def test_verl_key_says_which_key_to_use(entry):
    message = _refusal(f"{entry.verl}=1")
    assert message.startswith(f"{entry.verl} is verl's name")
    for ours in entry.ours:
        assert ours in message
    if entry.how:
        assert "has no one-to-one equivalent here: " in message
    else:
        assert message.endswith(f"; here it is {entry.ours[0]} ({entry.ours[0]}=1)")


def test_verl_lr_names_ours():
    message = _refusal("actor_rollout_ref.actor.optim.lr=1e-6")
    assert message == (
        "actor_rollout_ref.actor.optim.lr is verl's name; here it is actor.lr (actor.lr=1e-6)"
    )


def test_verl_prefixes_point_at_our_sections():
    for _, ours in VERL_PREFIXES:
        assert ours.removesuffix(".") in KEYS


def test_verl_key_missing_from_the_table_is_translated_by_its_section():
    message = _refusal("actor_rollout_ref.actor.ppo_epochs=2")
    assert message.endswith("here it is actor.ppo_epochs (actor.ppo_epochs=2)")


def test_verl_key_with_no_equivalent_says_so():
    message = _refusal("actor_rollout_ref.model.use_remove_padding=true")
    assert "is a verl key with no equivalent here" in message


def test_verl_keys_spelled_like_ours_pass():
    _check(
        "data.train_batch_size=64",
        "data.max_prompt_length=512",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=10",
        "async_training.staleness_threshold=0.1",
        "async_training.trigger_parameter_sync_step=4",
    )


@dataclasses.dataclass
class _SchemaWithFreeFormFields:
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: Any = None


def test_keys_under_dict_or_any_fields_are_left_to_hydra():
    checker = _OverrideChecker(_SchemaWithFreeFormFields, CONFIG_DIR)
    parse = OverridesParser.create().parse_overrides
    checker.check_all(parse(["+tags.team=rl", "extra.anything=1"]))
    with pytest.raises(OverrideError, match=r"unknown key 'tag\.team'"):
        checker.check_all(parse(["tag.team=rl"]))
