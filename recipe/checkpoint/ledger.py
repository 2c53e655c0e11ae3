"""``ledger.jsonl``: which prompts each trainer step trained, the run's prompt ledger of record.

    {"step": 7, "param_version": 3, "trained": ["train-000412", "train-003107", ...],
     "filtered": ["train-000077"]}            (dynamic sampling only: groups filtered out)
    {"step": 8, "param_version": 4, "trained": [], "skipped": ["train-000981", ...]}
                                              (every optimizer step of the trainer step had a
                                               non-finite gradient norm: nothing was applied)

One line per trainer step, appended and flushed by the driver right after the step's metrics.
On resume the lines past the checkpoint's step are dropped (like ``metrics.jsonl``): those
updates died with the crashed process (the resumed weights never saw them) and are trained
again, so the file after a resume still lists what the final weights were trained on, and
"every prompt exactly once" is checked on it alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

LEDGER_FILE = "ledger.jsonl"


class StepLedger:
    """Appends one line per trainer step to ``run_dir/ledger.jsonl``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LEDGER_FILE

    def append(
        self,
        step: int,
        param_version: int,
        trained_uids: Sequence[str],
        filtered_uids: Sequence[str] = (),
        skipped_uids: Sequence[str] = (),
    ) -> None:
        """``filtered_uids``: prompts generated for this step whose groups were filtered
        (``algorithm.filter_groups``); ``skipped_uids``: prompts of a step whose update was
        skipped (non-finite gradients). Each key is written only when there are some."""
        record: dict = {"step": step, "param_version": param_version, "trained": list(trained_uids)}
        if filtered_uids:
            record["filtered"] = list(filtered_uids)
        if skipped_uids:
            record["skipped"] = list(skipped_uids)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


def read_ledger(run_dir: Path) -> list[dict]:
    """The ledger's records in file order (a torn last line is skipped)."""
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            logger.warning("%s: skipping a torn line", path)
    return records


def num_trained(run_dir: Path) -> int:
    """Prompts the ledger records as trained, over the whole run."""
    return sum(len(record.get("trained", [])) for record in read_ledger(run_dir))


def num_skipped(run_dir: Path) -> int:
    """Prompts the ledger records as skipped (their step's update was not applied)."""
    return sum(len(record.get("skipped", [])) for record in read_ledger(run_dir))


def num_filtered(run_dir: Path) -> int:
    """Prompts the ledger records as filtered (dynamic sampling), over the whole run."""
    return sum(len(record.get("filtered", [])) for record in read_ledger(run_dir))
