"""The step bar every recipe shows: steps done, ETA, and the figures a person watches.

    fully_async:  37%|███▋      | 185/500 [01:40<02:51, 1.84step/s, v=92, q=12, stale=0.50,
                  reward=0.412, acc=0.547]

``v`` is the weights version the engines serve, ``q`` the groups waiting for the trainer
(fully_async: the message queue; one_step_off: the next batch's groups already generated when
the step's training ended), ``stale`` the step's mean staleness in versions, ``reward`` its
mean reward, ``acc`` the latest validation accuracy. ``logger.quiet=true`` turns the bar off
(CI logs); metrics still go to every other sink.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from tqdm import tqdm

POSTFIX_KEYS = (
    ("q", "queue/size", "{:.0f}"),
    ("stale", "staleness/mean", "{:.2f}"),
    ("reward", "reward/mean", "{:.3f}"),
)


def step_bar(total: int, mode: str, *, quiet: bool) -> tqdm:
    """A bar of ``total`` trainer steps (disabled when ``quiet``)."""
    return tqdm(total=total, desc=mode, unit="step", disable=quiet, dynamic_ncols=True)


def bar_postfix(
    metrics: Mapping[str, float], version: int, val_accuracy: float | None = None
) -> dict[str, str]:
    """The bar's right-hand figures from one step's metrics (those it has)."""
    out = {"v": str(version)}
    for name, key, fmt in POSTFIX_KEYS:
        value = metrics.get(key)
        if value is not None and math.isfinite(value):
            out[name] = fmt.format(value)
    if val_accuracy is not None and math.isfinite(val_accuracy):
        out["acc"] = f"{val_accuracy:.3f}"
    return out


def update_bar(
    bar: tqdm, metrics: Mapping[str, float], version: int, val_accuracy: float | None = None
) -> None:
    """One step done: advance and refresh the figures."""
    bar.set_postfix(bar_postfix(metrics, version, val_accuracy), refresh=False)
    bar.update(1)
