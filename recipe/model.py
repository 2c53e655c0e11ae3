"""The policy model: config schema (``model.*``) and ``HFModelConfig``, the loaded view of an
HF causal-LM directory that every component shares (tokenizer, generation config, ids).

``model.path`` empty means the embedded default: a tiny Qwen2-style model with a task
tokenizer, built locally and cached on first use (``recipe.tiny``). Real users pass the path
of any local HF causal-LM directory, the name of a real pretrained model of the catalog
(``python -m recipe.tools.models list``) or a ``.gguf`` file; the last two are converted into a
cached HF folder on first use (``recipe.models``). Nothing is downloaded from a model hub, so
a directory without weights or tokenizer files (a config-only or half-finished download)
fails at startup with what is missing and what is there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from recipe.models.convert import is_causal_lm_config
from recipe.models.store import read_provenance, resolve_model_path, unknown_model_hint
from recipe.utils.config_check import require_choice

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
TINY_WARM_STARTS = ("arithmetic", "calculator")
"""Tasks the embedded default model can come warm-started on (``recipe.tiny``)."""
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
"""Weight files transformers' ``from_pretrained`` (the trainer) and vLLM both load; sharded
checkpoints list theirs in ``*.index.json``."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "*.model",
    "vocab.json",
    "vocab.txt",
    "*.tiktoken",
    "tekken.json",
)
"""A tokenizer's vocabulary (fast, sentencepiece, BPE, WordPiece or tiktoken);
``tokenizer_config.json`` alone is not one."""
MAX_FILES_SHOWN = 8


@dataclass
class ModelConfig:
    path: str = ""
    """Local HF causal-LM directory, a catalog model's name (``python -m recipe.tools.models list``)
    or a ``.gguf`` file (both built into the cache on first use). Empty: the embedded tiny
    default (built and cached)."""
    tiny_warm_start: str = "arithmetic"
    """With ``path`` empty: the task the embedded tiny model is warm-started on,
    ``arithmetic`` (the default task) or ``calculator`` (the calculator environment's
    episodes; ``env=calculator`` sets it). Ignored when ``path`` is given."""
    dtype: str = "float32"
    """Parameter dtype of the trainer's master weights and of the rollout engine."""
    trust_remote_code: bool = False
    """Passed to transformers' ``from_pretrained``."""

    def __post_init__(self) -> None:
        require_choice("model.dtype", self.dtype, DTYPES)
        require_choice("model.tiny_warm_start", self.tiny_warm_start, TINY_WARM_STARTS)


def model_provenance(cfg: ModelConfig) -> dict[str, Any] | None:
    """Where ``model.path``'s weights came from, for the run's config.yaml: the build record
    of a catalog model or GGUF file (built here, before any worker starts, when it is not
    built yet); None for a plain folder or the tiny default."""
    return read_provenance(resolve_model_path(cfg.path)) if cfg.path else None


class ModelPathError(ValueError):
    """The model path is missing or is not an HF causal-LM directory."""


def _found(path: Path) -> str:
    """The directory's entries, for an error line (``a, b, c and 4 more``)."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(names[:MAX_FILES_SHOWN]) or "nothing"
    more = len(names) - MAX_FILES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _check_weight_files(path: Path, shown: str) -> None:
    """Raise ``ModelPathError`` unless ``path`` has weight files, every shard of its index."""
    indexes = sorted(path.glob("*.index.json"))
    for index in indexes:
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelPathError(f"model.path={shown!r}: unreadable {index.name} ({exc})") from exc
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ModelPathError(
                f"model.path={shown!r}: {index.name} names {len(shards)} weight files, "
                f"{len(missing)} of them missing ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}); found: {_found(path)}"
            )
    if not indexes and not any(any(path.glob(p)) for p in WEIGHT_FILES):
        raise ModelPathError(
            f"model.path={shown!r}: no model weights (expected {' or '.join(WEIGHT_FILES)}); "
            f"found: {_found(path)}"
        )


def _check_tokenizer_files(path: Path, shown: str) -> None:
    """Raise ``ModelPathError`` unless ``path`` holds a tokenizer vocabulary."""
    if any(any(path.glob(p)) for p in TOKENIZER_FILES):
        return
    tok_config = path / "tokenizer_config.json"
    if tok_config.is_file():
        try:
            auto_map = json.loads(tok_config.read_text()).get("auto_map") or {}
        except (OSError, ValueError, AttributeError):
            auto_map = {}
        if "AutoTokenizer" in auto_map:
            return  # remote-code tokenizers may build their vocabulary in code
    raise ModelPathError(
        f"model.path={shown!r}: no tokenizer files (expected tokenizer.json, tokenizer.model, "
        f"vocab.json + merges.txt, vocab.txt or *.tiktoken); found: {_found(path)}"
    )


class HFModelConfig:
    """A loaded, validated HF causal-LM directory.

    Construction checks the directory and its config (cheap); the tokenizer, generation
    config and processor load lazily and are cached.
    """

    def __init__(
        self, path: str | Path, *, dtype: str = "float32", trust_remote_code: bool = False
    ):
        self.path = Path(path).expanduser().resolve()
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        if not self.path.exists():
            raise ModelPathError(
                f"model.path={str(path)!r}: no such directory{unknown_model_hint(str(path))}"
            )
        if not self.path.is_dir():
            raise ModelPathError(f"model.path={str(path)!r}: not a directory")
        if not (self.path / "config.json").is_file():
            raise ModelPathError(
                f"model.path={str(path)!r}: no config.json, so not a Hugging Face model directory"
            )
        self.hf_config = self._load_hf_config()
        _check_weight_files(self.path, str(path))
        _check_tokenizer_files(self.path, str(path))

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> HFModelConfig:
        """Resolve ``model.*``: the given path, or the embedded default built on first use."""
        if cfg.path:
            path = resolve_model_path(cfg.path)
        elif cfg.tiny_warm_start == "calculator":
            from recipe.tiny.calculator import ensure_calculator_model

            path = ensure_calculator_model()
        else:
            from recipe.tiny import ensure_tiny_model

            path = ensure_tiny_model()
        return cls(path, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)

    def _load_hf_config(self) -> Any:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except (ValueError, KeyError, OSError, json.JSONDecodeError) as exc:
            raise ModelPathError(
                f"model.path={str(self.path)!r}: unreadable config.json ({exc})"
            ) from exc
        if not is_causal_lm_config(config):
            raise ModelPathError(
                f"model.path={str(self.path)!r}: model_type={config.model_type!r} is not a "
                "causal LM (AutoModelForCausalLM cannot load it)"
            )
        return config

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        except (ValueError, OSError) as exc:
            raise ModelPathError(
                f"model.path={str(self.path)!r}: no usable tokenizer ({exc})"
            ) from exc
        if tok.pad_token_id is None and self.pad_token_id is not None:
            tok.pad_token_id = self.pad_token_id
        return tok

    @cached_property
    def generation_config(self) -> Any | None:
        """The directory's ``generation_config.json``, or None when it has none."""
        from transformers import GenerationConfig

        if not (self.path / "generation_config.json").is_file():
            return None
        return GenerationConfig.from_pretrained(self.path)

    def get_processor(self) -> Any:
        """The multimodal processor when the directory has one, else the tokenizer."""
        from transformers import AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(
                self.path, trust_remote_code=self.trust_remote_code
            )
        except (ValueError, OSError, TypeError, KeyError):
            return self.tokenizer
        # AutoProcessor hands back the tokenizer itself for text-only models.
        return processor if hasattr(processor, "tokenizer") else self.tokenizer

    @cached_property
    def eos_token_ids(self) -> list[int]:
        """Stop ids: generation_config's ``eos_token_id`` (int or list), else the tokenizer's."""
        gen = self.generation_config
        ids = getattr(gen, "eos_token_id", None) if gen is not None else None
        if ids is None:
            ids = self._tokenizer_ids("eos_token_id")
        if ids is None:
            raise ModelPathError(
                f"model.path={str(self.path)!r}: no eos_token_id in generation_config or tokenizer"
            )
        return [ids] if isinstance(ids, int) else list(ids)

    @property
    def eos_token_id(self) -> int:
        return self.eos_token_ids[0]

    @cached_property
    def pad_token_id(self) -> int:
        """generation_config's ``pad_token_id``, else the tokenizer's, else the first eos id."""
        gen = self.generation_config
        pad = getattr(gen, "pad_token_id", None) if gen is not None else None
        if pad is None:
            pad = self._tokenizer_ids("pad_token_id")
        if pad is None:
            pad = self.eos_token_ids[0]
        return pad[0] if isinstance(pad, list) else pad

    def _tokenizer_ids(self, attr: str) -> Any:
        # Read through __dict__ to avoid recursing into the tokenizer property while it builds.
        tok = self.__dict__.get("tokenizer")
        if tok is None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.path, trust_remote_code=self.trust_remote_code)
        return getattr(tok, attr, None)

    def __repr__(self) -> str:
        return f"HFModelConfig(path={str(self.path)!r}, model_type={self.hf_config.model_type!r})"
