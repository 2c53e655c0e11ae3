"""Our side of the peer benchmark: ``python -m recipe mode=sync|fully_async`` under the
shared ``Terms``, and its figures read back from the run directory's ``metrics.jsonl``.

fully_async shares the one GPU between its trainer and its engine (``bench.e2e``'s
``gpu_layout``) with the asynchronous settings of ``bench.e2e`` (staleness 0.5, a push every
2 steps, partial rollout); each step trains ``prompts`` groups, as sync's does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from recipe.tools.bench.e2e import ASYNC
from recipe.tools.bench.peers.result import StepRow, read_metric_records
from recipe.tools.bench.peers.terms import Terms

SYSTEMS = ("sync", "fully_async")
METRICS_FILE = "metrics.jsonl"
_PHASE_KEYS = {
    "gen": "timing/gen_s",
    "old_log_prob": "timing/old_log_prob_s",
    "update": "timing/update_s",
    "sync": "timing/sync_s",
}


def our_command(terms: Terms, mode: str, run_dir: Path) -> list[str]:
    """``python -m recipe`` for ``mode`` under ``terms``, writing ``run_dir``."""
    overrides: dict[str, Any] = {
        "mode": mode,
        "model.path": terms.model,
        "model.dtype": "bfloat16" if terms.device == "cuda" else "float32",
        "trainer.device": terms.device,
        "data.train_files": f"[{terms.train_file}]",
        "data.val_files": f"[{terms.val_file}]",
        "data.val_max_samples": terms.val_rows,
        "data.max_prompt_length": terms.max_prompt_length,
        "data.train_batch_size": terms.prompts,
        "actor.ppo_mini_batch_size": terms.prompts,
        "actor.lr": terms.lr,
        "actor.use_kl_loss": False,
        "actor.entropy_coeff": 0.0,
        "rollout.n": terms.n,
        "rollout.response_length": terms.response_length,
        "rollout.gpu_memory_utilization": terms.gpu_memory_utilization,
        "rollout.val_temperature": 0.0,
        "trainer.total_training_steps": terms.steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": 0,  # validation once, at the end (final/val_accuracy)
        "trainer.save_freq": 0,
        "trainer.seed": terms.seed,
        "rollout.seed": terms.seed,
        "logger.quiet": True,
        "hydra.run.dir": run_dir,
    }
    if terms.device == "cpu":  # vLLM-CPU sizes its KV cache for one longest sequence
        overrides["+rollout.engine_kwargs.max_model_len"] = (
            terms.max_prompt_length + terms.response_length
        )
    if mode == "fully_async":
        overrides |= {f"async_training.{k}": v for k, v in ASYNC.items()}
        overrides["rollout.total_rollout_steps"] = terms.steps * terms.prompts * 2
    return [sys.executable, "-m", "recipe", *(f"{k}={_value(v)}" for k, v in overrides.items())]


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def read_ours(run_dir: Path) -> tuple[list[StepRow], list[int], float | None]:
    """(steps, the metrics line of each, final greedy accuracy) of a finished run."""
    path = run_dir / METRICS_FILE
    lines = read_metric_records(path)
    rows, line_of_step = [], []
    for index, record in enumerate(lines):
        if int(record.get("step", 0)) < 1 or "timing/step_s" not in record:
            continue  # a validation-only line
        samples = int(record.get("throughput/samples", 0))
        phases = {p: float(record[k]) for p, k in _PHASE_KEYS.items() if k in record}
        if "timing/gen_s" not in record and "trainer/idle_ratio" in record:
            phases["wait"] = float(record["trainer/idle_ratio"]) * float(record["timing/step_s"])
        rows.append(
            StepRow(
                step_s=float(record["timing/step_s"]),
                samples=samples,
                gen_tokens=float(record.get("response_length/mean", 0.0)) * samples,
                phases_s=phases,
            )
        )
        line_of_step.append(index)
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    accuracy = summary.get("final/val_accuracy")
    if accuracy is None:
        accuracy = next((r["val/accuracy"] for r in reversed(lines) if "val/accuracy" in r), None)
    return rows, line_of_step, accuracy
