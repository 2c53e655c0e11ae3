"""observability/tracking.py: config validation, sinks' files and output, the accumulator."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from recipe.observability import backends as tracking_backends
from recipe.observability.backends import Backend, make_backend
from recipe.observability.config import LoggerConfig, WandbConfig
from recipe.observability.tracking import MetricsAccumulator, Tracker, validate_metric_key
from recipe.protocol import Trajectory
from recipe.run.metrics import CLIP_WARN_RATIO, clip_warning, response_clip_ratio, sample_metrics


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _jsonl_tracker(run_dir: Path) -> Tracker:
    return Tracker(LoggerConfig(backends=["jsonl"]), run_dir)


# --- config -------------------------------------------------------------------------------


def test_default_config_logs_to_console_and_jsonl_with_wandb_offline():
    cfg = LoggerConfig()
    assert cfg.backends == ["console", "jsonl"]
    assert cfg.wandb.mode == "offline"
    assert cfg.console_every == 10  # a line per step drowned the step bar


def test_unknown_backend_error_names_logger_backends_and_the_allowed_names():
    with pytest.raises(ValueError, match=r"logger\.backends.*'mlflow'.*tensorboard"):
        LoggerConfig(backends=["jsonl", "mlflow"])


def test_backends_given_as_a_string_instead_of_a_list_is_rejected():
    with pytest.raises(ValueError, match=r"logger\.backends"):
        LoggerConfig(backends="jsonl")


def test_duplicate_backend_is_rejected():
    with pytest.raises(ValueError, match=r"logger\.backends.*at most once"):
        LoggerConfig(backends=["jsonl", "jsonl"])


def test_bad_wandb_mode_and_console_every_name_their_keys():
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode"):
        WandbConfig(mode="cloud")
    with pytest.raises(ValueError, match=r"logger\.console_every"):
        LoggerConfig(console_every=0)


def test_factory_rejects_unknown_backend_naming_logger_backends(tmp_path):
    with pytest.raises(ValueError, match=r"logger\.backends.*'nope'"):
        make_backend("nope", LoggerConfig(), tmp_path)


# --- keys and values ------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["reward/mean", "val/arithmetic/accuracy", "reward/pass@8"])
def test_slash_namespaced_keys_are_accepted(key):
    assert validate_metric_key(key) == key


@pytest.mark.parametrize("key", ["loss", "/loss", "actor/", "actor//loss", "actor/pg loss", ""])
def test_keys_without_a_section_or_with_empty_parts_are_rejected(key):
    with pytest.raises(ValueError, match="slash-namespaced"):
        validate_metric_key(key)


def test_tracker_rejects_a_bad_key_before_writing_anything(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker, pytest.raises(ValueError, match="'loss'"):
        tracker.log({"actor/pg_loss": 1.0, "loss": 2.0}, step=0)
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_tracker_rejects_non_numeric_values_and_bad_steps(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker:
        with pytest.raises(TypeError, match="'reward/mean'"):
            tracker.log({"reward/mean": "high"}, step=0)
        with pytest.raises(ValueError, match="step"):
            tracker.log({"reward/mean": 1.0}, step=-1)


# --- jsonl ----------------------------------------------------------------------------------


def test_jsonl_writes_one_object_per_step_with_step_first_and_float_values(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.5, "queue/size": 3}, step=1)
        tracker.log({"reward/mean": 0.75}, step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert list(json.loads(lines[0])) == ["step", "reward/mean", "queue/size"]
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [
        {"step": 1, "reward/mean": 0.5, "queue/size": 3.0},
        {"step": 2, "reward/mean": 0.75},
    ]
    assert isinstance(json.loads(lines[0])["queue/size"], float)


def test_jsonl_writes_non_finite_values_as_strings_a_reader_sees(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log(
            {"actor/pg_loss": math.nan, "actor/grad_norm": math.inf, "x/low": -math.inf}, step=0
        )
    text = (tmp_path / "metrics.jsonl").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}: not strict JSON"))
    [record] = _read_jsonl(tmp_path / "metrics.jsonl")
    assert record == {
        "step": 0, "actor/pg_loss": "NaN", "actor/grad_norm": "Infinity", "x/low": "-Infinity"
    }  # fmt: skip
    assert math.isnan(float(record["actor/pg_loss"])) and float(record["x/low"]) == -math.inf


def test_jsonl_line_is_on_disk_before_close(tmp_path):
    tracker = _jsonl_tracker(tmp_path)
    tracker.log({"reward/mean": 1.0}, step=0)
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 0, "reward/mean": 1.0}]
    tracker.close()


def test_jsonl_appends_when_the_run_dir_is_reopened(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.1}, step=0)
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.2}, step=1)
    assert [r["step"] for r in _read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]


def test_jsonl_starts_a_fresh_line_after_a_record_cut_by_a_crash(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "rew')
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log({"reward/mean": 0.2}, step=1)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {"step": 1, "reward/mean": 0.2}


# --- summary --------------------------------------------------------------------------------


def test_summary_json_is_merged_across_calls_with_nan_written_as_a_string(tmp_path):
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log_summary({"val/accuracy": 0.5, "run/steps": 10})
        tracker.log_summary({"val/accuracy": 0.75, "actor/pg_loss": math.nan})
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "val/accuracy": 0.75,
        "run/steps": 10,
        "actor/pg_loss": "NaN",
    }


def test_summary_json_is_replaced_atomically_and_keeps_the_old_file_on_failure(
    tmp_path, monkeypatch
):
    with _jsonl_tracker(tmp_path) as tracker:
        tracker.log_summary({"val/accuracy": 0.5})
        replaced: list[tuple[str, str]] = []
        real_replace = os.replace

        def failing_replace(src, dst):
            replaced.append((str(src), str(dst)))
            raise OSError("disk full")

        monkeypatch.setattr(os, "replace", failing_replace)
        with pytest.raises(OSError, match="disk full"):
            tracker.log_summary({"val/accuracy": 0.9})
        monkeypatch.setattr(os, "replace", real_replace)
    src, dst = replaced[0]
    assert Path(src).parent == tmp_path and dst == str(tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text()) == {"val/accuracy": 0.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]


# --- console --------------------------------------------------------------------------------


def test_console_line_shows_step_headline_keys_and_count_of_others(tmp_path, capsys):
    cfg = LoggerConfig(backends=["console"], console_every=1)
    with Tracker(cfg, tmp_path) as tracker:
        metrics = {"reward/mean": 0.5, "timing/step_s": 1.25, "queue/size": 2, "sync/time_s": 0.1}
        tracker.log(metrics, step=7)
    out = capsys.readouterr().out
    assert out.strip() == "step 7 | reward/mean 0.5 | timing/step_s 1.25 | +2 more"


def test_console_quiet_mode_prints_nothing(tmp_path, capsys):
    cfg = LoggerConfig(backends=["console", "jsonl"], quiet=True)
    with Tracker(cfg, tmp_path) as tracker:
        for step in range(3):
            tracker.log({"reward/mean": 0.5, "val/accuracy": 0.25}, step=step)
        tracker.log_summary({"val/accuracy": 0.25})
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert len(_read_jsonl(tmp_path / "metrics.jsonl")) == 3


def test_console_prints_only_every_nth_step(tmp_path, capsys):
    with Tracker(LoggerConfig(backends=["console"], console_every=2), tmp_path) as tracker:
        for step in range(1, 6):
            tracker.log({"reward/mean": 0.5}, step=step)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 2", "step 4"]


def test_console_summary_prints_a_table_of_values(tmp_path, capsys):
    with Tracker(LoggerConfig(backends=["console"]), tmp_path) as tracker:
        tracker.log_summary({"val/accuracy": 0.875})
    out = capsys.readouterr().out
    assert "summary" in out and "val/accuracy" in out and "0.875" in out


# --- tensorboard ----------------------------------------------------------------------------


def test_tensorboard_event_file_holds_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Tracker(LoggerConfig(backends=["tensorboard"]), tmp_path) as tracker:
        tracker.log({"reward/mean": 0.25, "actor/pg_loss": -1.5}, step=3)
        tracker.log({"reward/mean": 0.5}, step=4)
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rewards = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert rewards == [(3, 0.25), (4, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(3, -1.5)]


# --- lifecycle ------------------------------------------------------------------------------


class _RecordingBackend(Backend):
    def __init__(self, fail_on_close: bool = False) -> None:
        self.closed = 0
        self.fail_on_close = fail_on_close

    def log(self, metrics, step):
        pass

    def close(self):
        self.closed += 1
        if self.fail_on_close:
            raise RuntimeError("close failed")


def test_close_is_idempotent_and_log_after_close_raises(tmp_path, monkeypatch):
    fake = _RecordingBackend()
    monkeypatch.setitem(tracking_backends.BACKEND_FACTORIES, "console", lambda *a: fake)
    tracker = Tracker(LoggerConfig(backends=["console"]), tmp_path)
    tracker.close()
    tracker.close()
    assert fake.closed == 1
    with pytest.raises(RuntimeError, match="after close"):
        tracker.log({"reward/mean": 1.0}, step=0)


def test_close_closes_every_backend_even_if_one_fails(tmp_path, monkeypatch):
    failing, healthy = _RecordingBackend(fail_on_close=True), _RecordingBackend()
    monkeypatch.setitem(tracking_backends.BACKEND_FACTORIES, "console", lambda *a: failing)
    monkeypatch.setitem(tracking_backends.BACKEND_FACTORIES, "jsonl", lambda *a: healthy)
    tracker = Tracker(LoggerConfig(backends=["console", "jsonl"]), tmp_path)
    with pytest.raises(RuntimeError, match="close failed"):
        tracker.close()
    assert (failing.closed, healthy.closed) == (1, 1)


def test_backends_built_before_a_failing_one_are_closed(tmp_path, monkeypatch):
    built = _RecordingBackend()

    def broken(*args):
        raise ImportError("no tensorboard")

    monkeypatch.setitem(tracking_backends.BACKEND_FACTORIES, "jsonl", lambda *a: built)
    monkeypatch.setitem(tracking_backends.BACKEND_FACTORIES, "tensorboard", broken)
    with pytest.raises(ImportError, match="no tensorboard"):
        Tracker(LoggerConfig(backends=["jsonl", "tensorboard"]), tmp_path)
    assert built.closed == 1


# --- accumulator ----------------------------------------------------------------------------


def test_accumulator_weighted_mean():
    acc = MetricsAccumulator()
    acc.add("staleness/mean", 1.0, weight=3.0)
    acc.add("staleness/mean", 2.0, weight=1.0)
    acc.add("reward/mean", 0.0)
    acc.add("reward/mean", 1.0)
    assert acc.reduce() == {"staleness/mean": pytest.approx(1.25), "reward/mean": 0.5}


def test_accumulator_sum_max_min_last():
    acc = MetricsAccumulator()
    for value in (3.0, -1.0, 2.0):
        acc.add("queue/num_dropped", value, reduce="sum")
        acc.add("staleness/max", value, reduce="max")
        acc.add("staleness/min", value, reduce="min")
        acc.add("trainer/param_version", value, reduce="last")
    assert acc.reduce() == {
        "queue/num_dropped": 4.0,
        "staleness/max": 3.0,
        "staleness/min": -1.0,
        "trainer/param_version": 2.0,
    }


def test_accumulator_mean_with_only_zero_weights_is_nan_and_ignores_their_values():
    acc = MetricsAccumulator()
    acc.add("mismatch/kl", math.nan, weight=0.0)
    assert math.isnan(acc.reduce()["mismatch/kl"])
    acc.add("mismatch/kl", 0.5, weight=2.0)
    assert acc.reduce() == {"mismatch/kl": 0.5}


def test_accumulator_extend_merges_each_kind_and_later_last_wins():
    first, second = MetricsAccumulator(), MetricsAccumulator()
    first.add("reward/mean", 1.0, weight=1.0)
    first.add("staleness/max", 5.0, reduce="max")
    first.add("trainer/param_version", 1.0, reduce="last")
    second.add("reward/mean", 0.0, weight=3.0)
    second.add("staleness/max", 2.0, reduce="max")
    second.add("trainer/param_version", 2.0, reduce="last")
    second.add("partial/num_resumed", 4.0, reduce="sum")
    first.extend(second)
    assert first.reduce() == {
        "reward/mean": 0.25,
        "staleness/max": 5.0,
        "trainer/param_version": 2.0,
        "partial/num_resumed": 4.0,
    }
    assert second.reduce()["reward/mean"] == 0.0


def test_accumulator_rejects_mixed_reduce_kinds_for_one_key():
    acc = MetricsAccumulator()
    acc.add("staleness/mean", 1.0)
    with pytest.raises(ValueError, match=r"'staleness/mean'.*'max'"):
        acc.add("staleness/mean", 2.0, reduce="max")
    other = MetricsAccumulator()
    other.add("reward/mean", 1.0)
    other.add("staleness/mean", 1.0, reduce="sum")
    with pytest.raises(ValueError, match="'staleness/mean'"):
        acc.extend(other)
    assert acc.reduce() == {"staleness/mean": 1.0}


def test_accumulator_max_and_min_keep_a_nan_whatever_the_order():
    for values in ([math.nan, 1.0], [1.0, math.nan]):
        acc = MetricsAccumulator()
        for value in values:
            acc.add("actor/grad_norm_max", value, reduce="max")
            acc.add("actor/grad_norm_min", value, reduce="min")
        assert all(math.isnan(v) for v in acc.reduce().values())


def test_accumulator_rejects_bad_key_reduce_and_weight():
    acc = MetricsAccumulator()
    with pytest.raises(ValueError, match="slash-namespaced"):
        acc.add("reward", 1.0)
    with pytest.raises(ValueError, match="reduce='median'"):
        acc.add("reward/mean", 1.0, reduce="median")
    with pytest.raises(ValueError, match="only to reduce='mean'"):
        acc.add("queue/size", 1.0, weight=2.0, reduce="sum")
    with pytest.raises(ValueError, match=">= 0"):
        acc.add("reward/mean", 1.0, weight=-1.0)
    assert len(acc) == 0


def test_timer_adds_elapsed_seconds_and_sums_repeated_blocks():
    acc = MetricsAccumulator()
    for _ in range(2):
        with acc.timer("timing/gen_s"):
            time.sleep(0.02)
    elapsed_s = acc.reduce()["timing/gen_s"]
    assert 0.04 <= elapsed_s < 1.0


def test_timer_records_even_when_the_block_raises_and_needs_a_seconds_key():
    acc = MetricsAccumulator()
    with pytest.raises(KeyError), acc.timer("timing/update_s"):
        raise KeyError("boom")
    assert "timing/update_s" in acc.reduce()
    with pytest.raises(ValueError, match="'_s'"), acc.timer("timing/update"):
        pass


# --- responses cut off at rollout.response_length (validation) ------------------------------


def _traj(finish_reason: str) -> Trajectory:
    return Trajectory("p0", 0, [1, 2], [3, 4], [-0.5, -0.5], [0, 0], finish_reason)


def test_clip_ratio_is_the_fraction_of_responses_that_hit_the_length_limit():
    trajs = [_traj("length")] * 3 + [_traj("stop")] * 6 + [_traj("aborted")]
    assert response_clip_ratio(trajs) == pytest.approx(0.3)
    assert response_clip_ratio([]) == 0.0


def test_a_steps_longest_and_shortest_response_are_logged_beside_the_mean():
    """max over mean: the tail a sync step's generation waits for (verl's names)."""
    trajs = [
        Trajectory("p0", i, [1, 2], [3] * n, [-0.5] * n, [0] * n, "stop")
        for i, n in enumerate((2, 4, 12))
    ]
    metrics = sample_metrics(trajs)
    assert (metrics["response_length/min"], metrics["response_length/max"]) == (2.0, 12.0)
    assert metrics["response_length/max"] / metrics["response_length/mean"] == pytest.approx(2.0)


def test_clip_warning_only_above_ten_percent():
    assert CLIP_WARN_RATIO == 0.1
    assert clip_warning(0.0, 16) is None
    assert clip_warning(0.1, 16) is None  # "more than 10%"
    assert clip_warning(0.11, 16) is not None


def test_clip_warning_names_the_fraction_the_limit_and_the_knob():
    ratio = response_clip_ratio([_traj("length")] * 3 + [_traj("stop")])
    warning = clip_warning(ratio, 16)
    assert "75% of validation responses" in warning
    assert "rollout.response_length=16 tokens" in warning
    assert "rollout.response_length=32" in warning  # the suggested value
