"""``python -m fully_async_policy.bench [steps=N] [key=value ...]``: samples/s of the sync
baseline and of fully_async, back to back in one process on the same settings.

Both modes train N steps of R prompts (``actor.ppo_mini_batch_size``; sync uses it as
``data.train_batch_size`` too, so both take one optimizer step per trainer step) with the
same model, data, sampling and validation settings; extra ``key=value`` overrides apply to
both. Throughput counts trained samples over the whole ``fit`` (validation included), from
each run's ``summary.json``. Prints one JSON object per mode and a ratio.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from recipe.config import load_config

logger = logging.getLogger(__name__)

SHARED = {"actor": {"ppo_mini_batch_size": 16}, "logger": {"quiet": True}}
ASYNC = {
    "staleness_threshold": 0.5,
    "trigger_parameter_sync_step": 2,
    "require_batches": 1,
    "partial_rollout": True,
}
KEPT = (
    "throughput/samples_per_s",
    "wall_s",
    "steps",
    "param_version",
    "initial/val_accuracy",
    "final/val_accuracy",
    "staleness/mean",
    "trainer/idle_ratio",
    "rollouter/idle_ratio",
)


def _config(mode: str, steps: int, overrides: dict[str, Any]) -> Any:
    cfg = OmegaConf.create(SHARED | {"mode": mode})
    OmegaConf.update(cfg, "trainer.total_training_steps", steps, force_add=True)
    if mode == "fully_async":
        OmegaConf.update(cfg, "async_training", ASYNC, force_add=True)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    if mode == "sync":
        per_step = OmegaConf.select(cfg, "actor.ppo_mini_batch_size")
        OmegaConf.update(cfg, "data.train_batch_size", per_step, force_add=True)
    return load_config(cfg)


def _run(mode: str, steps: int, overrides: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    cfg = _config(mode, steps, overrides)
    if mode == "sync":
        from recipe.sync_trainer import SyncTrainer as Recipe
    else:
        from fully_async_policy.main import FullyAsyncRecipe as Recipe
    start = time.perf_counter()
    recipe = Recipe(cfg, out_dir / mode)
    build_s = time.perf_counter() - start
    try:
        summary = recipe.fit()
    finally:
        recipe.close()
    return {"mode": mode, "build_s": build_s} | {k: summary.get(k) for k in KEPT}


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    args = dict(arg.split("=", 1) for arg in argv)
    steps = int(args.pop("steps", "40"))
    overrides = {key: yaml.safe_load(value) for key, value in args.items()}
    out_dir = Path(tempfile.mkdtemp(prefix="bench-sync-vs-async-"))
    results = [_run(mode, steps, overrides, out_dir) for mode in ("sync", "fully_async")]
    for result in results:
        print(json.dumps(result))
    ratio = results[1]["throughput/samples_per_s"] / results[0]["throughput/samples_per_s"]
    print(json.dumps({"fully_async_over_sync_samples_per_s": ratio, "run_dirs": str(out_dir)}))


if __name__ == "__main__":
    main(sys.argv[1:])
