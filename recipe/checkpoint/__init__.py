"""Checkpoints of the whole run state and resuming from them.

``store`` writes ``checkpoints/step_N/`` atomically and finds the newest complete one;
``rng`` captures each process's RNG; ``ledger`` keeps the per-step prompt ledger; ``codec``
turns in-flight trajectories into JSON. What goes into a checkpoint is decided by the
recipes (recipe/run/checkpointing.py, and the loop state each recipe adds).
"""

from recipe.checkpoint.ledger import (
    LEDGER_FILE,
    StepLedger,
    num_filtered,
    num_skipped,
    num_trained,
    read_ledger,
)
from recipe.checkpoint.store import (
    MARKER,
    RUN_STATE_DIR,
    STATE_FILE,
    checkpoint_dir,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    read_state,
    resolve_resume,
    write_checkpoint,
)

__all__ = [
    "LEDGER_FILE",
    "MARKER",
    "RUN_STATE_DIR",
    "STATE_FILE",
    "StepLedger",
    "checkpoint_dir",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "num_filtered",
    "num_skipped",
    "num_trained",
    "read_ledger",
    "read_state",
    "resolve_resume",
    "write_checkpoint",
]
