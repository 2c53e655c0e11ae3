"""Check the nightly GPU job's results against ``ci/thresholds_gpu.json``; exit 1 on a regression.

    python ci/check_gpu.py OUT_DIR                 check one nightly's results
    python ci/check_gpu.py derive OUT_DIR...       (re)write the thresholds from >= 3 nightlies

Reads what ``ci/nightly_gpu.sh`` wrote (rollout.json, trainer.json, weight_sync.json,
engine_push.json, e2e.json, run/, peers.json) and
prints one row per figure: value, threshold, verdict. A missing result is a failure.

``derive`` sets each figure's threshold from its values in the nightlies given (the machine
the thresholds guard; at least 3 with the figure) and records them beside it:

    kind min    0.8 x the measured mean: a 20% regression fails
    kind max    1.2 x the measured mean
    noisy       true when the measured spread puts the threshold within 1.645 standard
                deviations of the mean: a healthy nightly would fail more than 1 time in 20,
                so the figure needs more runs (or a steadier measurement) before it guards
A figure with fewer than 3 values keeps its threshold, marked ``"measured": null``.
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

THRESHOLDS = Path(__file__).parent / "thresholds_gpu.json"
REGRESSION = 0.2
Z_ONE_SIDED_95 = 1.645
MIN_RUNS = 3


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


def derive_entry(limit: dict[str, Any], values: list[float], sources: list[str]) -> dict[str, Any]:
    """One figure's thresholds entry from its measured ``values`` (module docstring)."""
    kind = limit["kind"]
    if len(values) < MIN_RUNS:
        return {"kind": kind, "value": limit["value"], "measured": None}
    mean, sd = statistics.mean(values), statistics.stdev(values)
    bound = (1 - REGRESSION) * mean if kind == "min" else (1 + REGRESSION) * mean
    return {
        "kind": kind,
        "value": round(bound, 4),
        "noisy": abs(mean - bound) < Z_ONE_SIDED_95 * sd,
        "measured": {
            "date": date.today().isoformat(),
            "values": [round(v, 4) for v in values],
            "mean": round(mean, 4),
            "sd": round(sd, 4),
            "runs": sources,
        },
    }


def derive(out_dirs: list[str]) -> dict[str, Any]:
    """Every figure's entry from the nightlies in ``out_dirs`` (the kinds stay as they are)."""
    limits = json.loads(THRESHOLDS.read_text())
    found = [(Path(d).name, figures(Path(d))) for d in out_dirs]
    table = {}
    for name, limit in limits.items():
        pairs = [(source, f[name]) for source, f in found if f.get(name) is not None]
        table[name] = derive_entry(
            limit, [v for _, v in pairs if v is not None], [s for s, _ in pairs]
        )
    return table


def check(out_dir: str) -> int:
    limits = json.loads(THRESHOLDS.read_text())
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
        threshold = f"{kind} {bound:.3f}"
        print(f"{name:<34}{shown:>10}{threshold:>12}  {'ok' if ok else 'REGRESSED'}")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["derive"] and len(argv) > 1:
        table = derive(argv[1:])
        THRESHOLDS.write_text(
            "{\n"
            + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
            + "\n}\n"
        )
        for name, entry in table.items():
            measured = entry["measured"]
            shown = (
                "kept: fewer than 3 runs"
                if measured is None
                else (
                    f"{entry['kind']} {entry['value']:.3f} from {measured['values']}"
                    + (" NOISY" if entry["noisy"] else "")
                )
            )
            print(f"{name:<34}{shown}")
        return 0
    if len(argv) != 1 or argv[0] == "derive":
        print("usage: check_gpu.py OUT_DIR | derive OUT_DIR...", file=sys.stderr)
        return 2
    return check(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
