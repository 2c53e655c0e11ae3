"""Unit tests of reasoning-gym as a prompt source (``data.source=reasoning_gym``) and of its
scorer in the reward registry. Skipped where reasoning-gym is not installed."""

from __future__ import annotations

import json
import logging
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip(
    "reasoning_gym", reason="reasoning-gym not installed: pip install 'fully-async-rl[reasoning]'"
)

from hydra import compose, initialize_config_dir
from reasoning_gym import create_dataset
from reasoning_gym.utils import SYSTEM_PROMPTS

from recipe.config import load_config, register_configs
from recipe.data import reasoning_gym_entries
from recipe.data.config import DataConfig
from recipe.data.dataset import build_datasets
from recipe.data.loaders import DataError, load_records
from recipe.data.prompts import encode_prompts, render_prompt
from recipe.data.reasoning_gym import (
    ReasoningGymConfig,
    drop_train_questions,
    make_reasoning_gym_records,
    question_of,
)
from recipe.protocol import PromptRecord
from recipe.reward import RewardConfig, RewardFunction, get_scorer
from recipe.reward.reasoning_gym import reasoning_gym_score
from recipe.utils.config_check import ConfigError

REPO = Path(__file__).resolve().parents[2]
# Two-term one-digit sums: a problem space of a few hundred questions, so sets repeat some.
SMALL_SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


@pytest.fixture(autouse=True)
def generate_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entries of these tests' tasks (chain_sum, letter_counting) do not follow the hash
    seed, so they are generated here rather than in a child process (~1 s each);
    test_reasoning_gym_hash_seed.py tests the child."""
    monkeypatch.setattr(reasoning_gym_entries, "hash_seed_is_pinned", lambda: True)


def chain_sum(**changes) -> ReasoningGymConfig:
    return ReasoningGymConfig(**{"dataset": "chain_sum", "config": dict(SMALL_SUMS), **changes})


def data_config(rg: ReasoningGymConfig, *, num_train: int = 40, num_val: int = 10) -> DataConfig:
    return DataConfig(
        source="reasoning_gym",
        num_train_prompts=num_train,
        num_val_prompts=num_val,
        reasoning_gym=rg,
    )


def tagged(answer: str) -> str:
    return f"Let me add.\n<answer>{answer}</answer>"


# ---------------------------------------------------------------- records


@pytest.mark.parametrize("dataset", ["chain_sum", "letter_counting"])
def test_records_carry_the_entry_the_default_system_prompt_and_a_task_uid(dataset: str) -> None:
    cfg = ReasoningGymConfig(dataset=dataset, seed=7)
    records = make_reasoning_gym_records(cfg, split="train", num=3)
    entries = [create_dataset(dataset, seed=7, size=3)[i] for i in range(3)]
    for index, (record, entry) in enumerate(zip(records, entries, strict=True)):
        assert record.uid == f"train:reasoning_gym/{dataset}:{index}"
        assert record.data_source == "reasoning_gym"
        assert record.prompt == [
            {"role": "system", "content": SYSTEM_PROMPTS["default"]},
            {"role": "user", "content": entry["question"]},
        ]
        assert record.ground_truth == entry["answer"]
        assert record.extra_info == {
            "dataset": dataset,
            "config": {"seed": 7, "size": 3},
            "index": index,
            "entry": entry,
        }
        # Ray pickles records to the rollouters; JSON and parquet must be able to hold them too.
        assert pickle.loads(pickle.dumps(record)) == record
        json.dumps(record.extra_info)
    pa.Table.from_pylist([{"extra_info": r.extra_info} for r in records])


def test_system_prompt_presets_text_placement_and_none() -> None:
    question = make_reasoning_gym_records(chain_sum(), split="train", num=1)[0].prompt[1]["content"]

    def prompt(**changes) -> list[dict[str, str]]:
        return make_reasoning_gym_records(chain_sum(**changes), split="train", num=1)[0].prompt

    direct = SYSTEM_PROMPTS["direct"]
    assert prompt(system_prompt="direct")[0] == {"role": "system", "content": direct}
    assert prompt(system_prompt="Answer in <answer> tags.")[0]["content"] == (
        "Answer in <answer> tags."
    )
    assert prompt(system_prompt="direct", system_prompt_in_user=True) == [
        {"role": "user", "content": f"{direct}\n\n{question}"}
    ]
    assert prompt(system_prompt="") == [{"role": "user", "content": question}]


def test_few_shot_examples_come_before_the_question_as_tagged_answers() -> None:
    cfg = chain_sum(few_shot=2, system_prompt="direct", val_seed=500)
    train = make_reasoning_gym_records(cfg, split="train", num=3)
    val = make_reasoning_gym_records(cfg, split="val", num=3)
    shots = create_dataset("chain_sum", **SMALL_SUMS, seed=498, size=2)  # val_seed - few_shot
    expected = []
    for entry in shots:
        expected += [
            {"role": "user", "content": entry["question"]},
            {"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"},
        ]
    for record in train + val:
        assert record.prompt[0] == {"role": "system", "content": SYSTEM_PROMPTS["direct"]}
        assert record.prompt[1:5] == expected  # the same examples for every prompt
        assert record.prompt[5] == {"role": "user", "content": question_of(record)}
    in_user = make_reasoning_gym_records(
        chain_sum(few_shot=1, system_prompt="direct", system_prompt_in_user=True),
        split="train",
        num=1,
    )[0].prompt
    assert [m["role"] for m in in_user] == ["user", "assistant", "user"]
    assert in_user[0]["content"].startswith(SYSTEM_PROMPTS["direct"])


def test_uids_name_the_same_prompts_across_builds_and_set_sizes() -> None:
    first = make_reasoning_gym_records(chain_sum(), split="train", num=20)
    again = make_reasoning_gym_records(chain_sum(), split="train", num=30)

    # A restart regenerates the same set, and a larger set keeps the smaller one's prompts.
    def view(r: PromptRecord) -> tuple:
        return r.uid, r.prompt, r.ground_truth, r.extra_info["entry"]

    assert [view(r) for r in make_reasoning_gym_records(chain_sum(), split="train", num=20)] == [
        view(r) for r in first
    ]
    assert [view(r) for r in again[:20]] == [view(r) for r in first]
    assert len({r.uid for r in again}) == 30


# ---------------------------------------------------------------- train / val overlap


def test_seeds_closer_than_the_set_size_give_the_same_entries_shifted() -> None:
    # Why the config refuses overlapping seed ranges: entry i of seed s is Random(s + i)'s.
    train = make_reasoning_gym_records(chain_sum(seed=1), split="train", num=5)
    shifted = make_reasoning_gym_records(chain_sum(seed=2), split="train", num=4)
    assert [(r.prompt, r.ground_truth) for r in shifted] == [
        (r.prompt, r.ground_truth) for r in train[1:]
    ]


def test_val_drops_train_questions_counted_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="recipe.data.reasoning_gym"):
        train, val = build_datasets(data_config(chain_sum(), num_train=300, num_val=50))
    train_questions = {r.extra_info["entry"]["question"] for r in train}
    assert len(train) == 300
    assert val and not any(r.extra_info["entry"]["question"] in train_questions for r in val)
    num_dropped = 50 - len(val)
    assert num_dropped > 0, "the small problem space should repeat some questions"
    assert f"dropped {num_dropped} of 50 val prompts" in caplog.text
    # Dropped prompts leave gaps: every kept uid still names its entry's index.
    assert all(r.uid == f"val:reasoning_gym/chain_sum:{r.extra_info['index']}" for r in val)


def test_a_val_set_made_only_of_train_questions_is_an_error() -> None:
    train = make_reasoning_gym_records(chain_sum(), split="train", num=10)
    with pytest.raises(DataError, match=r"every one of the 3 val prompts is also a train prompt"):
        drop_train_questions(train[:3], train)


def test_val_files_replace_the_generated_val_set(tmp_path: Path) -> None:
    row = {"data_source": "arithmetic", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    path = tmp_path / "val.jsonl"
    path.write_text(json.dumps(row) + "\n")
    cfg = data_config(chain_sum())
    cfg.val_files = [str(path)]
    train, val = build_datasets(cfg)
    assert len(train) == 40 and [r.uid for r in val] == ["val:val.jsonl:0"]


# ---------------------------------------------------------------- scoring


@pytest.fixture
def record() -> PromptRecord:
    return make_reasoning_gym_records(chain_sum(), split="val", num=1)[0]


def score(record: PromptRecord, response: str) -> float:
    return reasoning_gym_score(record.data_source, response, record.ground_truth, record.extra_info)


def test_scorer_is_registered_for_the_data_source() -> None:
    assert get_scorer("reasoning_gym") is reasoning_gym_score
    RewardFunction(RewardConfig()).check_data_sources({"reasoning_gym"})


def test_right_answer_scores_1_wrong_0_and_no_answer_tag_0(record: PromptRecord) -> None:
    right = record.ground_truth
    assert score(record, tagged(right)) == 1.0
    assert score(record, tagged(str(int(right) + 1))) == 0.0
    assert score(record, f"The answer is {right}.") == 0.0
    # The last tag counts, as in reasoning-gym's own evaluation.
    assert score(record, tagged("0") + tagged(right)) == 1.0
    result = RewardFunction(RewardConfig()).score(
        record.data_source, tagged(right), record.ground_truth, record.extra_info
    )
    assert result.score == 1.0


def test_scores_are_the_tasks_own_including_partial_credit() -> None:
    record = make_reasoning_gym_records(
        ReasoningGymConfig(dataset="letter_counting"), split="train", num=1
    )[0]
    entry = record.extra_info["entry"]
    task = create_dataset("letter_counting", **record.extra_info["config"])
    for answer in (entry["answer"], f"{entry['answer']} x", "none"):
        assert score(record, tagged(answer)) == task.score_answer(answer, entry)
    assert 0.0 < score(record, tagged(f"{entry['answer']} x")) < 1.0


def test_scorer_names_the_missing_extra_info_keys(record: PromptRecord) -> None:
    with pytest.raises(ValueError, match=r"needs extra_info keys .*missing: config, index, entry"):
        reasoning_gym_score("reasoning_gym", tagged("1"), "1", {"dataset": "chain_sum"})


# ---------------------------------------------------------------- the prompt path


def chat_tokenizer():
    """A word-level tokenizer (unknown words -> [UNK]) with a chat template that keeps roles."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    roles = ["<|system|>", "<|user|>", "<|assistant|>"]
    backend = Tokenizer(WordLevel({"[UNK]": 0, "<": 1, "answer": 2, ">": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    backend.add_special_tokens(roles)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return tokenizer


@pytest.mark.model  # builds a transformers tokenizer
def test_records_take_the_prompt_path_of_file_records(tmp_path: Path) -> None:
    records = make_reasoning_gym_records(chain_sum(), split="train", num=3)
    path = tmp_path / "rg.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"data_source": r.data_source, "prompt": r.prompt,
                 "reward_model": {"ground_truth": r.ground_truth}}
            ) + "\n"
            for r in records
        )
    )  # fmt: skip
    from_file = load_records([str(path)], split="train")
    tokenizer = chat_tokenizer()
    rendered = render_prompt(tokenizer, records[0].prompt)
    assert rendered.startswith("<|system|> Given a problem") and "<answer>" in rendered
    assert encode_prompts(tokenizer, records, max_prompt_length=4096) == encode_prompts(
        tokenizer, from_file, max_prompt_length=4096
    )
    with pytest.raises(DataError, match=r"prompt train:reasoning_gym/chain_sum:0 has \d+ tokens"):
        encode_prompts(tokenizer, records, max_prompt_length=5)


# ---------------------------------------------------------------- config errors

CONFIG_ERRORS = [
    ({"dataset": ""}, "data.reasoning_gym.dataset='' is invalid"),
    ({"dataset": "chain_sun"}, "not a reasoning-gym task; did you mean chain_sum"),
    ({"dataset": "composite"}, "data.reasoning_gym.dataset='composite' is invalid"),
    ({"config": {"max_term": 3}}, "data.reasoning_gym.config.max_term is invalid: chain_sum has"),
    ({"config": {"min_terms": 5, "max_terms": 2}}, "is invalid for chain_sum: max_terms must be"),
    ({"config": {"seed": 3}}, "data.reasoning_gym.config.seed is invalid"),
    ({"config": {"size": 3}}, "data.reasoning_gym.config.size is invalid"),
    ({"val_seed": 30}, "data.reasoning_gym.val_seed=30 is invalid"),
    ({"seed": 1_000_000_000 - 10}, "data.reasoning_gym.val_seed=1000000000 is invalid"),
    ({"system_prompt": "drect"}, "data.reasoning_gym.system_prompt='drect' is invalid"),
    ({"few_shot": 17}, "data.reasoning_gym.few_shot=17 is invalid"),
    # the examples sit just before val_seed: here on the train set's last entries
    ({"seed": 1_000_000_000 - 45, "few_shot": 8}, "data.reasoning_gym.val_seed=1000000000"),
]


@pytest.mark.parametrize(("changes", "message"), CONFIG_ERRORS)
def test_bad_config_fails_with_one_line_naming_the_key(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        data_config(ReasoningGymConfig(**{"dataset": "chain_sum", **changes}))
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ModuleNotFound
    with pytest.raises(ConfigError, match=r"pip install 'fully-async-rl\[reasoning\]'$"):
        data_config(chain_sum())


def test_command_line_overrides_compose_into_the_config() -> None:
    register_configs()
    overrides = [
        "data.source=reasoning_gym",
        "data.reasoning_gym.dataset=chain_sum",
        "+data.reasoning_gym.config={min_terms: 2, max_terms: 3}",
        "data.reasoning_gym.system_prompt=direct",
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = load_config(compose(config_name="config", overrides=overrides)).data
    assert cfg.resolved_source == "reasoning_gym"
    assert cfg.reasoning_gym.config == {"min_terms": 2, "max_terms": 3}


def test_cli_unknown_task_exits_2_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recipe", "data.source=reasoning_gym",
         "data.reasoning_gym.dataset=chain_sun", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.reasoning_gym.dataset='chain_sun'" in errors[0]
