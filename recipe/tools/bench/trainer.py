"""``python -m recipe.tools.bench.trainer``: our trainer's update and old log-probs beside a plain
PyTorch loop on the same batch, in the same run.

    batch : --prompts groups x --n responses; prompts of 8-16 random tokens, response lengths
            long-tailed (``longtail_lengths``: most short, ~1 in 10 near --response-length),
            GRPO advantages of random rewards; one optimizer step per update
    ours  : TrainerWorker (FSDP2 at world size 1, float32 master weights, model.dtype compute),
            micro-batches fixed (--micro-batch rows) and by token budget (--token-budget)
    plain : recipe.tools.bench.plain_trainer (HF model, autocast, fused AdamW), the same two plans

Each variant runs once to warm up, then --repeats times; medians are printed with real
tokens/s and MFU (recipe.tools.bench.flops; GPUs with a known peak). ``old_logprob_slot_s`` is ours
from the CPU-saved copy (what fully_async uses after a push: swap in, forward, swap back). The
last line is the headline: ours / plain on token-budget micro-batches (target <= 1.3).

CPU: ``python -m recipe.tools.bench.trainer`` (tiny default model). GPU: ``python -m
recipe.tools.bench.trainer --device cuda --model 0.5B`` (the e2e benchmark's 256-sample batch).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import logging
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from recipe.algo.advantages import grpo_advantages
from recipe.protocol import Trajectory
from recipe.tools.bench.flops import ModelFlops, device_peak_flops, mfu
from recipe.tools.bench.models import resolve_bench_model
from recipe.tools.bench.plain_trainer import PlainTrainer
from recipe.workers.rollout.requests import longtail_lengths
from recipe.workers.trainer.batch import TrainBatch
from recipe.workers.trainer.micro_batches import fixed_plan, token_budget_plan

logger = logging.getLogger(__name__)


def synthetic_batch(args: argparse.Namespace, vocab: int) -> TrainBatch:
    """The benchmark batch (module docstring), deterministic in ``args.seed``."""
    rng = random.Random(args.seed)
    trajs = []
    for p in range(args.prompts):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(8, 16))]
        lengths = longtail_lengths(args.seed * 1_000_003 + p, args.n, args.response_length)
        for i, length in enumerate(lengths):
            trajs.append(
                Trajectory(
                    prompt_uid=f"p{p}",
                    sample_index=i,
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(vocab) for _ in range(length)],
                    rollout_logprobs=[-rng.uniform(0.0, 3.0) for _ in range(length)],
                    token_versions=[0] * length,
                    finish_reason="length",
                    reward=float(rng.random() < 0.5),
                )
            )
    batch = TrainBatch.from_trajectories(trajs, pad_token_id=0)
    return batch.with_advantages(grpo_advantages(batch.rewards_b, batch.group_index_b))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _row(variant: str, plan: str, update: Callable, log_probs: Callable, args) -> dict:
    return {
        "variant": variant,
        "plan": plan,
        "update_s": timed(update, args.repeats, args.device),
        "old_logprob_s": timed(log_probs, args.repeats, args.device),
    }


def bench_plain(args, model_path: str, batch: TrainBatch, plans: dict) -> list[dict]:
    plain = PlainTrainer(model_path, args.device, chunk_size=args.chunk_size)
    rows = [
        _row(
            "plain",
            name,
            functools.partial(plain.update, batch, train_plan),
            functools.partial(plain.log_probs, batch, logprob_plan),
            args,
        )
        for name, (train_plan, logprob_plan) in plans.items()
    ]
    del plain
    _release()
    return rows


def bench_ours(args, model_path: str, batch: TrainBatch, compute_dtype: str) -> list[dict]:
    from recipe.workers.config import ActorConfig
    from recipe.workers.trainer.spec import TrainerSpec
    from recipe.workers.trainer.worker import TrainerWorker

    base = ActorConfig(
        lr=1e-6,
        ppo_mini_batch_size=args.prompts,
        ppo_micro_batch_size_per_gpu=args.micro_batch,
        ppo_max_token_len_per_gpu=args.token_budget,
        logprob_chunk_size=args.chunk_size,
    )
    spec = TrainerSpec(model_path, compute_dtype=compute_dtype)
    rows = []
    for name, dynamic in (("fixed", False), ("budget", True)):
        actor = dataclasses.replace(base, use_dynamic_bsz=dynamic)
        worker = TrainerWorker(actor, spec, device=args.device)
        try:
            old_bt = worker.compute_log_prob(batch)[0]
            decoupled = dataclasses.replace(batch, old_logprobs_bt=old_bt)
            update = functools.partial(worker.update_actor, decoupled)
            row = _row(
                "ours", name, update, functools.partial(worker.compute_log_prob, batch), args
            )
            worker.save_model_to_cpu("bench")
            from_slot = functools.partial(worker.compute_log_prob, batch, slot="bench")
            row["old_logprob_slot_s"] = timed(from_slot, args.repeats, args.device)
            rows.append(row)
            if args.profile and dynamic:
                print(profile_table(update, args.device), flush=True)
        finally:
            worker.close()
        del worker
        _release()
    return rows


def profile_table(fn: Callable[[], Any], device: str, row_limit: int = 25) -> str:
    """torch.profiler's op table of one ``fn()`` call, by device (else CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)


def add_rates(rows: list[dict], batch: TrainBatch, flops: ModelFlops, device: str) -> None:
    lengths = batch.attention_mask_bt.sum(dim=1)
    num_tokens, sum_sq = int(lengths.sum()), int((lengths**2).sum())
    peak = device_peak_flops(device)
    for row in rows:
        row["update_tokens_per_s"] = num_tokens / row["update_s"]
        row["update_mfu"] = mfu(flops.train_flops(num_tokens, sum_sq), row["update_s"], peak)
        row["old_logprob_mfu"] = mfu(
            flops.forward_flops(num_tokens, sum_sq), row["old_logprob_s"], peak
        )


def report(rows: list[dict], batch: TrainBatch) -> str:
    num_tokens = int(batch.attention_mask_bt.sum())
    lines = [
        f"batch: {batch.batch_size} sequences, {num_tokens} real tokens, "
        f"{batch.batch_size * batch.seq_len} when padded to the longest",
        f"{'variant':8} {'plan':7} {'update_s':>9} {'old_lp_s':>9} {'slot_lp_s':>10} "
        f"{'update tok/s':>13} {'upd MFU':>8} {'lp MFU':>7}",
    ]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    for r in rows:
        slot = f"{r['old_logprob_slot_s']:.3f}" if "old_logprob_slot_s" in r else "-"
        lines.append(
            f"{r['variant']:8} {r['plan']:7} {r['update_s']:9.3f} {r['old_logprob_s']:9.3f} "
            f"{slot:>10} {r['update_tokens_per_s']:13,.0f} {pct(r['update_mfu']):>8} "
            f"{pct(r['old_logprob_mfu']):>7}"
        )
    by = {(r["variant"], r["plan"]): r for r in rows}
    ours, plain = by[("ours", "budget")], by[("plain", "budget")]
    update_ratio = ours["update_s"] / plain["update_s"]
    logprob_ratio = ours["old_logprob_s"] / plain["old_logprob_s"]
    speedup = by[("ours", "fixed")]["update_s"] / ours["update_s"]
    lines.append(
        f"ours/plain on token-budget micro-batches: update {update_ratio:.2f}x, old log-probs "
        f"{logprob_ratio:.2f}x (target <= 1.3); ours token budget vs fixed rows: update "
        f"{speedup:.2f}x faster"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | 20M | 0.5B | 1.5B | 7B | PATH")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--prompts", type=int, default=16, help="prompt groups per batch")
    parser.add_argument("--n", type=int, default=16, help="responses per prompt")
    parser.add_argument("--response-length", type=int, default=384)
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per fixed micro-batch")
    parser.add_argument("--token-budget", type=int, default=16384, help="padded tokens per micro")
    parser.add_argument("--chunk-size", type=int, default=1024, help="rows per head chunk")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the rows there")
    parser.add_argument("--profile", action="store_true", help="op table of ours' update")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    model_path = str(resolve_bench_model(args.model))
    flops = ModelFlops.from_config(model_path)
    vocab = json.loads((resolve_bench_model(args.model) / "config.json").read_text())["vocab_size"]
    batch = synthetic_batch(args, vocab)
    lengths = batch.attention_mask_bt.sum(dim=1).tolist()
    plans = {
        "fixed": (fixed_plan(batch.batch_size, args.micro_batch),) * 2,
        "budget": (
            token_budget_plan(lengths, args.token_budget),
            token_budget_plan(lengths, 2 * args.token_budget),
        ),
    }
    compute_dtype = "bfloat16" if args.device == "cuda" else "float32"
    rows = bench_plain(args, model_path, batch, plans)
    rows += bench_ours(args, model_path, batch, compute_dtype)
    add_rates(rows, batch, flops, args.device)
    print(report(rows, batch), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
