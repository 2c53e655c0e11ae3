"""``AdapterIO``: one trainer rank's LoRA adapter, gathered, exported and checkpointed.

state_dict()            full adapter tensors under PEFT's names on rank 0 (only the
                        adapter is gathered, never the frozen base)      collective
export(directory)       rank 0 writes the PEFT folder (recipe.utils.adapter_file)
save_checkpoint(path)   <path>/adapter/ + <path>/base_model.json          collective
load_checkpoint(path)   refuses another base, then copies the adapter in (every rank
                        reads the folder and keeps its shards)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from recipe.utils.adapter_file import ADAPTER_WEIGHTS_NAME, AdapterFile, write_adapter
from recipe.workers.config import LoraConfig
from recipe.workers.trainer.fsdp_utils import (
    PolicyModule,
    iter_full_tensors,
    load_full_state_dict,
    reshard_all,
)
from recipe.workers.trainer.lora import (
    ADAPTER_DIR,
    BASE_RECORD_NAME,
    base_record,
    check_same_base,
    is_adapter_name,
    live_name,
    peft_config_dict,
    peft_name,
)


class AdapterIO:
    """The adapter of ``policy`` (peft layers injected by ``apply_lora``) on rank ``rank``."""

    def __init__(
        self, policy: PolicyModule, cfg: LoraConfig, base_path: str, rank: int, world_size: int
    ):
        self._policy, self._cfg, self._base_path = policy, cfg, base_path
        self._rank, self._world_size = rank, world_size
        self._base: dict[str, object] | None = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full adapter tensors under PEFT's names, on CPU on rank 0 (empty elsewhere)."""
        reshard_all(self._policy)
        tensors = {}
        for name, tensor in iter_full_tensors(self._policy.lm, keep=is_adapter_name):
            if self._rank == 0:
                tensors[peft_name(name)] = tensor.to("cpu", copy=True)
        return tensors

    def export(self, directory: str | Path, dtype: torch.dtype | None = None) -> AdapterFile | None:
        """Rank 0 writes the PEFT folder and returns its record; other ranks None. ``dtype``:
        the tensors cast to it (a push: the engines' dtype); None keeps the master weights'
        (a checkpoint, which a resume must restore exactly)."""
        tensors = self.state_dict()
        if self._rank != 0:
            return None
        if dtype is not None:
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        return write_adapter(tensors, peft_config_dict(self._cfg, self._base_path), directory)

    def save_checkpoint(self, path: str | Path) -> None:
        """The adapter folder plus ``base_model.json`` (the base's path, build record and
        weights' sha256) into ``path``."""
        out = Path(path)
        if self._rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        self.export(out / ADAPTER_DIR)
        if self._rank == 0:
            record = json.dumps(self.base_record(), indent=2, sort_keys=True)
            (out / BASE_RECORD_NAME).write_text(record)
        if self._world_size > 1:
            dist.barrier()

    def base_record(self) -> dict[str, object]:
        if self._base is None:  # hashed once per run: the base never changes under it
            self._base = base_record(self._base_path)
        return self._base

    def load_checkpoint(self, path: str | Path) -> None:
        """The adapter of ``save_checkpoint``'s folder; ``ValueError`` naming both bases when
        it was trained on another one."""
        from safetensors.torch import load_file

        check_same_base(Path(path), self.base_record())
        saved = load_file(str(Path(path) / ADAPTER_DIR / ADAPTER_WEIGHTS_NAME))
        reshard_all(self._policy)
        load_full_state_dict(
            self._policy.lm, {live_name(k): v for k, v in saved.items()}, only=is_adapter_name
        )
