"""Rewards for runs of the random-init benchmark models (``recipe/tools/bench/models.py``).

A random model never answers a task right: under the task's scorer every reward is 0, every
GRPO advantage is 0 and no update changes the weights. A LoRA adapter then stays zero, and a
benchmark of adapter pushes measures the zero adapter's path (its probe on the paused engine,
every time) instead of the path a learning run takes. The reward here varies within a group on
what a random model does write, so the updates have a gradient and the adapter moves:

    python -m recipe ... reward.custom_fn=recipe.tools.bench.rewards:decodes_to_text

It says nothing about a task; it is for timing and memory figures only.
"""

from __future__ import annotations

from typing import Any


def decodes_to_text(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float:
    """1.0 when the response decodes to any text, else 0.0. The benchmark shapes sample from
    151,936 ids (152,064 for the 7B) of which their tokenizer knows 258; the others decode to
    nothing. Sampled uniformly, 384 ids decode to some text 43% of the time (400 draws), so
    most groups of 8 hold both rewards."""
    del data_source, ground_truth, extra_info
    return float(bool(solution_str))
