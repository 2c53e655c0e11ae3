"""``python -m fully_async_policy.bench [steps=N] [key=value ...]``: samples/s of the sync
baseline, one_step_off and fully_async, back to back in one process on the same settings.

Every mode trains N steps of R prompts (``actor.ppo_mini_batch_size``; sync and one_step_off
use it as ``data.train_batch_size`` too, so all take one optimizer step per trainer step) with the
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
    if mode != "fully_async":
        per_step = OmegaConf.select(cfg, "actor.ppo_mini_batch_size")
        OmegaConf.update(cfg, "data.train_batch_size", per_step, force_add=True)
    return load_config(cfg)


def _run(mode: str, steps: int, overrides: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    cfg = _config(mode, steps, overrides)
    from recipe.main import _runner

    recipe_cls = _runner(mode)
    start = time.perf_counter()
    run_dir = out_dir / mode
    run_dir.mkdir(parents=True)
    # Like python -m recipe: the resolved config beside the metrics (recipe.plan reads it).
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml", resolve=True)
    recipe = recipe_cls(cfg, run_dir)
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
    modes = ("sync", "one_step_off", "fully_async")
    results = {mode: _run(mode, steps, overrides, out_dir) for mode in modes}
    for result in results.values():
        print(json.dumps(result))
    base = results["sync"]["throughput/samples_per_s"]
    ratios = {
        f"{mode}_over_sync_samples_per_s": results[mode]["throughput/samples_per_s"] / base
        for mode in modes[1:]
    }
    print(json.dumps(ratios | {"run_dirs": str(out_dir)}))


if __name__ == "__main__":
    main(sys.argv[1:])
