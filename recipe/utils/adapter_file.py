"""LoRA adapter folders in PEFT's format: what the trainer exports and engines load by path.

    writer: write_adapter(tensors, config, directory) -> AdapterFile(path, num_bytes, sha256, ...)
            the folder is written aside as <directory>.partial/ (files 0600), then renamed:
            a reader never sees half a folder
            --(Ray: the record, never the tensors)-->
    reader: verify_adapter_folder(adapter) -> the folder is the one written, byte for byte,
            or WeightsFileError naming it; then ``LoRARequest(lora_path=adapter.path)`` or
            ``peft.PeftModel.from_pretrained(base, adapter.path)``

The folder holds exactly the two files vLLM's ``PEFTHelper.from_local_dir`` and
``LoRAModel.from_local_checkpoint`` read: ``adapter_config.json`` (PEFT's ``LoraConfig`` as a
dict: ``r``, ``lora_alpha``, ``target_modules``, ``bias='none'``, no DoRA, no
``modules_to_save``) and ``adapter_model.safetensors`` (PEFT's names,
``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``, without the adapter name).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.utils.weights_file import PARTIAL_SUFFIX, WeightsFileError, file_sha256

if TYPE_CHECKING:  # torch only in annotations
    import torch

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
_REPLACED_SUFFIX = ".replaced"


@dataclass(frozen=True, slots=True)
class AdapterFile:
    """A written adapter folder, as its writer recorded it (travels over Ray)."""

    path: str
    """The folder (``lora_path`` for vLLM, ``model_id`` for ``PeftModel.from_pretrained``)."""
    num_bytes: int
    """Bytes of the adapter tensors (not of the files): what a push moves."""
    sha256: str
    """Of ``adapter_model.safetensors``."""
    config_sha256: str
    """Of ``adapter_config.json``."""
    rank: int
    """LoRA rank ``r`` (an engine's ``max_lora_rank`` must be at least this)."""
    alpha: float
    """``lora_alpha``: the update is scaled by ``alpha / rank``."""
    target_modules: tuple[str, ...]
    """Module names the adapter wraps (``q_proj``, ...)."""

    @property
    def weights_path(self) -> str:
        return os.path.join(self.path, ADAPTER_WEIGHTS_NAME)

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, ADAPTER_CONFIG_NAME)


def write_adapter(
    tensors: dict[str, torch.Tensor], config: dict[str, Any], directory: str | Path
) -> AdapterFile:
    """Write a PEFT adapter folder at ``directory`` from its tensors (PEFT's names) and its
    ``LoraConfig`` as a dict; written aside and renamed, replacing an earlier folder there."""
    from safetensors.torch import save_file

    if not tensors:
        raise ValueError(f"adapter for {directory} has no tensors: is the model wrapped by peft?")
    final = Path(directory)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True, mode=0o700)
    weights = partial / ADAPTER_WEIGHTS_NAME
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    config_file = partial / ADAPTER_CONFIG_NAME
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True, default=_json_default))
    for written in (weights, config_file):
        os.chmod(written, 0o600)
    record = AdapterFile(
        path=str(final),
        num_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        sha256=file_sha256(weights),
        config_sha256=file_sha256(config_file),
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=tuple(sorted(config["target_modules"])),
    )
    _swap_in(partial, final)
    return record


def _swap_in(partial: Path, final: Path) -> None:
    # A directory cannot be renamed onto a non-empty one: the old folder moves aside first,
    # so a reader sees the old folder, then (briefly) none, then the new one; never half.
    replaced = final.with_name(final.name + _REPLACED_SUFFIX)
    if final.exists():
        if replaced.exists():
            shutil.rmtree(replaced)
        os.replace(final, replaced)
    os.replace(partial, final)
    if replaced.exists():
        shutil.rmtree(replaced)


def _json_default(value: object) -> object:
    if isinstance(value, set | frozenset):  # LoraConfig.target_modules is a set
        return sorted(value)
    raise TypeError(f"adapter config value {value!r} is not JSON")


def verify_adapter_folder(adapter: AdapterFile) -> None:
    """Raise ``WeightsFileError`` unless this node sees ``adapter.path`` with both files as
    their writer recorded them."""
    for path, sha256 in (
        (adapter.weights_path, adapter.sha256),
        (adapter.config_path, adapter.config_sha256),
    ):
        if not os.path.isfile(path):
            raise WeightsFileError(
                f"adapter file {path} does not exist on this node: its folder must be one "
                "every node reads (a shared filesystem)"
            )
        seen = file_sha256(path)
        if seen != sha256:
            raise WeightsFileError(
                f"adapter file {path} has sha256 {seen[:16]}... here but {sha256[:16]}... as "
                "written: it was cut, changed or has not fully reached this node"
            )


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    """The ``adapter_config.json`` of a PEFT folder, or ``ValueError`` naming the folder."""
    path = Path(directory) / ADAPTER_CONFIG_NAME
    if not path.is_file():
        raise ValueError(f"{directory} is not a PEFT adapter folder: no {ADAPTER_CONFIG_NAME}")
    config: dict[str, Any] = json.loads(path.read_text())
    return config
