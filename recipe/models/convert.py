"""GGUF file -> Hugging Face causal-LM folder (safetensors, tokenizer, chat template).

    inspect_gguf   the header only: a GGUF? a model (not an adapter or projector)? weights?
                   an architecture transformers can load? a tokenizer?    no: ModelBuildError
    convert_gguf   transformers dequantizes every tensor (Q4/Q5/Q6/Q8 blocks -> float),
                   rebuilds the fast tokenizer and the chat template from the GGUF's
                   metadata; saved in ``dtype`` with the quantizer stripped, so the folder
                   is a plain checkpoint that the trainer and vLLM both load.

The weights come out of 4-bit storage: a real pretrained model with rounding noise, not
bit-for-bit the publisher's float checkpoint. Needs the ``models`` extra (``gguf``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.models.errors import ModelBuildError

logger = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")
MODEL_TYPES = ("model",)
"""``general.type`` of a GGUF holding a model; others are ``adapter`` (LoRA), ``mmproj``..."""
NOT_ARCHITECTURES = ("general", "tokenizer")
"""Keys of transformers' GGUF mapping that are metadata groups, not architectures."""
INSTALL_HINT = "pip install 'fully-async-rl[models]'"


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """What a GGUF file's header says about it."""

    architecture: str
    file_type: str
    """The quantisation, e.g. ``MOSTLY_Q4_1`` (llama.cpp's ``general.file_type``)."""
    name: str
    num_tensors: int


def require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelBuildError(f"converting a GGUF needs the gguf package: {INSTALL_HINT}") from None
    return gguf


def supported_architectures() -> list[str]:
    """GGUF architectures the installed transformers converts (empty if it cannot say)."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return []
    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in NOT_ARCHITECTURES)


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read ``path``'s header; ``ModelBuildError`` unless it is a convertible model."""
    gguf = require_gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise ModelBuildError(f"{path}: not a readable GGUF file ({exc})") from None
    fields = {
        key: field.contents()
        for key, field in reader.fields.items()
        if key.startswith(("general.", "tokenizer.ggml.model"))
    }
    kind = fields.get("general.type", "model")  # files from before the key are models
    if kind not in MODEL_TYPES:
        raise ModelBuildError(
            f"{path}: a GGUF of type {kind!r} (general.type), not a causal LM; give a model file"
        )
    arch = fields.get("general.architecture", "")
    known = supported_architectures()
    if known and arch not in known:
        raise ModelBuildError(
            f"{path}: architecture {arch!r} is not one the converter knows (transformers "
            f"{_transformers_version()} converts {', '.join(known)})"
        )
    if not reader.tensors:
        raise ModelBuildError(f"{path}: holds no tensors (a vocabulary-only GGUF?), no weights")
    if "tokenizer.ggml.model" not in fields:
        raise ModelBuildError(f"{path}: has no tokenizer (no tokenizer.ggml.* metadata)")
    file_type = fields.get("general.file_type")
    return GGUFInfo(
        architecture=arch,
        file_type=gguf.LlamaFileType(file_type).name if file_type is not None else "unknown",
        name=str(fields.get("general.name", path.stem)),
        num_tensors=len(reader.tensors),
    )


def is_causal_lm_config(config: Any) -> bool:
    """Whether ``AutoModelForCausalLM`` loads a model of this (transformers) config."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return True
    # Remote-code models name their causal-LM class in auto_map.
    return "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})


def convert_gguf(path: Path, out_dir: Path, *, dtype: str = "bfloat16") -> dict[str, Any]:
    """Write ``path`` as an HF folder into ``out_dir``; returns what the folder holds (for the
    provenance record). ``ModelBuildError`` for a file transformers cannot convert."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ModelBuildError(f"dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    info = inspect_gguf(path)
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    try:
        config = AutoConfig.from_pretrained(**where)
    except (ValueError, KeyError) as exc:
        raise ModelBuildError(f"{path}: transformers cannot read its config ({exc})") from None
    if not is_causal_lm_config(config):
        raise ModelBuildError(
            f"{path}: architecture {info.architecture!r} converts to {type(config).__name__}, "
            "which is not a causal LM"
        )
    logger.info("converting %s (%s, %s) to %s", path.name, info.architecture, info.file_type, dtype)
    tokenizer = AutoTokenizer.from_pretrained(**where)
    model = AutoModelForCausalLM.from_pretrained(**where, dtype=getattr(torch, dtype))
    _strip_quantizer(model)
    model.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "architecture": info.architecture,
        "model_type": model.config.model_type,
        "gguf_quantization": info.file_type,
        "gguf_name": info.name,
        "dtype": dtype,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "transformers_version": _transformers_version(),
        "gguf_version": _gguf_version(),
    }


def _strip_quantizer(model: Any) -> None:
    # The weights are dequantized already; left in place, the GGUF quantizer config would make
    # loaders look for the .gguf file again.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"
