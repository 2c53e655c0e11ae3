"""Unit tests of the reward component: built-in scorers, registry, custom functions, results."""

from __future__ import annotations

import pickle

import pytest

from recipe.reward import RewardConfig, RewardFunction, RewardResult, get_scorer
from recipe.reward.custom import load_custom_fn
from recipe.reward.registry import known_data_sources, register_scorer
from recipe.reward.scorers import arithmetic_score, gsm8k_score, last_boxed, math_score
from recipe.utils.config_check import ConfigError

# ---------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("68", 1.0),
        (" 68 ", 1.0),
        ("\n68<|endoftext|>", 1.0),
        ("68 and then 12", 1.0),
        ("69", 0.0),
        ("", 0.0),
        ("   ", 0.0),
        ("6 8", 0.0),
        ("68.5", 0.0),
        ("abc", 0.0),
        ("12 68", 0.0),
    ],
)
def test_arithmetic_scores_first_integer_of_response(response: str, expected: float) -> None:
    assert arithmetic_score("arithmetic", response, "68") == expected


def test_arithmetic_scores_negative_answers() -> None:
    assert arithmetic_score("arithmetic", "-7", "-7") == 1.0
    assert arithmetic_score("arithmetic", "7", "-7") == 0.0


# ---------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}", "\\left(3, \\frac{\\pi}{2}\\right)"),
        ("\\fbox{7}", "7"),
        ("$\\boxed 9$", "9"),
        ("\\boxed{12", None),
        ("no box", None),
    ],
)
def test_last_boxed_extracts_last_answer_with_nested_braces(text: str, expected: str) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("The answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", 1.0),
        ("$\\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),
        ("\\boxed{0.50}", "\\frac12", 1.0),
        ("\\boxed{\\frac{1}{3}}", "0.333", 0.0),
        ("\\boxed{ 1 0 }", "10", 1.0),
        ("\\boxed{10.}", "10", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", 1.0),
        ("\\boxed{2\\!\\sqrt{3}}", "2\\sqrt{3}", 1.0),
        ("\\boxed{-\\frac{3}{4}}", "-0.75", 1.0),
        ("\\boxed{11}", "10", 0.0),
        ("\\boxed{x+1}", "1+x", 0.0),
        ("10", "10", 0.0),  # no box: no answer
        ("\\boxed{}", "", 0.0),
        ("\\boxed{5}", "so the answer is \\boxed{5}", 1.0),
    ],
)
def test_math_scorer_matches_boxed_answer_after_light_normalisation(
    response: str, truth: str, expected: float
) -> None:
    assert math_score("lighteval/MATH", response, truth) == expected


# ---------------------------------------------------------------- gsm8k


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("She has 72 apples.\n#### 72", "72", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### $18", "18", 1.0),
        ("#### 72.", "72", 1.0),
        ("#### 5 first\n#### 72", "72", 1.0),
        ("#### 72\n#### 5", "72", 0.0),
        ("the answer is 72", "72", 0.0),
        ("#### 71", "72", 0.0),
        ("#### -3", "-3", 1.0),
        ("####", "72", 0.0),
    ],
)
def test_gsm8k_scorer_is_strict_about_last_hash_answer(
    response: str, truth: str, expected: float
) -> None:
    assert gsm8k_score("openai/gsm8k", response, truth) == expected


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("source", "scorer"),
    [
        ("arithmetic", arithmetic_score),
        ("lighteval/MATH", math_score),
        ("DigitalLearningGmbH/MATH-lighteval", math_score),
        ("HuggingFaceH4/MATH-500", math_score),
        ("math", math_score),
        ("openai/gsm8k", gsm8k_score),
        ("gsm8k", gsm8k_score),
    ],
)
def test_registry_maps_builtin_sources_to_scorers(source: str, scorer: object) -> None:
    assert get_scorer(source) is scorer


def test_unknown_data_source_lists_known_sources_and_suggests_custom_fn() -> None:
    with pytest.raises(ValueError, match=r"nope") as info:
        get_scorer("nope")
    assert "openai/gsm8k" in str(info.value)
    assert "arithmetic" in str(info.value)
    assert "reward.custom_fn" in str(info.value)


def test_register_scorer_rejects_a_second_function_for_a_source() -> None:
    with pytest.raises(ValueError, match=r"gsm8k"):
        register_scorer("gsm8k")(lambda **kwargs: 0.0)
    assert get_scorer("gsm8k") is gsm8k_score


def test_register_scorer_adds_a_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.reward import registry

    monkeypatch.setattr(registry, "_SCORERS", dict(registry._SCORERS))

    @register_scorer("my/source")
    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    assert "my/source" in known_data_sources()
    assert RewardFunction(RewardConfig()).score("my/source", "x", "y").score == 0.25


# ---------------------------------------------------------------- custom functions

CUSTOM_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth,
            "pred": solution_str, "index": (extra_info or {}).get("index", -1)}

NOT_CALLABLE = 3
"""


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_custom_fn_from_file_scores_every_source_with_verl_dict(tmp_path) -> None:
    path = _write(tmp_path, "my_reward.py", CUSTOM_SOURCE)
    reward = RewardFunction(RewardConfig(custom_fn=f"{path}:compute_score"))
    result = reward.score("some/unregistered", "42", "42", extra_info={"index": 7})
    # Non-numeric "pred" is dropped from extras; bool "acc" becomes a float.
    assert result == RewardResult(score=1.0, extras={"acc": 1.0, "index": 7.0})
    assert reward.score("gsm8k", "41", "42").score == 0.0  # custom fn overrides built-ins
    reward.check_data_sources({"some/unregistered", "another"})


def test_custom_fn_from_module_on_sys_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "myrewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text(CUSTOM_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_custom_fn("myrewards.scoring:compute_score")
    assert fn(data_source="d", solution_str="1", ground_truth="1")["score"] == 1.0


def test_reward_function_pickles_and_reloads_custom_fn_from_file(tmp_path) -> None:
    path = _write(tmp_path, "r.py", "def f(**kw):\n    return 0.5\n")
    reward = pickle.loads(pickle.dumps(RewardFunction(RewardConfig(custom_fn=f"{path}:f"))))
    assert reward.score("x", "y", "z").score == 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "reward.custom_fn='no_colon_here' is invalid"),
        ("file.py:", "reward.custom_fn='file.py:' is invalid"),
        (":fn", "reward.custom_fn=':fn' is invalid"),
        ("/nonexistent/dir/r.py:f", "file not found: /nonexistent/dir/r.py"),
        ("no_such_pkg_xyz.mod:f", "No module named 'no_such_pkg_xyz'"),
    ],
)
def test_custom_fn_errors_name_the_key(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"reward\.custom_fn") as info:
        load_custom_fn(spec)
    assert message in str(info.value)


def test_custom_fn_import_error_carries_original_error(tmp_path) -> None:
    path = _write(tmp_path, "broken.py", "import math\nraise RuntimeError('boom in user code')\n")
    with pytest.raises(ValueError, match=r"reward\.custom_fn") as info:
        load_custom_fn(f"{path}:f")
    assert "RuntimeError: boom in user code" in str(info.value)
    assert path in str(info.value)


def test_custom_fn_missing_attribute_lists_functions(tmp_path) -> None:
    path = _write(tmp_path, "r2.py", CUSTOM_SOURCE)
    with pytest.raises(ValueError, match=r"has no attribute 'compute'") as info:
        load_custom_fn(f"{path}:compute")
    assert "compute_score" in str(info.value)
    assert "reward.custom_fn" in str(info.value)


def test_custom_fn_not_callable_is_an_error(tmp_path) -> None:
    path = _write(tmp_path, "r3.py", CUSTOM_SOURCE)
    with pytest.raises(ValueError, match=r"reward\.custom_fn.*NOT_CALLABLE is a int, not callable"):
        load_custom_fn(f"{path}:NOT_CALLABLE")


def test_reward_config_validates_custom_fn_format() -> None:
    assert RewardConfig().custom_fn is None
    assert RewardConfig(custom_fn="pkg.mod:fn").custom_fn == "pkg.mod:fn"
    with pytest.raises(ConfigError, match=r"reward\.custom_fn='pkg\.mod' is invalid"):
        RewardConfig(custom_fn="pkg.mod")
    with pytest.raises(ConfigError, match=r"reward\.custom_fn"):
        RewardConfig(custom_fn="pkg.mod:not-a-name")


# ---------------------------------------------------------------- result normalisation


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (1, RewardResult(1.0, {})),
        (0.5, RewardResult(0.5, {})),
        (True, RewardResult(1.0, {})),
        ({"score": 0, "acc": False}, RewardResult(0.0, {"acc": 0.0})),
    ],
)
def test_reward_function_normalises_return_values(tmp_path, returned, expected) -> None:
    path = _write(tmp_path, "ret.py", f"def f(**kw):\n    return {returned!r}\n")
    result = RewardFunction(RewardConfig(custom_fn=f"{path}:f")).score("d", "s", "g")
    assert result == expected
    assert type(result.score) is float


@pytest.mark.parametrize("returned", ["'1.0'", "None", "[1.0]", "{'acc': 1.0}"])
def test_reward_function_rejects_other_return_types_naming_the_function(
    tmp_path, returned: str
) -> None:
    path = _write(tmp_path, "bad.py", f"def f(**kw):\n    return {returned}\n")
    reward = RewardFunction(RewardConfig(custom_fn=f"{path}:f"))
    with pytest.raises(TypeError, match=r"reward function reward.custom_fn='.*bad.py:f'"):
        reward.score("d", "s", "g")


def test_reward_function_rejects_nan_score(tmp_path) -> None:
    path = _write(tmp_path, "nan.py", "def f(**kw):\n    return float('nan')\n")
    with pytest.raises(ValueError, match=r"non-finite"):
        RewardFunction(RewardConfig(custom_fn=f"{path}:f")).score("d", "s", "g")


def test_builtin_scoring_goes_through_registry() -> None:
    reward = RewardFunction(RewardConfig())
    assert reward.score("arithmetic", "68", "68") == RewardResult(1.0, {})
    assert reward.score("openai/gsm8k", "#### 7", "8") == RewardResult(0.0, {})
    with pytest.raises(ValueError, match=r"reward\.custom_fn"):
        reward.score("unknown/source", "1", "1")


def test_check_data_sources_fails_on_sources_without_scorer() -> None:
    reward = RewardFunction(RewardConfig())
    reward.check_data_sources({"arithmetic", "gsm8k"})
    with pytest.raises(ValueError, match=r"'a/b', 'c/d'") as info:
        reward.check_data_sources({"arithmetic", "c/d", "a/b"})
    assert "reward.custom_fn" in str(info.value)
