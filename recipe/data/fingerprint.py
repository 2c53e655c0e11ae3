"""Fingerprints of a run's prompt sets: stored in every checkpoint, checked on resume.

A checkpoint names prompts by uid (the prompt ledger, the cursor, the groups in flight), and a
uid names the same prompt only while the data stays the same: the same files, ``data.*``
settings and reasoning-gym version. So every checkpoint records, for the train and the val set,
a sha256 over each record's uid, prompt, ground truth and data source, in order, whatever the
source (files, synthetic, reasoning_gym)::

    "prompt_fingerprints": {"train": {"sha256": "9f86d0...", "num_prompts": 4096},
                            "val":   {"sha256": "2c26b4...", "num_prompts": 256}}

and a resume whose sets hash otherwise is refused, naming the set (``fingerprint_mismatch``).
``extra_info`` is left out: it is the scorer's, may hold values JSON cannot write, and the
prompt and answer it was made with are in the hash. 4,096 + 256 reasoning-gym prompts hash in
~25 ms.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from recipe.protocol import PromptRecord

FINGERPRINTS_KEY = "prompt_fingerprints"
"""The key of ``trainer_state.json`` that holds them."""
HEX_SHOWN = 12
"""Hex digits of a fingerprint shown in a message."""


def prompt_fingerprint(records: Sequence[PromptRecord]) -> str:
    """sha256 (hex) of the records' uids, prompts, ground truths and data sources, in order."""
    digest = hashlib.sha256()
    for record in records:
        fields = [record.uid, record.prompt, record.ground_truth, record.data_source]
        digest.update(json.dumps(fields, ensure_ascii=False, sort_keys=True).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def prompt_fingerprints(
    train: Sequence[PromptRecord], val: Sequence[PromptRecord]
) -> dict[str, dict[str, Any]]:
    """The fingerprint and size of each set, as a checkpoint stores them (JSON values)."""
    return {
        name: {"sha256": prompt_fingerprint(records), "num_prompts": len(records)}
        for name, records in (("train", train), ("val", val))
    }


def fingerprint_mismatch(
    saved: dict[str, Any], current: dict[str, Any], checkpoint: str
) -> str | None:
    """One line naming the first set whose prompts differ between the ``saved`` fingerprints
    of ``checkpoint`` and this run's ``current`` ones, and what differs; None when all match."""
    for name, now in current.items():
        then = saved.get(name)
        if then is None or then["sha256"] == now["sha256"]:
            continue
        sizes = (
            f"{now['num_prompts']} prompts in both"
            if then["num_prompts"] == now["num_prompts"]
            else f"{then['num_prompts']} prompts then, {now['num_prompts']} now"
        )
        return (
            f"data: the {name} prompts differ from those of checkpoint {checkpoint} (fingerprint "
            f"{then['sha256'][:HEX_SHOWN]}.. != {now['sha256'][:HEX_SHOWN]}.., {sizes}): the "
            "data files, data.* settings or the reasoning-gym version changed; resume with the "
            "same data or start a new run"
        )
    return None
