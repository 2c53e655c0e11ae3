"""``ci/check_gpu.py``: the nightly GPU job's figures read from its result files, each checked
against ``ci/thresholds_gpu.json``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check_gpu():
    spec = importlib.util.spec_from_file_location("check_gpu", ROOT / "ci" / "check_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(out: Path, name: str, value: object) -> None:
    (out / name).write_text(json.dumps(value))


def test_every_figure_has_a_threshold_and_missing_results_fail(tmp_path, capsys):
    check = _check_gpu()
    limits = json.loads((ROOT / "ci" / "thresholds_gpu.json").read_text())
    assert set(check.figures(tmp_path)) == set(limits)
    assert check.main([str(tmp_path)]) == 1
    assert "missing" in capsys.readouterr().out


def test_engine_push_and_pause_window_figures_come_from_their_result_files(tmp_path):
    check = _check_gpu()
    rows = [
        {"method": "vllm_ipc", "best_s": 0.09},
        {"method": "vllm_ipc_packed", "best_s": 0.072},
        {"method": "ours", "best_s": 0.025},
    ]
    _write(tmp_path, "engine_push.json", {"rows": rows})
    results = [
        {"mode": "sync", "samples_per_s": 81.8, "pause_window_s_p50": None},
        {"mode": "fully_async", "samples_per_s": 123.2, "pause_window_s_p50": 0.102},
    ]
    _write(tmp_path, "e2e.json", {"results": results, "ratios": {"fully_async_over_sync": 1.51}})
    found = check.figures(tmp_path)
    assert abs(found["engine_push ours/vllm 0.5B"] - 0.025 / 0.072) < 1e-12
    assert found["e2e fully_async pause window p50 s"] == 0.102
    assert found["e2e fully_async_over_sync"] == 1.51
    assert found["e2e one_step_off_over_sync"] is None


def test_peer_ratios_come_from_the_peer_benchmarks_report(tmp_path):
    check = _check_gpu()
    ratios = {"sync_over_verl samples_per_s": 1.2, "sync_over_verl startup_s": 0.5}
    _write(tmp_path, "peers.json", {"ratios": ratios})
    found = check.figures(tmp_path)
    assert found["peers sync_over_verl samples/s"] == 1.2
    assert found["peers sync_over_verl start-up"] == 0.5
    assert found["peers fully_async_over_verl samples/s"] is None  # its run failed: missing


def test_derive_sets_each_threshold_from_three_nightlies_and_keeps_the_rest(tmp_path, monkeypatch):
    check = _check_gpu()
    table = tmp_path / "thresholds_gpu.json"
    table.write_text((ROOT / "ci" / "thresholds_gpu.json").read_text())
    monkeypatch.setattr(check, "THRESHOLDS", table)
    outs = []
    for index, (ratio, startup) in enumerate([(1.9, 0.42), (2.0, 0.45), (2.1, 0.48)]):
        out = tmp_path / f"night{index}"
        out.mkdir()
        ratios = {"sync_over_verl samples_per_s": ratio, "sync_over_verl startup_s": startup}
        _write(out, "peers.json", {"ratios": ratios})
        outs.append(str(out))
    assert check.main(["derive", *outs]) == 0
    derived = json.loads(table.read_text())
    rate = derived["peers sync_over_verl samples/s"]
    assert rate["kind"] == "min" and abs(rate["value"] - 1.6) < 1e-9
    assert rate["measured"]["values"] == [1.9, 2.0, 2.1] and rate["noisy"] is False
    assert abs(derived["peers sync_over_verl start-up"]["value"] - 1.2 * 0.45) < 1e-9
    kept = derived["weight_sync 0.5B GB/s"]  # in no nightly: its threshold stays
    assert kept["measured"] is None and kept["value"] == 50
    # a 20% regression of the mean fails the derived threshold, today's values pass
    assert 0.8 * 2.0 * 0.99 < rate["value"] <= min(rate["measured"]["values"])


def test_a_spread_too_wide_for_a_20_percent_threshold_is_marked_noisy():
    check = _check_gpu()
    entry = check.derive_entry({"kind": "min", "value": 1.0}, [1.0, 1.6, 2.2], ["a", "b", "c"])
    assert entry["noisy"] is True
    steady = check.derive_entry({"kind": "max", "value": 1.0}, [1.0, 1.01, 0.99], ["a", "b", "c"])
    assert steady["noisy"] is False and abs(steady["value"] - 1.2) < 1e-9


def test_check_usage_errors_exit_2():
    check = _check_gpu()
    assert check.main([]) == 2
    assert check.main(["derive"]) == 2
