"""A trainer rank's optimizer, LR schedule and RNG in a checkpoint directory.

    <dir>/optimizer.pt                 rank 0: the full, unsharded AdamW state + LR schedule
    <dir>/rng_trainer_rank<r>.json     every rank: its RNG streams

Full rather than per-rank shards, so a run can resume on another world size; the price is one
gathered copy of the optimizer state in rank 0's CPU memory. Every rank reads the full state
back and keeps its own shard. Both functions are collective over the default process group.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_train_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    path: str | Path,
    rank: int,
) -> None:
    """Write ``optimizer.pt`` (rank 0) and this rank's RNG file into ``path``."""
    from recipe.checkpoint.rng import capture_rng
    from recipe.checkpoint.store import write_json

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    out = Path(path)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        state = {"optimizer": optim_state, "scheduler": scheduler.state_dict()}
        torch.save(state, out / "optimizer.pt")
    _barrier()  # the directory exists before the other ranks write into it
    write_json(out / f"rng_trainer_rank{rank}.json", capture_rng())
    _barrier()


def load_train_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    path: str | Path,
    rank: int,
) -> None:
    """Set the optimizer, LR schedule and this rank's RNG from ``save_train_state``'s files."""
    from recipe.checkpoint.rng import restore_rng

    src = Path(path)
    state = torch.load(src / "optimizer.pt", map_location="cpu", weights_only=True)
    set_optimizer_state_dict(
        model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
    )
    scheduler.load_state_dict(state["scheduler"])
    rng_file = src / f"rng_trainer_rank{rank}.json"
    if rng_file.is_file():  # absent when the checkpoint came from a smaller world size
        restore_rng(json.loads(rng_file.read_text()))
