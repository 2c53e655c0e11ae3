"""Micro-batch plans: which rows of a (shard of a) ``TrainBatch`` go through one forward.

Two plans, chosen by ``actor.use_dynamic_bsz``:

- fixed: consecutive chunks of ``ppo_micro_batch_size_per_gpu`` rows, each padded to its
  longest row. On long-tailed response lengths most of a chunk is padding: a chunk of 32 with
  one 400-token row costs 32 x 400 token slots for perhaps 2,500 real tokens.
- token budget: rows sorted by length (longest first) and cut greedily so that a micro-batch's
  padded size ``rows x longest row`` stays within a token budget
  (``actor.ppo_max_token_len_per_gpu`` with gradients, ``actor.log_prob_max_token_len_per_gpu``
  without). Rows of similar length share a micro-batch, so padding nearly vanishes and short
  rows travel in large micro-batches. A row longer than the budget goes alone.

Ranks of one FSDP group must run the same number of forwards (each one all-gathers), so with
world size > 1 the plan is cut again into at least the group's largest count: the costliest
micro-batches are halved, and when a rank has fewer rows than micro-batches the plan ends with
empty ones (``[]``) that the trainer runs as a fully masked dummy row.

The losses are normalised by the mini-batch's global token / sequence counts, so any plan
gives the same gradient up to float summation order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from recipe.workers.trainer.batch import TrainBatch

MicroPlan = list[list[int]]
"""Row indices of each micro-batch, in execution order; ``[]`` is a dummy micro-batch."""


def fixed_plan(num_rows: int, rows_per_micro: int) -> MicroPlan:
    """Consecutive chunks of ``rows_per_micro`` rows (the last may be smaller)."""
    if rows_per_micro <= 0:
        raise ValueError(f"rows_per_micro={rows_per_micro} must be > 0")
    return [
        list(range(start, min(start + rows_per_micro, num_rows)))
        for start in range(0, num_rows, rows_per_micro)
    ]


def padded_tokens(rows: Sequence[int], lengths: Sequence[int]) -> int:
    """Token slots one micro-batch occupies once padded to its longest row."""
    return len(rows) * max((lengths[r] for r in rows), default=0)


def token_budget_plan(lengths: Sequence[int], max_tokens: int) -> MicroPlan:
    """Rows sorted longest first, cut greedily so each micro-batch's padded size (rows x
    longest row) is at most ``max_tokens``; a row longer than ``max_tokens`` goes alone."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens} must be > 0")
    order = sorted(range(len(lengths)), key=lambda r: (-lengths[r], r))
    plan: MicroPlan = []
    current: list[int] = []
    for row in order:
        # Longest first: the micro-batch's first row sets its padded length.
        longest = lengths[current[0]] if current else lengths[row]
        if current and (len(current) + 1) * longest > max_tokens:
            plan.append(current)
            current = []
        current.append(row)
    if current:
        plan.append(current)
    return plan


def split_to_count(plan: MicroPlan, lengths: Sequence[int], num_micro: int) -> MicroPlan:
    """``plan`` with at least ``num_micro`` micro-batches: the costliest splittable one is
    halved until the count is reached, then empty (dummy) micro-batches are appended. The
    order stays longest first."""
    out = [list(rows) for rows in plan]
    while len(out) < num_micro:
        splittable = [i for i, rows in enumerate(out) if len(rows) > 1]
        if not splittable:
            out += [[] for _ in range(num_micro - len(out))]
            break
        i = max(splittable, key=lambda j: (padded_tokens(out[j], lengths), -j))
        rows = out[i]
        half = (len(rows) + 1) // 2
        out[i : i + 1] = [rows[:half], rows[half:]]
    return out


def device_micro_batches(
    batch: TrainBatch, plan: MicroPlan, lengths: Sequence[int], device: torch.device
) -> Iterator[tuple[list[int], TrainBatch]]:
    """(rows, micro-batch on ``device``, trimmed to its longest row) per entry of ``plan``.
    The batch crosses to the device once, in plan order, and micro-batches are views of it:
    nothing in the loop copies from the host or waits for the device. A dummy entry (``[]``)
    yields the batch's first row without targets. ``lengths``: tokens of each row."""
    order = [row for rows in plan for row in rows]
    on_device = batch.select(order).to(device) if order else None
    start = 0
    for rows in plan:
        if not rows:
            yield rows, batch.select([0]).without_targets().trim_padding().to(device)
            continue
        num_cols = max(lengths[row] for row in rows)
        assert on_device is not None  # a plan with rows selects them
        yield rows, on_device.narrow_rows(start, start + len(rows), num_cols)
        start += len(rows)
