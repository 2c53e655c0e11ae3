"""The peer benchmark (recipe/tools/bench/peers) without a GPU: both systems' commands state the
same terms (ours composed by our real Hydra config, verl's checked against our defaults), the
readers and the one rule that turns each system's log into figures, the harness on real
subprocesses, and bad keys. The runs themselves are GPU runs (docs/results.md)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipe.config import load_config, register_configs
from recipe.tools.bench.e2e import ASYNC
from recipe.tools.bench.peers import __main__ as peers
from recipe.tools.bench.peers import measure, ours, verl
from recipe.tools.bench.peers.data import prepare_peer_data
from recipe.tools.bench.peers.measure import Measured, run_measured
from recipe.tools.bench.peers.result import steady_window, summarize
from recipe.tools.bench.peers.terms import Terms
from tests.helpers.escaping import escaping_command, gone

REPO = Path(__file__).resolve().parents[2]
# Written for these tests, in GSM8K's published shape.
ROWS = [
    {"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
    for i in range(6)
]


def _gsm8k(tmp_path: Path) -> Path:
    """A GSM8K folder (train/test.jsonl of ``ROWS``)."""
    src = tmp_path / "gsm8k"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return src


def _model_and_gsm8k(tmp_path: Path) -> Path:
    """``tmp_path`` made a model folder (a config.json), and a GSM8K folder in it."""
    (tmp_path / "config.json").write_text("{}")
    return _gsm8k(tmp_path)


def _ours_run(monkeypatch: pytest.MonkeyPatch, script: Path) -> None:
    """Our systems run ``script RUN_DIR`` instead of ``python -m recipe``."""
    monkeypatch.setattr(
        ours,
        "our_command",
        lambda terms, mode, run_dir: [sys.executable, str(script), str(run_dir)],
    )


def _terms(tmp_path: Path, **kwargs) -> Terms:
    return Terms(model=tmp_path, train_file=tmp_path / "t", val_file=tmp_path / "v", **kwargs)


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return load_config(compose(config_name="config", overrides=overrides))


@pytest.mark.parametrize("mode", ours.SYSTEMS)
def test_our_command_composes_with_the_shared_terms(tmp_path, mode):
    terms = _terms(tmp_path, prompts=16, n=4, response_length=300, lr=2e-6, steps=7)
    argv = ours.our_command(terms, mode, tmp_path / "run")
    assert argv[1:3] == ["-m", "recipe"]
    cfg = _compose([a for a in argv[3:] if not a.startswith("hydra.")])
    assert cfg.mode == mode
    assert cfg.actor.ppo_mini_batch_size == cfg.data.train_batch_size == 16
    assert (cfg.rollout.n, cfg.rollout.response_length, cfg.actor.lr) == (4, 300, 2e-6)
    assert (cfg.trainer.total_training_steps, cfg.trainer.test_freq) == (7, 0)
    assert not cfg.actor.use_kl_loss and cfg.actor.entropy_coeff == 0.0
    assert cfg.rollout.val_temperature == 0.0 and cfg.model.dtype == "bfloat16"
    if mode == "fully_async":
        assert cfg.async_training.partial_rollout and cfg.async_training.require_batches == 1


def test_on_the_cpu_ours_run_in_float32_with_an_engine_sized_for_the_terms(tmp_path):
    terms = _terms(tmp_path, device="cpu", max_prompt_length=200, response_length=48)
    argv = ours.our_command(terms, "sync", tmp_path / "run")
    cfg = _compose([a for a in argv[3:] if not a.startswith("hydra.")])
    assert (cfg.trainer.device, cfg.model.dtype) == ("cpu", "float32")
    assert cfg.rollout.engine_kwargs["max_model_len"] == 248


def test_verls_settings_are_ours(tmp_path):
    """Every optimizer and loss setting verl is given equals our config's, so a change of
    our defaults cannot leave the two systems training differently unnoticed."""
    terms = _terms(tmp_path, prompts=16, n=4, response_length=300, max_prompt_length=400)
    cfg = _compose([a for a in ours.our_command(terms, "sync", tmp_path)[3:] if "hydra" not in a])
    theirs = verl.verl_overrides(terms)
    actor = "actor_rollout_ref.actor"
    assert theirs[f"{actor}.optim.lr"] == cfg.actor.lr
    assert theirs[f"{actor}.optim.betas"] == "[{},{}]".format(*cfg.actor.betas)
    assert theirs[f"{actor}.optim.weight_decay"] == cfg.actor.weight_decay
    assert theirs[f"{actor}.clip_ratio_low"] == cfg.actor.clip_ratio_low
    assert theirs[f"{actor}.clip_ratio_high"] == cfg.actor.clip_ratio_high
    assert theirs[f"{actor}.grad_clip"] == cfg.actor.grad_clip
    assert theirs[f"{actor}.use_dynamic_bsz"] == cfg.actor.use_dynamic_bsz
    assert theirs[f"{actor}.ppo_max_token_len_per_gpu"] == cfg.actor.ppo_max_token_len_per_gpu
    assert theirs[f"{actor}.ppo_mini_batch_size"] == theirs["data.train_batch_size"] == 16
    assert theirs["actor_rollout_ref.rollout.n"] == cfg.rollout.n
    assert theirs["data.max_response_length"] == cfg.rollout.response_length
    assert theirs["data.max_prompt_length"] == cfg.data.max_prompt_length == 400
    assert cfg.actor.lr_schedule == "constant" and cfg.actor.lr_warmup_steps == 0
    assert theirs["algorithm.adv_estimator"] == cfg.algorithm.adv_estimator == "grpo"


def test_verl_runs_from_its_own_wheels_and_logs_into_the_run_dir(tmp_path):
    argv, env = verl.verl_command(_terms(tmp_path), tmp_path / "run", Path("/opt/verlsite"))
    assert argv[1:4] == ["-u", "-m", "verl.trainer.main_ppo"]
    assert env["PYTHONPATH"].split(":")[:2] == ["/opt/verlsite", str(REPO)]
    assert env["VERL_FILE_LOGGER_PATH"] == str((tmp_path / "run").resolve() / "metrics.jsonl")
    assert "reward.custom_reward_function.path=" + str(REPO) in " ".join(argv)


def test_verls_reward_is_our_scorer():
    from recipe.tools.bench.peers.verl_reward import compute_score

    assert compute_score("openai/gsm8k", "so 12 apples\n#### 12", "12") == 1.0
    assert compute_score("openai/gsm8k", "so 12 apples", "12") == 0.0  # strict, as verl's


def test_peer_data_validates_on_the_first_rows_for_both(tmp_path):
    src = _gsm8k(tmp_path)
    train, val = prepare_peer_data(src, tmp_path / "out", val_rows=4)
    import pyarrow.parquet as pq

    assert pq.read_table(train).num_rows == 6
    rows = pq.read_table(val).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "2", "4", "6"]
    with pytest.raises(ValueError, match="val_rows=9: the test split has 6 rows"):
        prepare_peer_data(src, tmp_path / "other", val_rows=9)
    with pytest.raises(ValueError, match="expected GSM8K"):
        prepare_peer_data(tmp_path / "nothing", tmp_path / "x", val_rows=1)


def test_one_rule_turns_each_log_into_figures(tmp_path):
    run = tmp_path / "verl"
    run.mkdir()
    lines = [
        {"step": k, "data": {"timing_s/step": 2.0, "timing_s/gen": 1.5, "response_length/mean": 10}}
        for k in (1, 2, 3)
    ]
    lines[-1]["data"]["val-core/openai/gsm8k/acc/mean@1"] = 0.25
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    terms = _terms(tmp_path, prompts=2, n=4, steps=3, warmup_steps=1)
    rows, line_of, accuracy = verl.read_verl(run, terms)
    assert (len(rows), line_of, accuracy) == (3, [0, 1, 2], 0.25)
    measured = Measured(0, 20.0, step_end_s=[12.0, 14.5, 16.0], peak_gpu_mib=2048.0)
    result = summarize(
        "verl", measured, rows, line_of_step=line_of, warmup_steps=1, val_accuracy=accuracy
    )
    assert result.startup_s == 10.0  # the first step ended at 12 s and took 2 s
    # steady: step 2 (8 samples, 80 tokens) from the end of step 1 (12 s) to 14.5 s; step 3,
    # the last line, is out: verl validates before writing it
    assert (result.samples_per_s, result.gen_tokens_per_s, result.step_s) == (3.2, 32.0, 2.0)
    assert result.phases_s == {"gen": 1.5} and result.samples == 24


def _verl_async_log(run: Path) -> None:
    """verl_async's file log: a line per weight sync of 2 steps (timings summed, the step
    counter's last value), the rollouter's line, and the validation's line at the end."""
    run.mkdir()
    lines = []
    for sync in (1, 2, 3):
        data = {"timing_s/step": 6.0, "timing_s/update_actor": 2.0, "response_length/mean": 10}
        lines.append({"step": sync, "data": data | {"training/global_step": 2 * sync}})
        lines.append({"step": sync, "data": {"fully_async/rollouter/active_time": 1.0}})
    lines.append({"step": 3, "data": {"val-core/openai/gsm8k/acc/mean@1": 0.5}})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_verl_async_shares_each_sync_line_among_its_steps_and_is_timed_by_whole_lines(tmp_path):
    _verl_async_log(tmp_path / "run")
    terms = _terms(tmp_path, prompts=2, n=4, steps=6, warmup_steps=1)
    rows, line_of, accuracy = verl.read_verl(tmp_path / "run", terms)
    assert (line_of, accuracy) == ([0, 0, 2, 2, 4, 4], 0.5)
    assert rows[0].step_s == 3.0 and rows[0].phases_s == {"update": 1.0} and rows[0].samples == 8
    ends = [0.0] * 7
    ends[0], ends[2], ends[4] = 20.0, 26.0, 33.0
    measured = Measured(0, 40.0, step_end_s=ends)
    result = summarize(
        "verl_async", measured, rows, line_of_step=line_of, warmup_steps=1, val_accuracy=accuracy
    )
    assert result.startup_s == 14.0  # the first line at 20 s ended 2 steps of 3 s each
    # warm-up rounded up to the first line's end (20 s); steady: the second line's 2 steps
    # (16 samples) to 26 s; the third line, the last, is out
    assert (result.samples_per_s, result.step_s, result.steps) == (round(16 / 6, 3), 3.0, 6)


@pytest.mark.parametrize(
    ("lines", "warmup", "window"),
    [
        ([0, 1, 2, 3, 4], 2, (2, 4)),  # a line per step: the last step is out
        ([0, 0, 1, 1, 2, 2, 3, 3], 2, (2, 6)),
        ([0, 0, 1, 1, 2, 2, 3, 3], 3, (4, 6)),  # warm-up ends with its line
        ([0, 1, 2], 0, (0, 2)),
        ([0, 1], 1, (1, 2)),  # too few lines: the last one is kept
        ([0, 0], 2, (0, 2)),  # one line: all of it
    ],
)
def test_the_steady_window_starts_and_ends_with_lines(lines, warmup, window):
    assert steady_window(lines, warmup) == window


def test_verl_async_runs_verls_fully_async_trainer_on_the_trainers_gpu(tmp_path):
    terms = _terms(tmp_path, prompts=16, steps=8)
    argv, _ = verl.verl_command(terms, tmp_path / "run", tmp_path, "verl_async")
    assert argv[3] == "verl.experimental.fully_async_policy.fully_async_main"
    given = dict(a.split("=", 1) for a in argv[4:])
    for key, value in {
        "rollout.nnodes": "0",  # only hybrid: no rollout GPUs of its own
        "async_training.use_dynamic_resource_scheduling": "True",
        "actor_rollout_ref.hybrid_engine": "False",
        "data.train_batch_size": "0",
        "data.gen_batch_size": "1",
        "rollout.total_rollout_steps": "128",  # every prompt once: 8 steps x 16
        "trainer.test_freq": "4",  # a sync every 2 steps: validation at the last one
        "async_training.staleness_threshold": str(ASYNC["staleness_threshold"]),
        "async_training.trigger_parameter_sync_step": str(ASYNC["trigger_parameter_sync_step"]),
        "actor_rollout_ref.actor.ppo_mini_batch_size": "16",
        "actor_rollout_ref.actor.optim.lr": str(terms.lr),
    }.items():
        assert given[key] == value, key
    with pytest.raises(ValueError, match="steps=7: verl_async syncs every 2 steps: a multiple"):
        verl.verl_async_overrides(_terms(tmp_path, steps=7))


def test_our_reader_skips_validation_lines_and_counts_waiting(tmp_path):
    lines = [
        {"step": 1, "timing/step_s": 3.0, "throughput/samples": 8, "trainer/idle_ratio": 0.5},
        {"step": 1, "val/accuracy": 0.4},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows, line_of, accuracy = ours.read_ours(tmp_path)
    assert (line_of, accuracy, rows[0].phases_s) == ([0], 0.4, {"wait": 1.5})


def test_the_harness_times_each_step_line_and_kills_at_the_deadline(tmp_path):
    script = tmp_path / "system.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            with open(sys.argv[1], "w") as f:
                for step in range(3):
                    time.sleep(0.6)
                    print(step, file=f, flush=True)
            time.sleep(float(sys.argv[2]))
            """
        )
    )
    metrics = tmp_path / "m.jsonl"
    done = run_measured(
        [sys.executable, str(script), str(metrics), "0"],
        tmp_path / "a",
        metrics_file=metrics,
        timeout_s=30,
    )
    assert done.returncode == 0 and len(done.step_end_s) == 3
    assert done.step_end_s[0] >= 0.6 and done.step_end_s[2] - done.step_end_s[0] >= 1.0
    hung = run_measured(
        [sys.executable, str(script), str(metrics), "60"],
        tmp_path / "b",
        metrics_file=metrics,
        timeout_s=3,
    )
    assert hung.returncode is None and hung.wall_s < 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus=1"], "'bogus=1': unknown key; known ["),
        (["bogus"], "'bogus': expected key=value"),
        (["systems=verl,trl"], "systems=verl,trl: unknown ['trl']"),
        ([], "model= is required"),
        (["model={tmp}", "warmup_steps=5", "steps=5"], "warmup_steps=5: must be in [0, steps)"),
        (["model={tmp}", "device=cpu"], "systems=verl,verl_async needs device=cuda"),
        (["model={tmp}", "systems=verl_async", "steps=5", "warmup_steps=1"], "steps=5: verl_async"),
        (["model={tmp}", "systems=sync", "device=tpu"], "device=tpu: must be one of cuda, cpu"),
    ],
)
def test_bad_keys_exit_2_with_one_line(tmp_path, capsys, args, message):
    src = _model_and_gsm8k(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in args] + [
        f"data={src}",
        f"out={tmp_path / 'o'}",
        "val_rows=2",
    ]
    with pytest.raises(SystemExit) as exit_info:
        peers.parse(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


FAKE_SYSTEM = """
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
if (run / "ran").exists():
    sys.exit("ran twice")
(run / "ran").touch()
with open(run / "metrics.jsonl", "w") as f:
    for step in (1, 2, 3):
        print(json.dumps({"step": step, "timing/step_s": 0.1, "throughput/samples": 8}), file=f)
(run / "summary.json").write_text(json.dumps({"final/val_accuracy": 0.5}))
"""


def test_a_system_with_a_result_is_not_run_again_and_the_table_has_it(
    tmp_path, monkeypatch, capsys
):
    script = tmp_path / "fake_system.py"
    script.write_text(FAKE_SYSTEM)
    _ours_run(monkeypatch, script)
    src = _model_and_gsm8k(tmp_path)
    argv = [f"model={tmp_path}", f"data={src}", f"out={tmp_path / 'o'}", "val_rows=2", "steps=3"]
    assert peers.main([*argv, "systems=sync"]) == 0
    assert peers.main([*argv, "systems=sync"]) == 0  # kept: the fake would fail a second run
    kept = json.loads((tmp_path / "o" / "sync" / "result.json").read_text())
    assert (kept["steps"], kept["samples"], kept["val_accuracy"]) == (3, 24, 0.5)
    report = json.loads((tmp_path / "o" / "peers.json").read_text())
    assert [r["system"] for r in report["results"]] == ["sync"] and report["ratios"] == {}
    assert "sync" in capsys.readouterr().out


def test_ratios_are_ours_to_verl_and_fully_async_to_sync_among_the_finished():
    from recipe.tools.bench.peers.report import ratios
    from recipe.tools.bench.peers.result import SystemResult

    def result(system: str, rate: float, failed: str | None = None) -> SystemResult:
        return SystemResult(system, failed, samples_per_s=rate, startup_s=100.0)

    all_three = ratios([result("verl", 10.0), result("sync", 20.0), result("fully_async", 30.0)])
    assert all_three["sync_over_verl samples_per_s"] == 2.0
    assert all_three["fully_async_over_verl samples_per_s"] == 3.0
    assert all_three["fully_async_over_sync samples_per_s"] == 1.5
    assert all_three["sync_over_verl startup_s"] == 1.0
    assert "verl_over_sync samples_per_s" not in all_three
    failed_verl = ratios(
        [result("verl", 0.0, "exit 1"), result("sync", 2), result("fully_async", 3)]
    )
    assert list(failed_verl) == [
        "fully_async_over_sync samples_per_s",
        "fully_async_over_sync startup_s",
    ]


def test_a_verl_variant_replaces_the_benchmarks_value_of_its_key(tmp_path):
    src = _model_and_gsm8k(tmp_path)
    terms, _ = peers.parse(
        [
            f"model={tmp_path}",
            f"data={src}",
            f"out={tmp_path / 'o'}",
            "val_rows=2",
            "verl:actor_rollout_ref.model.use_remove_padding=True",
            "verl:trainer.use_v1=False",
        ]
    )
    argv, _ = verl.verl_command(terms, tmp_path / "run", tmp_path)
    padding = [a for a in argv if a.startswith("actor_rollout_ref.model.use_remove_padding=")]
    assert padding == ["actor_rollout_ref.model.use_remove_padding=True"]
    assert "trainer.use_v1=False" in argv
    assert terms.describe()["verl_extra"] == [
        "actor_rollout_ref.model.use_remove_padding=True",
        "trainer.use_v1=False",
    ]
    with pytest.raises(SystemExit):
        peers.parse([f"model={tmp_path}", f"data={src}", "train_file=x"])


CUT_SYSTEM = """
import json, sys, time
from pathlib import Path
run = Path(sys.argv[1])
with open(run / "metrics.jsonl", "w") as f:
    for step in (1, 2, 3):
        time.sleep(0.6)
        print(json.dumps({"step": step, "timing/step_s": 0.5, "throughput/samples": 8}), file=f)
        f.flush()
    f.write('{"step": 4, "timing/st')  # the line it was writing when the deadline came
    f.flush()
    time.sleep(60)
"""


def test_a_run_cut_at_its_deadline_keeps_the_steps_it_finished_in_no_ratio(
    tmp_path, monkeypatch, capsys
):
    script = tmp_path / "cut_system.py"
    script.write_text(CUT_SYSTEM)
    _ours_run(monkeypatch, script)
    src = _model_and_gsm8k(tmp_path)
    argv = [f"model={tmp_path}", f"data={src}", f"out={tmp_path / 'o'}", "val_rows=2"]
    argv += ["steps=5", "warmup_steps=1", "timeout_s=4", "systems=sync"]
    assert peers.main(argv) == 1
    run_dir = tmp_path / "o" / "sync"
    assert not (run_dir / "result.json").exists()  # run again next time
    cut = json.loads((run_dir / "partial.json").read_text())
    assert (cut["steps"], cut["samples"], cut["val_accuracy"]) == (3, 24, None)
    assert cut["samples_per_s"] is not None
    assert cut["failed"].startswith("past timeout_s=4 after 3 of 5 steps")
    report = json.loads((tmp_path / "o" / "peers.json").read_text())
    assert [r["system"] for r in report["results"]] == ["sync"] and report["ratios"] == {}
    out = capsys.readouterr().out
    assert "sync (cut)" in out and "sync: FAILED (past timeout_s=4 after 3 of 5" in out


def test_a_deadline_kills_the_processes_a_run_started_in_sessions_of_their_own(tmp_path):
    command, pid_file = escaping_command(tmp_path)
    measured = run_measured(
        command, tmp_path / "run", metrics_file=tmp_path / "m.jsonl", timeout_s=3
    )
    assert measured.returncode is None
    assert gone(int(pid_file.read_text())), "the child escaped the deadline"


def test_the_next_baseline_waits_for_the_gpu_memory_a_run_leaves_to_be_freed(monkeypatch):
    readings = iter([30_000.0, 20_000.0, 1_500.0])
    monkeypatch.setattr(measure, "gpu_used_mib", lambda: next(readings))
    monkeypatch.setattr(measure, "POLL_S", 0.01)
    assert measure.settle_gpu(1_000.0) is None  # 1,500 is within the slack
    monkeypatch.setattr(measure, "gpu_used_mib", lambda: 9_000.0)
    monkeypatch.setattr(measure, "SETTLE_S", 0.05)
    assert measure.settle_gpu(1_000.0) == 8_000.0
