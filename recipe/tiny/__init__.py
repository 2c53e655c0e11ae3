"""The embedded default models, built locally and cached on first use (nothing downloaded).

``ensure_tiny_model()``: the tiny Qwen2-style model warm-started on the arithmetic task, the
default of ``model.path`` (``recipe.tiny.arithmetic``). ``ensure_calculator_model()``: the
same model warm-started further on the calculator task's episodes, the default under
``model.tiny_warm_start=calculator`` (``recipe.tiny.calculator``). ``python -m recipe.tiny``
builds (once) and prints the first; ``python -m recipe.tiny.calculator`` the second.
"""

from recipe.tiny.arithmetic import TinySpec, ensure_tiny_model
from recipe.tiny.cache import (
    BUILD_ENV,
    META_FILE,
    default_cache_dir,
    publish_dir,
    read_tiny_meta,
    weights_sha256,
)
from recipe.tiny.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer

__all__ = [
    "BUILD_ENV",
    "EOS_TOKEN",
    "META_FILE",
    "PAD_TOKEN",
    "TinySpec",
    "build_tokenizer",
    "default_cache_dir",
    "ensure_tiny_model",
    "publish_dir",
    "read_tiny_meta",
    "weights_sha256",
]
