"""Check the nightly GPU job's results against ``ci/thresholds_gpu.json``; exit 1 on a regression.

    python ci/check_gpu.py OUT_DIR

Reads what ``ci/nightly_gpu.sh`` wrote (rollout.json, trainer.json, weight_sync.json,
engine_push.json, e2e.json, run/, peers.json) and
prints one row per figure: value, threshold, verdict. A missing result is a failure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def figures(out: Path) -> dict[str, float | None]:
    """Every checked figure (None: its result file is missing)."""
    found: dict[str, float | None] = {}
    rollout = _load(out / "rollout.json")
    found["rollout ours/plain tokens/s"] = rollout["ratio_best"] if rollout else None
    trainer = _load(out / "trainer.json")
    by = {(r["variant"], r["plan"]): r for r in (trainer or {}).get("rows", [])}
    for key, label in (("update_s", "update"), ("old_logprob_s", "old log-prob")):
        ours, plain = by.get(("ours", "budget")), by.get(("plain", "budget"))
        found[f"trainer ours/plain {label}"] = ours[key] / plain[key] if ours and plain else None
    sync = _load(out / "weight_sync.json")
    for size in ("0.5B", "1.5B", "7B"):
        rows = [r for r in (sync or {}).get("rows", []) if r["size"] == size]
        ok = [r["gbps"] for r in rows if r["bitwise_equal"]]
        found[f"weight_sync {size} GB/s"] = max(ok) if ok else None
    push = _load(out / "engine_push.json")
    by_method = {r["method"]: r["best_s"] for r in (push or {}).get("rows", [])}
    theirs = [by_method[m] for m in ("vllm_ipc", "vllm_ipc_packed") if m in by_method]
    found["engine_push ours/vllm 0.5B"] = (
        by_method["ours"] / min(theirs) if "ours" in by_method and theirs else None
    )
    e2e = _load(out / "e2e.json")
    for key in ("one_step_off_over_sync", "fully_async_over_sync"):
        found[f"e2e {key}"] = e2e["ratios"].get(key) if e2e else None
    for mode in ("sync", "fully_async"):
        rows = [r for r in (e2e or {}).get("results", []) if r["mode"] == mode]
        found[f"e2e {mode} samples/s"] = rows[0]["samples_per_s"] if rows else None
        if mode == "fully_async":
            window = rows[0].get("pause_window_s_p50") if rows else None
            found["e2e fully_async pause window p50 s"] = window
    summary = _load(out / "run" / "summary.json")
    found["run val accuracy gain"] = (
        summary["final/val_accuracy"] - summary["initial/val_accuracy"] if summary else None
    )
    metrics = out / "run" / "metrics.jsonl"
    if metrics.is_file():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        windows = sorted(r["sync/pause_window_s"] for r in rows if "sync/pause_window_s" in r)
        found["run pause window p50 s"] = windows[len(windows) // 2] if windows else None
    else:
        found["run pause window p50 s"] = None
    peers = (_load(out / "peers.json") or {}).get("ratios", {})
    for system in ("sync", "fully_async"):
        ratio = peers.get(f"{system}_over_verl samples_per_s")
        found[f"peers {system}_over_verl samples/s"] = ratio
    found["peers sync_over_verl start-up"] = peers.get("sync_over_verl startup_s")
    return found


def main(out_dir: str) -> int:
    limits = json.loads((Path(__file__).parent / "thresholds_gpu.json").read_text())
    values = figures(Path(out_dir))
    print(f"{'figure':<34}{'value':>10}{'threshold':>12}  verdict  ({out_dir})")
    failed = False
    for name, value in values.items():
        limit = limits[name]
        kind, bound = limit["kind"], limit["value"]
        if value is None:
            ok, shown = False, "missing"
        else:
            ok = value >= bound if kind == "min" else value <= bound
            shown = f"{value:.3f}"
        failed |= not ok
        print(
            f"{name:<34}{shown:>10}{kind + ' ' + format(bound, '.3f'):>12}  "
            f"{'ok' if ok else 'REGRESSED'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
