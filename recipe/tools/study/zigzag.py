"""``python -m recipe.tools.study.zigzag RUN_DIR [RUN_DIR ...] [key=value ...]``: does a run's
training reward zigzag with the weight syncs, and what do the steps of a sync window train?

A fully async trainer pushes its weights every T = ``trigger_parameter_sync_step`` steps, so
each step has a position in its version window (1 = the first step after a push). This
groups a run's steps by that position and compares them::

    metrics.jsonl --positions (a step that pushed ends its window)--> steps by position
        per position: mean training reward, response length, staleness, partial share,
                      queue size and the trainer's wait for its batch
        position p vs 1, per window: x(k, p) - [(1 - f) x(k, 1) + f x(k + 1, 1)],
                      f = (p - 1) / T: the first steps on both sides, interpolated, so a
                      trend in the run (learning) cancels; sign-flip permutation p-value
                      over the windows (two-sided)
        across a push, x(k + 1, 1) - x(k, T): the first step after it against the last
                      before it; with T = 2 and staleness_threshold = 0.5 both train groups
                      admitted in window k (its late finishers against its early ones), so
                      no difference of weights versions enters it
    ledger.jsonl + trace.json (when both are there): per position, the longest response of
        each trained group (its engine requests' lengths), the share of groups whose
        generation began before the window opened, and the groups' finish rank among those
        that began in the same window (0 = first to finish, 1 = last)
    reward series: lag-1 autocorrelation (negative = zigzag) of the reward minus its
        centred moving average (``trend=`` steps wide), against the same statistic of the
        run's own residuals shuffled (the permutation null: what the detrending alone gives)

A sync run (every step pushes) has one position; its autocorrelation is the reference a
zigzag is measured against. A study record (``docs/study/*/<mode>-seed<N>.json``, its
``train`` list of per-step rewards) is read too: it carries no config, so its window is
``sync_every=`` (1 for sync records). Keys: ``sync_every=`` (default: the run's
``async_training.trigger_parameter_sync_step``, 1 for sync and one_step_off),
``trend=5``, ``permutations=2000``, ``seed=0``. Bad input prints one line, exit code 2.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recipe.tools.cli import exit_on_help
from recipe.tools.report.data import load_run

STUDY_KEYS = {"sync_every": "", "trend": "5", "permutations": "2000", "seed": "0"}

COLUMNS: dict[str, str] = {
    "reward": "reward/mean",
    "length": "response_length/mean",
    "clip": "response_length/clip_ratio",
    "stale": "staleness/mean",
    "stale_max": "staleness/max",
    "partial": "partial/ratio",
    "resumed": "partial/resumed_group_ratio",
    "queue": "queue/size",
    "wait_s": "",  # trainer/idle_ratio * timing/step_s: the step's wait for its batch
    "grad_norm": "actor/grad_norm",
}
"""Per-step columns and the metrics.jsonl key each comes from."""

GROUP_COLUMNS = ("group_len", "carried", "finish_rank")
"""Per-step columns from ledger.jsonl and trace.json, means over the step's groups: the longest
response of a group, whether it began before the step's window opened (carried over), and its
place in the order in which the trained groups that began in its window finished (0 first)."""

SYNC_MODES = ("sync", "one_step_off")


@dataclass(slots=True)
class RunSteps:
    """A run's trainer steps, each with its position in its version window."""

    name: str
    mode: str
    sync_every: int
    """T: steps per version window."""
    steps: list[int]
    positions: list[int]
    """1..T per step (a last, shorter window ends early)."""
    columns: dict[str, list[float]] = field(default_factory=dict)
    """Column name -> one value per step (NaN where not recorded)."""


@dataclass(frozen=True, slots=True)
class Contrast:
    """Position p against position 1, over the windows that have both."""

    mean: float
    """Mean over windows of x(k, p) minus the interpolated first steps around it."""
    p_value: float
    """Two-sided sign-flip permutation p-value of that mean."""
    num_windows: int


@dataclass(frozen=True, slots=True)
class Autocorrelation:
    lag1: float
    """Lag-1 autocorrelation of the detrended reward."""
    null_mean: float
    """The same statistic over shuffled residuals (what detrending alone gives)."""
    p_low: float
    """Share of shuffles at or below ``lag1`` (small: a zigzag beyond chance)."""


# ---- reading runs -------------------------------------------------------------------------


def positions_of(pushed: Sequence[bool]) -> list[int]:
    """Position of each step in its window: a step that pushed ends its window."""
    out, position = [], 1
    for did_push in pushed:
        out.append(position)
        position = 1 if did_push else position + 1
    return out


def read_run(path: Path, sync_every: int | None = None) -> RunSteps:
    """A run directory or a study record; ``ValueError`` naming the path when it is neither."""
    if path.is_file() and path.suffix == ".json":
        return _read_record(path, sync_every)
    run = load_run(path)
    records = [r for r in run.records if "reward/mean" in r]
    if not records:
        raise ValueError(f"{path}: no trained step in metrics.jsonl")
    every = sync_every or _config_sync_every(run.mode, run.config)
    pushed = [("timing/sync_s" in r) for r in records]
    if run.mode in SYNC_MODES or not any(pushed):  # no push recorded: count steps instead
        pushed = [(i + 1) % every == 0 for i in range(len(records))]
    steps = [int(r["step"]) for r in records]
    columns = {name: [_value(r, key) for r in records] for name, key in COLUMNS.items()}
    columns["wait_s"] = [
        _value(r, "trainer/idle_ratio") * _value(r, "timing/step_s") for r in records
    ]
    columns |= group_columns(trained_groups(path, run.trace), steps, pushed)
    return RunSteps(str(path), run.mode, every, steps, positions_of(pushed), columns)


def _read_record(path: Path, sync_every: int | None) -> RunSteps:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        mode, train = str(record["mode"]), record["train"]
        steps = [int(t["step"]) for t in train]
        rewards = [float(t["reward"]) for t in train]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a study record with 'mode' and 'train' ({exc})") from None
    if sync_every is None and mode not in SYNC_MODES:
        raise ValueError(f"{path}: a {mode} record names no window: give sync_every=T")
    every = 1 if mode in SYNC_MODES else sync_every or 1
    pushed = [(i + 1) % every == 0 for i in range(len(steps))]
    return RunSteps(str(path), mode, every, steps, positions_of(pushed), {"reward": rewards})


def _config_sync_every(mode: str, config: dict[str, Any]) -> int:
    if mode in SYNC_MODES:
        return 1
    every = config.get("async_training", {}).get("trigger_parameter_sync_step")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"mode={mode}: no async_training.trigger_parameter_sync_step in "
                         "config.yaml; give sync_every=T")  # fmt: skip
    return every


def _value(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


@dataclass(frozen=True, slots=True)
class TrainedGroup:
    """One trained group as the engines' trace shows it (times: the trace's µs)."""

    step: int
    began_us: float
    """Start of its first engine request (a resumed request continues the group)."""
    ended_us: float
    """End of its last engine request before the step."""
    max_len: int
    """Its longest response (tokens)."""
    began_window: int | None
    """Pushes before it began: the window it was admitted in (None: the trace shows no
    window openings, the rollouter's ``end_sync``, as in sync and one_step_off)."""


def trained_groups(path: Path, trace: list[dict[str, Any]]) -> list[TrainedGroup]:
    """Every group of ledger.jsonl with its engine requests in the trace (none without)."""
    ledger_file = path / "ledger.jsonl"
    if not ledger_file.is_file() or not trace:
        return []
    lines = filter(None, ledger_file.read_text(encoding="utf-8").splitlines())
    trained = {int(r["step"]): r.get("trained", []) for r in map(json.loads, lines)}
    step_end = {int(e["args"]["step"]): e["ts"] + e["dur"] for e in trace
                if e.get("name") == "step" and "step" in e.get("args", {})}  # fmt: skip
    opened = sorted(e["ts"] + e["dur"] for e in trace if e.get("name") == "end_sync (resume)")
    segments: dict[str, list[dict[str, Any]]] = defaultdict(list)  # uid -> by end time
    requests = [
        e for e in trace if e.get("name") == "generate" and "prompt_uid" in e.get("args", {})
    ]
    for event in sorted(requests, key=lambda e: e["ts"] + e["dur"]):
        segments[event["args"]["prompt_uid"]].append(event)
    out = []
    for step, uids in sorted(trained.items()):
        for uid in uids:  # its requests up to the step (a uid comes again in a later epoch)
            mine = [e for e in segments[uid] if e["ts"] + e["dur"] <= step_end.get(step, math.inf)]
            if not mine:
                continue
            began = next((e for e in reversed(mine) if not e["args"].get("resumed")), mine[0])
            max_len = max(mine[-1]["args"].get("lengths") or [0])
            window = bisect.bisect_right(opened, began["ts"]) if opened else None
            out.append(
                TrainedGroup(step, began["ts"], mine[-1]["ts"] + mine[-1]["dur"], max_len, window)
            )
    return out


def group_columns(
    groups: list[TrainedGroup], steps: list[int], pushed: list[bool]
) -> dict[str, list[float]]:
    """``GROUP_COLUMNS`` per step (empty without groups): finish_rank is a group's place in
    the order its window's trained groups finished generating (0 first, 1 last)."""
    if not groups:
        return {}
    members: dict[int, list[int]] = defaultdict(list)  # window -> indices into groups
    for index, group in enumerate(groups):
        if group.began_window is not None:
            members[group.began_window].append(index)
    rank = [math.nan] * len(groups)
    for indices in members.values():
        ordered = sorted(indices, key=lambda i: groups[i].ended_us)
        for place, index in enumerate(ordered):
            rank[index] = place / max(len(ordered) - 1, 1)
    window_of = dict(zip(steps, itertools.accumulate([0, *map(int, pushed[:-1])]), strict=True))
    by_step: dict[int, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_step[group.step].append(index)
    out: dict[str, list[float]] = {name: [] for name in GROUP_COLUMNS}
    for step in steps:
        mine = by_step.get(step, [])
        out["group_len"].append(_nanmean([groups[i].max_len for i in mine]))
        carried = [_before(groups[i].began_window, window_of[step]) for i in mine]
        out["carried"].append(_nanmean(carried))
        out["finish_rank"].append(_nanmean([rank[i] for i in mine]))
    return out


def _before(began_window: int | None, window: int) -> float:
    return math.nan if began_window is None else float(began_window < window)


# ---- statistics ---------------------------------------------------------------------------


def by_window(run: RunSteps, column: str) -> list[dict[int, float]]:
    """One {position: value} per window, in order."""
    windows: list[dict[int, float]] = []
    for position, value in zip(run.positions, run.columns[column], strict=True):
        if position == 1:
            windows.append({})
        if windows:
            windows[-1][position] = value
    return windows


def contrast(
    windows: list[dict[int, float]], position: int, sync_every: int, rng: np.random.Generator,
    permutations: int,
) -> Contrast:  # fmt: skip
    """Position ``position`` against the first steps of its window and the next (module
    docstring); NaN values and windows without both are left out."""
    f = (position - 1) / sync_every
    diffs = [
        here[position] - ((1 - f) * here[1] + f * after[1])
        for here, after in itertools.pairwise(windows)
        if position in here and 1 in here and 1 in after
    ]
    diffs = [d for d in diffs if math.isfinite(d)]
    if not diffs:
        return Contrast(math.nan, math.nan, 0)
    return Contrast(float(np.mean(diffs)), sign_flip_p(diffs, rng, permutations), len(diffs))


def across_push(
    windows: list[dict[int, float]], sync_every: int, rng: np.random.Generator, permutations: int
) -> Contrast:
    """x(k + 1, 1) - x(k, T): the first step after a push against the last before it. With
    T = 2 and staleness_threshold = 0.5 both train groups admitted in window k, its late and
    its early finishers, so no difference of weights versions enters it."""
    diffs = [
        after[1] - here[sync_every]
        for here, after in itertools.pairwise(windows)
        if sync_every in here and 1 in after
    ]
    diffs = [d for d in diffs if math.isfinite(d)]
    if not diffs:
        return Contrast(math.nan, math.nan, 0)
    return Contrast(float(np.mean(diffs)), sign_flip_p(diffs, rng, permutations), len(diffs))


def sign_flip_p(diffs: Sequence[float], rng: np.random.Generator, permutations: int) -> float:
    """Two-sided p-value of mean(diffs) != 0 under random signs (paired permutation test)."""
    values = np.asarray(diffs, dtype=float)
    observed = abs(values.mean())
    signs = rng.choice((-1.0, 1.0), size=(permutations, len(values)))
    null = np.abs((signs * values).mean(axis=1))
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + permutations))


def detrend(values: Sequence[float], width: int) -> np.ndarray:
    """``values`` minus their centred moving average over ``width`` steps (shorter at the
    ends)."""
    x = np.asarray(values, dtype=float)
    half = width // 2
    trend = np.array([x[max(0, i - half) : i + half + 1].mean() for i in range(len(x))])
    return x - trend


def lag1(values: np.ndarray) -> float:
    """Lag-1 autocorrelation (NaN for fewer than 3 values or a constant series)."""
    x = values - values.mean()
    denominator = float(np.dot(x, x))
    if len(x) < 3 or denominator == 0.0:
        return math.nan
    return float(np.dot(x[:-1], x[1:]) / denominator)


def reward_autocorrelation(
    rewards: Sequence[float], width: int, rng: np.random.Generator, permutations: int
) -> Autocorrelation:
    """Lag-1 autocorrelation of the detrended reward against shuffled residuals put back on
    the same trend and detrended again."""
    x = np.asarray([r for r in rewards if math.isfinite(r)], dtype=float)
    residual = detrend(x, width)
    trend = x - residual
    observed = lag1(residual)
    null = np.array(
        [lag1(detrend(trend + rng.permutation(residual), width)) for _ in range(permutations)]
    )
    null = null[np.isfinite(null)]
    if not math.isfinite(observed) or not len(null):
        return Autocorrelation(observed, math.nan, math.nan)
    p_low = float((1 + np.sum(null <= observed + 1e-12)) / (1 + len(null)))
    return Autocorrelation(observed, float(null.mean()), p_low)


# ---- the table ------------------------------------------------------------------------------


def run_table(run: RunSteps, *, width: int, permutations: int, seed: int) -> list[str]:
    """The per-position table and the autocorrelation line of one run."""
    rng = np.random.default_rng(seed)
    names = [c for c in run.columns if any(math.isfinite(v) for v in run.columns[c])]
    lines = [f"{run.name}  ({run.mode}, T={run.sync_every}, {len(run.steps)} steps)"]
    lines.append(f"  {'position':<16}" + "".join(f"{n:>12}" for n in names))
    for position in range(1, run.sync_every + 1):
        rows = [i for i, p in enumerate(run.positions) if p == position]
        means = [_nanmean([run.columns[n][i] for i in rows]) for n in names]
        label = f"{position} ({len(rows)} steps)"
        lines.append(f"  {label:<16}" + "".join(f"{m:>12.4g}" for m in means))
    for position in range(2, run.sync_every + 1):
        cells = [
            contrast(by_window(run, n), position, run.sync_every, rng, permutations) for n in names
        ]
        num = max(c.num_windows for c in cells)
        lines.append(
            f"  {f'{position} - 1, detr.':<16}" + "".join(f"{c.mean:>+12.3g}" for c in cells)
        )
        lines.append(
            f"  {f'p ({num} windows)':<16}" + "".join(f"{c.p_value:>12.2g}" for c in cells)
        )
    if run.sync_every > 1:
        cells = [across_push(by_window(run, n), run.sync_every, rng, permutations) for n in names]
        num = max(c.num_windows for c in cells)
        lines.append(
            f"  {f'next 1 - {run.sync_every}':<16}" + "".join(f"{c.mean:>+12.3g}" for c in cells)
        )
        lines.append(f"  {f'p ({num} pushes)':<16}" + "".join(f"{c.p_value:>12.2g}" for c in cells))
    ac = reward_autocorrelation(run.columns["reward"], width, rng, permutations)
    lines.append(
        f"  reward lag-1 autocorrelation (minus a {width}-step moving average): {ac.lag1:+.3f}; "
        f"shuffled residuals {ac.null_mean:+.3f}, P(shuffled <= it) = {ac.p_low:.3g}"
    )
    return lines


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def parse(argv: list[str]) -> tuple[list[Path], dict[str, int | None]]:
    """Run paths and study keys; ``ValueError`` naming a bad one."""
    paths, keys = [], dict(STUDY_KEYS)
    exit_on_help(argv, __doc__)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            paths.append(Path(arg))
        elif key in STUDY_KEYS:
            keys[key] = value
        else:
            raise ValueError(f"{arg!r}: unknown key {key!r} (allowed: {', '.join(STUDY_KEYS)})")
    if not paths:
        raise ValueError("give at least one run directory (or study record)")
    out: dict[str, int | None] = {}
    for key, value in keys.items():
        try:
            out[key] = int(value) if value else None
        except ValueError:
            raise ValueError(f"{key}={value!r}: expected an integer") from None
        if out[key] is not None and out[key] < (0 if key == "seed" else 1):  # type: ignore[operator]
            raise ValueError(f"{key}={value}: allowed >= {0 if key == 'seed' else 1}")
    return paths, out


def main(argv: list[str]) -> int:
    try:
        paths, keys = parse(argv)
        runs = [read_run(p, keys["sync_every"]) for p in paths]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for run in runs:
        table = run_table(
            run,
            width=keys["trend"] or 5,
            permutations=keys["permutations"] or 2000,
            seed=keys["seed"] or 0,
        )
        print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
