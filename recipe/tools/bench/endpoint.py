"""``python -m recipe.tools.bench.endpoint [key=value ...]``: the agent endpoint's cost per request.

The same episodes twice, on one rollout worker kind, in one process:

    direct:    an ``AgentLoop`` calling the engine itself (``ctx.generate()``, then
               ``ctx.append_observation(" ok.")``): no HTTP, no parsing
    endpoint:  an agent written against the OpenAI API (``/v1/completions`` through its
               ``openai.AsyncOpenAI`` client) doing the same turns, the text so far sent back
               with " ok." appended each time

Both sample the same tokens (same seeds, budgets and observations; the run checks that the
sequences are identical), so the difference in wall time is the endpoint's: HTTP, JSON, the
session's prefix match and the client. ``groups`` prompt groups of ``n`` episodes run at
once, ``turns`` requests each; every side runs ``rounds`` times after a warm-up round, on
its own engine (built one after the other, never sharing the device). Printed: wall time per
round, requests/s, and the extra milliseconds per request (endpoint - direct) / requests.

Keys: ``model=tiny|20M|0.5B|...|PATH`` (``recipe.tools.bench.models``), ``groups`` (16), ``n``
(8), ``turns`` (4), ``turn_tokens`` (32), ``rounds`` (3), ``device=cpu|cuda``, ``json=PATH``.
GPU: ``python -m recipe.tools.bench.endpoint model=0.5B device=cuda groups=64 n=8``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from recipe.agent.context import AgentContext
from recipe.agent.interface import AgentLoop
from recipe.protocol import PromptRecord, Trajectory
from recipe.tools.cli import fail, parse_key_values

logger = logging.getLogger(__name__)

OBSERVATION = " ok."


class DirectTurns(AgentLoop):
    """The direct side: turns through the engine, an observation after each, until
    ``max_assistant_turns`` ends the episode."""

    async def run(self, ctx: AgentContext, record: PromptRecord) -> None:
        ctx.start(record.prompt)
        while await ctx.generate() is not None and ctx.append_observation(OBSERVATION):
            pass


async def endpoint_turns(client: Any, record: PromptRecord) -> None:
    """The endpoint side: the same turns as ``DirectTurns``, as an agent; the request past
    ``max_assistant_turns`` is refused (400) before its observation is appended."""
    import openai

    prompt = str(record.prompt)
    while True:
        try:
            out = await client.completions.create(model="policy", prompt=prompt)
        except openai.BadRequestError:
            return
        prompt += out.choices[0].text + OBSERVATION


def _worker(model: Path, device: str, multi_turn: dict[str, Any], budget: int) -> Any:
    from recipe.agent.config import MultiTurnConfig
    from recipe.model import ModelConfig
    from recipe.workers.config import RolloutConfig
    from recipe.workers.rollout.vllm_worker import VLLMRolloutWorker

    dtype = "bfloat16" if device == "cuda" else "float32"
    config = RolloutConfig(
        backend="vllm",
        response_length=budget,
        max_num_seqs=256,
        multi_turn=MultiTurnConfig(enable=True, **multi_turn),
    )
    return VLLMRolloutWorker(ModelConfig(path=str(model), dtype=dtype), config)


async def _round(worker: Any, requests: list[Any]) -> tuple[float, list[list[Trajectory]]]:
    start = time.perf_counter()
    groups = await asyncio.gather(*(worker.generate(r) for r in requests))
    return time.perf_counter() - start, groups


async def _side(name: str, worker: Any, requests: list[Any], rounds: int) -> dict[str, Any]:
    try:
        await _round(worker, requests)  # warm-up
        times: list[float] = []
        groups: list[list[Trajectory]] = []
        for _ in range(rounds):
            wall_s, groups = await _round(worker, requests)
            times.append(wall_s)
    finally:
        await worker.shutdown()
    finished = [t for g in groups for t in g]
    bad = [t for t in finished if t.finish_reason != "length"]
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} episodes ended {bad[0].finish_reason}")
    return {"wall_s": times, "sequences": [t.prompt_ids + t.response_ids for t in finished]}


def main(argv: list[str]) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    args = parse_key_values(argv, __doc__)
    from recipe.model import HFModelConfig
    from recipe.tools.bench.models import resolve_bench_model
    from recipe.workers.rollout.requests import GenerationRequest

    model = resolve_bench_model(args.pop("model", "tiny"))
    groups, n = int(args.pop("groups", "16")), int(args.pop("n", "8"))
    turns, turn_tokens = int(args.pop("turns", "4")), int(args.pop("turn_tokens", "32"))
    rounds, device = int(args.pop("rounds", "3")), args.pop("device", "cpu")
    json_path = args.pop("json", None)
    if args:
        fail(f"unknown keys: {', '.join(sorted(args))}")
    tokenizer = HFModelConfig(model).tokenizer
    if getattr(tokenizer, "chat_template", None):
        fail(f"model={model}: the benchmark sends text prompts (no chat template)")
    budget = turns * (turn_tokens + len(tokenizer.encode(OBSERVATION))) + 1
    requests = []
    for g in range(groups):
        prompt = PromptRecord(f"bench-{g}", f"{g}+{g + 1}=", str(2 * g + 1), "arithmetic")
        ids = list(tokenizer.encode(prompt.prompt, add_special_tokens=False))
        requests.append(GenerationRequest(prompt.uid, ids, n, budget, seed=g, record=prompt))
    common = {"max_turn_tokens": turn_tokens, "max_assistant_turns": turns}
    sides = {
        "direct": common | {"agent_loop": "recipe.tools.bench.endpoint:DirectTurns"},
        "endpoint": common | {"agent": "recipe.tools.bench.endpoint:endpoint_turns"},
    }
    results = {}
    for name, multi_turn in sides.items():
        worker = _worker(model, device, multi_turn, budget)
        results[name] = asyncio.run(_side(name, worker, requests, rounds))
    same = results["direct"]["sequences"] == results["endpoint"]["sequences"]
    num_requests = groups * n * turns
    direct_s = statistics.median(results["direct"]["wall_s"])
    endpoint_s = statistics.median(results["endpoint"]["wall_s"])
    record = {
        "model": str(model),
        "device": device,
        "episodes": groups * n,
        "requests_per_round": num_requests,
        "direct_wall_s": results["direct"]["wall_s"],
        "endpoint_wall_s": results["endpoint"]["wall_s"],
        "identical_sequences": same,
        "direct_requests_per_s": num_requests / direct_s,
        "endpoint_requests_per_s": num_requests / endpoint_s,
        "extra_ms_per_request": 1000 * (endpoint_s - direct_s) / num_requests,
        "endpoint_over_direct": endpoint_s / direct_s,
    }
    print(
        f"{groups * n} episodes x {turns} requests of <= {turn_tokens} tokens, median of "
        f"{rounds} rounds: direct {direct_s:.2f} s, endpoint {endpoint_s:.2f} s "
        f"({record['endpoint_over_direct']:.3f}x wall), "
        f"{record['extra_ms_per_request']:+.2f} ms per request; "
        f"identical sequences: {same}"
    )
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
