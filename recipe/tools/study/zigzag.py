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

import math
import sys
from pathlib import Path

import numpy as np

from recipe.tools.cli import exit_on_help
from recipe.tools.study.zigzag_stats import across_push, contrast, nanmean, reward_autocorrelation
from recipe.tools.study.zigzag_steps import RunSteps, by_window, read_run

STUDY_KEYS = {"sync_every": "", "trend": "5", "permutations": "2000", "seed": "0"}


def run_table(run: RunSteps, *, width: int, permutations: int, seed: int) -> list[str]:
    """The per-position table and the autocorrelation line of one run."""
    rng = np.random.default_rng(seed)
    names = [c for c in run.columns if any(math.isfinite(v) for v in run.columns[c])]
    lines = [f"{run.name}  ({run.mode}, T={run.sync_every}, {len(run.steps)} steps)"]
    lines.append(f"  {'position':<16}" + "".join(f"{n:>12}" for n in names))
    for position in range(1, run.sync_every + 1):
        rows = [i for i, p in enumerate(run.positions) if p == position]
        means = [nanmean([run.columns[n][i] for i in rows]) for n in names]
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
