"""Reward functions the integration tests load by file path (``reward.custom_fn``), as a
user's reward file would be."""

from __future__ import annotations

import zlib

PATH = __file__


def half_flat(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 for every response to a prompt whose answer is even (such a group has no reward
    variance: dynamic sampling filters it); on the others a number drawn from the response
    text, so a group of different responses varies."""
    if int(ground_truth) % 2 == 0:
        return 1.0
    return (zlib.crc32(solution_str.encode()) % 1000) / 1000
