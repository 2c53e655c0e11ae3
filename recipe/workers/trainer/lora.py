"""LoRA on the FSDP2 trainer (``actor.lora``): peft's adapter layers, their PEFT names, the base.

    HF causal LM --apply_lora--> the same LM with peft's LoRA layers injected in place
                                 (before ``fully_shard``: FSDP2 then shards base and adapter)
                                 only ``lora_A`` / ``lora_B`` require grad; the optimizer and
                                 the weight slots hold them alone
    live names   model.layers.0.self_attn.q_proj.lora_A.default.weight
    PEFT names   base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
                 (what ``adapter_model.safetensors`` holds: ``peft_name``)

A checkpoint of a LoRA run holds the adapter folder and ``base_model.json``: the base's path,
its build record (``recipe.models``) and the sha256 of its weight files, so that a resume onto
another base is refused instead of training an adapter on weights it was not made for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from recipe.utils.weights_file import file_sha256
from recipe.workers.config import LoraConfig

ADAPTER_NAME = "default"
"""peft's name of the one adapter we train (dropped from the names of a PEFT folder)."""
BASE_RECORD_NAME = "base_model.json"
ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's PEFT adapter folder, beside ``base_model.json``."""
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
T = TypeVar("T")


def peft_config_dict(cfg: LoraConfig, base_path: str) -> dict[str, Any]:
    """``adapter_config.json``: peft's ``LoraConfig`` of ``cfg`` as a dict."""
    return dict(_peft_config(cfg, base_path).to_dict())


def _peft_config(cfg: LoraConfig, base_path: str) -> Any:
    import peft

    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


def apply_lora(lm: nn.Module, cfg: LoraConfig, base_path: str) -> None:
    """Inject ``cfg``'s adapter into ``lm`` in place; only the adapter then requires grad.
    peft initialises ``lora_B`` to zero: the adapted LM starts as the base."""
    import peft

    peft.inject_adapter_in_model(_peft_config(cfg, base_path), lm, adapter_name=ADAPTER_NAME)
    lm.requires_grad_(False)
    adapted = [p for name, p in lm.named_parameters() if is_adapter_name(name)]
    if not adapted:
        raise ValueError(
            f"actor.lora.target_modules={list(cfg.target_modules)} matched no module of "
            f"{type(lm).__name__}: name its linear layers (e.g. q_proj, v_proj)"
        )
    for param in adapted:
        param.requires_grad_(True)
    for module in _dropouts(lm):  # on only in the forwards that train (adapter_dropout)
        module.eval()


@contextmanager
def adapter_dropout(lm: nn.Module) -> Iterator[None]:
    """The adapter's dropout (``actor.lora.dropout``) on inside the block, off outside it:
    it acts in the forwards that train, never in those that compute old or reference
    log-probs (which must be the policy's deterministic function)."""
    dropouts = _dropouts(lm)
    for module in dropouts:
        module.train()
    try:
        yield
    finally:
        for module in dropouts:
            module.eval()


def _dropouts(lm: nn.Module) -> list[nn.Module]:
    suffix = f"lora_dropout.{ADAPTER_NAME}"
    return [module for name, module in lm.named_modules() if name.endswith(suffix)]


def is_adapter_name(name: str) -> bool:
    """Whether a live state-dict name is an adapter tensor."""
    return ".lora_A." in name or ".lora_B." in name


def peft_name(name: str) -> str:
    """The PEFT-folder name of a live adapter tensor name."""
    return "base_model.model." + name.replace(f".{ADAPTER_NAME}.", ".")


def live_name(name: str) -> str:
    """The live name of a PEFT-folder tensor name (``peft_name``'s inverse)."""
    stem = name.removeprefix("base_model.model.")
    for part in ("lora_A", "lora_B"):
        stem = stem.replace(f".{part}.", f".{part}.{ADAPTER_NAME}.")
    return stem


def base_record(base_path: str) -> dict[str, Any]:
    """The base a checkpoint's adapter was trained on: path, build record, weights' sha256."""
    from recipe.models.store import read_provenance

    return {
        "path": base_path,
        "provenance": read_provenance(Path(base_path)),
        "weights_sha256": base_weights_sha256(base_path),
    }


def base_weights_sha256(base_path: str) -> dict[str, str]:
    """sha256 of each weight file of an HF folder, by file name."""
    files = sorted(p for p in Path(base_path).iterdir() if p.name.endswith(_WEIGHT_SUFFIXES))
    return {p.name: file_sha256(p) for p in files}


def check_same_base(checkpoint: Path, base: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming both bases unless ``checkpoint``'s adapter was trained on
    the base ``base`` (``base_record`` of this run's ``model.path``)."""
    record_file = checkpoint / BASE_RECORD_NAME
    if not record_file.is_file():
        raise ValueError(
            f"checkpoint {checkpoint} has no {BASE_RECORD_NAME}: it is not a LoRA checkpoint "
            "(resume it with actor.lora.rank=0)"
        )
    saved = json.loads(record_file.read_text())
    if saved.get("weights_sha256") != base["weights_sha256"]:
        raise ValueError(
            f"checkpoint {checkpoint} holds an adapter of the base {saved.get('path')} "
            f"({_short(saved.get('weights_sha256'))}), not of model.path={base['path']} "
            f"({_short(base['weights_sha256'])}): resume onto the base it was trained on"
        )


def _short(sha256s: object) -> str:
    if not isinstance(sha256s, dict) or not sha256s:
        return "no weight files"
    return "sha256 " + ",".join(str(v)[:12] for _, v in sorted(sha256s.items()))


def merged_stream(
    items: Iterable[tuple[str, T]], merge: Callable[[T, T, T], T]
) -> Iterator[tuple[str, T]]:
    """The HF-named stream of a LoRA LM's live (name, value) stream: each adapted module's
    ``base_layer.weight``, ``lora_A`` and ``lora_B`` become one ``<module>.weight`` =
    ``merge(weight, A, B)`` (its bias kept), yielded where its last part arrives; the rest
    passes through. Used on tensors (a full push of the merged policy) and on metadata alike,
    so both list the same names in the same order."""
    held: dict[str, dict[str, T]] = {}
    for name, value in items:
        if ".base_layer." in name:
            prefix, leaf = name.split(".base_layer.", 1)
            held.setdefault(prefix, {})[leaf] = value
            continue
        if not is_adapter_name(name):
            yield name, value
            continue
        prefix, rest = name.split(".lora_", 1)
        group = held.setdefault(prefix, {})
        group[rest[0]] = value  # "A" or "B"
        if {"A", "B", "weight"} <= group.keys():
            del held[prefix]
            yield f"{prefix}.weight", merge(group["weight"], group["A"], group["B"])
            if "bias" in group:
                yield f"{prefix}.bias", group["bias"]
    assert not held, f"adapted modules without all their parts: {sorted(held)[:3]}"


def merge_delta(
    cfg: LoraConfig,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``W + (alpha / rank) * B @ A``, in W's dtype: what peft's ``merge_and_unload`` gives."""
    scaling = cfg.alpha / cfg.rank

    def merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        delta = (b.to(torch.float32) @ a.to(torch.float32)) * scaling
        return (weight.to(torch.float32) + delta).to(weight.dtype)

    return merge
