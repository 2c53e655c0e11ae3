"""``python -m recipe.tools.bench.rollout``: our rollout worker against plain vLLM, tokens/s.

    plain:  vllm.LLM(...).generate(prompts, SamplingParams)     in a process of its own
    ours:   VLLMRolloutWorker as a Ray actor, one GenerationRequest per prompt group,
            all groups in flight at once (how the rollouters drive it)

Both sides get the same model, engine settings, prompts and sampling parameters (temperature,
top-p, seed per request, ``logprobs=0``, EOS ignored so both generate the same number of tokens,
no detokenisation in the engine) and run the same workload ``--repeats`` times after one warm-up
pass; the plain engine is shut down before ours starts, so they never share the device.
Workloads: ``fixed`` (every response ``--max-tokens`` long; plain uses ``n`` per prompt) and
``longtail`` (per-response budgets from ``longtail_lengths``, the e2e benchmark's workload;
plain gets one request per response with its own budget). The last line is the headline:
ours / plain generated tokens per second (target >= 0.95).

CPU: ``python -m recipe.tools.bench.rollout`` (tiny default model). GPU: ``python -m
recipe.tools.bench.rollout --device cuda --model 0.5B --prompts 256 --max-tokens 512``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import random
import statistics
import time
from typing import Any

from recipe.tools.bench.models import resolve_bench_model
from recipe.workers.rollout.requests import longtail_lengths

logger = logging.getLogger(__name__)


def workload(args: argparse.Namespace, vocab: int) -> list[dict[str, Any]]:
    """Per prompt group: prompt ids, per-response budgets and a seed (same for both sides)."""
    rng = random.Random(args.seed)
    groups = []
    for i in range(args.prompts):
        ids = [rng.randrange(vocab) for _ in range(args.prompt_len)]
        if args.workload == "longtail":
            budgets = longtail_lengths(args.seed * 1_000_003 + i, args.n, args.max_tokens)
        else:
            budgets = [args.max_tokens] * args.n
        groups.append({"prompt_ids": ids, "budgets": budgets, "seed": args.seed + i})
    return groups


def engine_kwargs(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    return dict(
        model=model_path,
        dtype=args.dtype,
        seed=args.seed,
        enforce_eager=_eager(args),
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=True,
        logprobs_mode="raw_logprobs",
    )


def _plain_main(conn: Any, args: argparse.Namespace, model_path: str, groups: list) -> None:
    """Child process: plain ``LLM.generate`` over the workload; sends the timings back."""
    try:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.cpu_kv_cache_gib))
        from vllm import LLM, SamplingParams

        llm = LLM(**engine_kwargs(args, model_path), disable_log_stats=True)

        def requests() -> tuple[list[dict], list[Any]]:
            prompts, params = [], []
            for g in groups:
                common = dict(
                    temperature=args.temperature,
                    top_p=args.top_p,
                    logprobs=0,
                    ignore_eos=True,
                    detokenize=False,
                )
                if args.workload == "fixed":
                    prompts.append({"prompt_token_ids": g["prompt_ids"]})
                    params.append(
                        SamplingParams(
                            n=args.n, max_tokens=args.max_tokens, seed=g["seed"], **common
                        )
                    )
                else:
                    for j, budget in enumerate(g["budgets"]):
                        prompts.append({"prompt_token_ids": g["prompt_ids"]})
                        params.append(
                            SamplingParams(
                                n=1, max_tokens=budget, seed=g["seed"] * 64 + j, **common
                            )
                        )
            return prompts, params

        prompts, params = requests()
        times, tokens = [], 0
        for rep in range(args.repeats + 1):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
            if rep > 0:  # the first pass warms up (compilation, allocator, caches)
                times.append(elapsed)
        conn.send({"tokens": tokens, "times": times})
    except BaseException as exc:  # report instead of hanging the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        raise


def run_plain(args: argparse.Namespace, model_path: str, groups: list) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_plain_main, args=(child, args, model_path, groups))
    proc.start()
    if not parent.poll(args.timeout_s):
        proc.kill()
        raise TimeoutError(f"plain vLLM gave no result within {args.timeout_s:.0f}s")
    result = parent.recv()
    proc.join(60)
    if "error" in result:
        raise RuntimeError(f"plain vLLM failed: {result['error']}")
    return result


def run_ours(args: argparse.Namespace, model_path: str, groups: list) -> dict[str, Any]:
    import ray

    from recipe.model import ModelConfig
    from recipe.workers.config import RolloutConfig
    from recipe.workers.rollout.client import ReplicaClient
    from recipe.workers.rollout.requests import GenerationRequest
    from recipe.workers.rollout.vllm_worker import VLLMRolloutWorker

    ray.init(
        include_dashboard=False,
        runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": str(args.cpu_kv_cache_gib)}},
    )
    try:
        resources: dict[str, Any] = {"num_cpus": 1}
        if args.device == "cuda":
            resources["num_gpus"] = 1
        rollout_cfg = RolloutConfig(
            max_num_seqs=args.max_num_seqs,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enforce_eager=_eager(args),
            cpu_kv_cache_gib=args.cpu_kv_cache_gib,
            seed=args.seed,
            response_length=args.max_tokens,
        )
        model = ModelConfig(path=model_path, dtype=args.dtype)
        worker = ReplicaClient.start(VLLMRolloutWorker, resources, model, rollout_cfg)
        ray.get(worker.get_version())
        requests = [
            GenerationRequest(
                prompt_uid=f"bench-{i}",
                prompt_ids=g["prompt_ids"],
                n=args.n,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                seed=g["seed"],
                sample_max_tokens=g["budgets"],
                ignore_eos=True,
            )
            for i, g in enumerate(groups)
        ]
        times, tokens = [], 0
        for rep in range(args.repeats + 1):
            start = time.perf_counter()
            results = ray.get([worker.generate(r) for r in requests])
            elapsed = time.perf_counter() - start
            tokens = sum(t.num_response_tokens for group in results for t in group)
            if rep > 0:
                times.append(elapsed)
        ray.get(worker.shutdown())
        return {"tokens": tokens, "times": times}
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, 20M, 0.5B, 1.5B, 7B or a path")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default=None, help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workload", default="fixed", choices=("fixed", "longtail"))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--cpu-kv-cache-gib", type=int, default=1)
    parser.add_argument(
        "--eager", action="store_true", help="no CUDA graphs (default: graphs on cuda, as runs)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    logging.basicConfig(level=logging.WARNING)
    model_path = str(resolve_bench_model(args.model))
    with open(os.path.join(model_path, "config.json")) as f:
        vocab = min(json.load(f)["vocab_size"], 256)  # byte tokens: valid for every tokenizer
    groups = workload(args, vocab)

    rows = {
        "plain vLLM": run_plain(args, model_path, groups),
        "ours": run_ours(args, model_path, groups),
    }
    print(
        f"model={args.model} device={args.device} dtype={args.dtype} workload={args.workload} "
        f"prompts={args.prompts} n={args.n} max_tokens={args.max_tokens} "
        f"eager={_eager(args)}",
        flush=True,
    )
    print(
        f"{'engine':<12} {'tokens':>9} {'best s':>8} {'mean s':>8} {'best tok/s':>11} "
        f"{'mean tok/s':>11}"
    )
    rates = {}
    for name, row in rows.items():
        best, mean = min(row["times"]), statistics.mean(row["times"])
        rates[name] = (row["tokens"] / best, row["tokens"] / mean)
        print(
            f"{name:<12} {row['tokens']:>9} {best:>8.3f} {mean:>8.3f} "
            f"{rates[name][0]:>11.1f} {rates[name][1]:>11.1f}"
        )
    if rows["plain vLLM"]["tokens"] != rows["ours"]["tokens"]:
        raise RuntimeError(
            f"token counts differ: plain {rows['plain vLLM']['tokens']} vs ours "
            f"{rows['ours']['tokens']} (the workloads must match)"
        )
    ratio = rates["ours"][0] / rates["plain vLLM"][0]
    mean_ratio = rates["ours"][1] / rates["plain vLLM"][1]
    if args.json:
        result = {"args": vars(args), "rows": rows, "ratio_best": ratio, "ratio_mean": mean_ratio}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(
        f"ours / plain vLLM tokens/s: {ratio:.3f} (best), {mean_ratio:.3f} (mean); target >= 0.95"
    )
    return ratio


def _eager(args: argparse.Namespace) -> bool:
    """Both sides run as ``rollout.enforce_eager`` defaults do: graphs on cuda, eager on cpu."""
    return args.eager or args.device == "cpu"


if __name__ == "__main__":
    main()
