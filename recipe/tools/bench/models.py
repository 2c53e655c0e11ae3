"""Random-init Qwen2-family models at real sizes, built locally for the benchmarks.

    random_model_path("0.5B")  ->  <cache>/bench-models/qwen2-0.5B-random-v1/   (HF folder)

The shapes are Qwen2.5's (0.5B, 1.5B, 7B; vocabulary 151,936 / 152,064) so compute and memory
match the real models; the weights are random (seeded) and the tokenizer is the tiny default's
byte-level BPE (258 tokens). Token ids the model samples above the tokenizer's vocabulary are
fine: the engines do not detokenize (the rollout worker decodes, and unknown ids decode to
nothing), and a random model almost never samples EOS, so response lengths are set by the
workload (``rollout.length_profile``). ``20M`` is a CPU-sized model with the full vocabulary
for tests. Nothing is downloaded; a folder appears by atomic rename once complete.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipe.tiny import build_tokenizer, default_cache_dir, publish_dir

logger = logging.getLogger(__name__)

BUILDER_VERSION = 1
META_FILE = "bench_model_meta.json"


@dataclass(frozen=True)
class Qwen2Shape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool


SHAPES: dict[str, Qwen2Shape] = {
    "20M": Qwen2Shape(128, 512, 2, 2, 1, 151936, True),
    "0.5B": Qwen2Shape(896, 4864, 24, 14, 2, 151936, True),
    "1.5B": Qwen2Shape(1536, 8960, 28, 12, 2, 151936, True),
    "7B": Qwen2Shape(3584, 18944, 28, 28, 4, 152064, False),
}


def random_model_path(size: str, cache_dir: Path | None = None, *, seed: int = 0) -> Path:
    """The cached random-init model of ``size`` (a key of ``SHAPES``), built on first use."""
    if size not in SHAPES:
        raise ValueError(f"unknown benchmark model size {size!r}: allowed {sorted(SHAPES)}")
    from filelock import FileLock

    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "bench-models"
    root.mkdir(parents=True, exist_ok=True)
    name = f"qwen2-{size}-random-v{BUILDER_VERSION}-seed{seed}"
    final = root / name
    if (final / META_FILE).is_file():
        return final
    with FileLock(str(root / f"{name}.lock")):
        if (final / META_FILE).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            _build(SHAPES[size], size, seed, tmp)
            publish_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(shape: Qwen2Shape, size: str, seed: int, out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    start = time.perf_counter()
    tokenizer = build_tokenizer(out_dir, model_max_length=4096)
    config = Qwen2Config(
        **{k: v for k, v in asdict(shape).items()},
        head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="bfloat16",
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir)
    meta: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "size": size,
        "seed": seed,
        "shape": asdict(shape),
        "num_params": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "built random %s model (%d params) in %.1fs",
        size,
        meta["num_params"],
        meta["build_seconds"],
    )


def resolve_bench_model(name: str) -> Path:
    """``tiny`` (the embedded default), a size of ``SHAPES``, or a model folder."""
    if name == "tiny":
        from recipe.tiny import ensure_tiny_model

        return ensure_tiny_model()
    if name in SHAPES:
        return random_model_path(name)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model={name!r} is neither 'tiny', a size in {sorted(SHAPES)}, nor a model folder "
            "with config.json"
        )
    return path
