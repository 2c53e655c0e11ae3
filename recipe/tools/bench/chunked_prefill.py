"""``python -m recipe.tools.bench.chunked_prefill``: what CPU engines give up without chunked
prefill.

CPU engines run with chunked prefill off (``recipe.workers.rollout.vllm_worker.
chunked_prefill_args`` says why: per-request seeds). This measures the price on the same
workload, side by side, each setting in a process of its own, alternating::

    plain vllm.LLM, enable_chunked_prefill=True    vs    the same with False

The requests are *unseeded* (seeded ones crash a CPU engine with chunked prefill on), prompts
of mixed length (``--min-prompt`` .. ``--max-prompt`` random tokens), ``n`` responses of
``--max-tokens`` each with EOS ignored, so both settings do the same work. Throughput is
(prompt tokens x n + generated tokens) / s, best of ``--repeats`` after a warm-up pass. The
last line is the headline: off / on.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time


def measure(args: argparse.Namespace, chunked: bool) -> float:
    """Best tokens/s of one setting, in this process."""
    from vllm import LLM, SamplingParams

    from recipe.tools.bench.models import resolve_bench_model

    llm = LLM(
        model=str(resolve_bench_model(args.model)),
        enable_chunked_prefill=chunked,
        enforce_eager=True,
        max_num_seqs=args.max_num_seqs,
        seed=0,
        dtype="float32",
    )
    rng = random.Random(args.seed)
    lengths = [rng.randint(args.min_prompt, args.max_prompt) for _ in range(args.prompts)]
    prompts = [{"prompt_token_ids": [rng.randint(5, 250) for _ in range(n)]} for n in lengths]
    params = SamplingParams(
        n=args.n, max_tokens=args.max_tokens, ignore_eos=True, temperature=1.0, detokenize=False
    )
    llm.generate(prompts[: max(1, args.prompts // 8)], params, use_tqdm=False)  # warm-up
    best = 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(
            len(o.prompt_token_ids) * args.n + sum(len(c.token_ids) for c in o.outputs)
            for o in outputs
        )
        best = max(best, tokens / seconds)
    return best


def run_setting(argv: list[str], chunked: bool, timeout_s: float) -> float:
    """Tokens/s of one setting, measured by a fresh ``python -m`` of this module."""
    cmd = [sys.executable, "-m", __spec__.name, *argv, "--only", "on" if chunked else "off"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return float(json.loads(lines[-1])["tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (default) or a model directory")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=5)
    parser.add_argument("--max-prompt", type=int, default=360)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="on/off pairs, order alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--only", choices=("on", "off"), help=argparse.SUPPRESS)
    args, argv = parser.parse_args(), sys.argv[1:]
    if args.only is not None:  # one setting, in a process of its own
        print(json.dumps({"tokens_per_s": measure(args, args.only == "on")}))
        return
    results: dict[bool, list[float]] = {True: [], False: []}
    for round_index in range(args.rounds):
        order = (True, False) if round_index % 2 == 0 else (False, True)
        for chunked in order:
            results[chunked].append(run_setting(argv, chunked, args.timeout_s))
            print(json.dumps({"chunked_prefill": chunked, "tokens_per_s": results[chunked][-1]}))
    ratios = [off / on for on, off in zip(results[True], results[False], strict=True)]
    print(
        f"no chunked prefill / chunked prefill: {min(ratios):.2f}-{max(ratios):.2f}x tokens/s "
        f"(on {', '.join(f'{v:.0f}' for v in results[True])}; "
        f"off {', '.join(f'{v:.0f}' for v in results[False])})"
    )


if __name__ == "__main__":
    main()
