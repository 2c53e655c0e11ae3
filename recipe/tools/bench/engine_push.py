"""``python -m recipe.tools.bench.engine_push``: a weight push into a real vLLM engine, ours beside
vLLM's own weight-transfer API, on the same engine and the same tensors, in one run.

    driver (the trainer's side)                 one vLLM engine (GPU, CUDA graphs)
    bf16 tensors W1 / W0 on the GPU  --push-->  weights loaded (layerwise reload)
    t = push start .. engine answers that the load is done

Methods (each push alternates W1 and W0, so every push changes the weights):
  ``vllm_ipc``         vLLM's ``WeightTransferConfig(backend="ipc")``: one CUDA IPC handle per
                       tensor, ``start_weight_update`` / ``update_weights`` / ``finish_...``
  ``vllm_ipc_packed``  the same, tensors packed into 1 GiB buffers (vLLM's ``packed=True``)
  ``ours``             ``recipe.checkpoint_engine`` ``cuda_ipc``: pack into a region mapped
                       once, verify both sides, load (what ``ParameterSynchronizer`` runs)
  ``ours_noverify``    the same without checksums (verification off)

After the last push of W1 through each method, the engine's parameter sums
(``weight_checksums``, float64) and a greedy generation must equal those of every other
method: the bench fails otherwise. It prints per method the best and median seconds, GB/s of
model bytes, the ratio to a same-run device-to-device copy of the same bytes, and last the
headline: ours / vLLM's best, in time. Needs CUDA (CUDA IPC shares device memory).
vLLM's methods need pickle over vLLM's RPC (``VLLM_ALLOW_INSECURE_SERIALIZATION=1``): the
entrypoint sets it for the bench's run when they are chosen, and restores it after.

GPU: ``python -m recipe.tools.bench.engine_push --model 0.5B`` (also ``1.5B``). CPU (ours over
``shm`` alone, a check of the bench itself): ``--device cpu --model 20M --methods
ours,ours_noverify``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from recipe.checkpoint_engine.base import TransferPlan, raise_wire_error
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.layout import BucketLayout
from recipe.tools.bench.models import resolve_bench_model
from recipe.tools.bench.weight_sync import memcpy_gbps
from recipe.workers.rollout.vllm_extension import iter_safetensors
from recipe.workers.rollout.vllm_worker import EXTENSION_CLS

logger = logging.getLogger(__name__)

METHODS = ("vllm_ipc", "vllm_ipc_packed", "ours", "ours_noverify")
INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"
"""vLLM's switch for pickle over its RPC, which its ipc methods need (``pickle_over_vllm_rpc``)."""
Tensors = dict[str, torch.Tensor]


def trainer_tensors(model_dir: Path, device: torch.device) -> tuple[Tensors, Tensors]:
    """The checkpoint's tensors (W0) and a perturbed copy (W1), bf16 on ``device``."""
    w0: Tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in iter_safetensors(str(file)):
            w0[name] = tensor.to(device=device, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(1)
    w1 = {
        name: t + 0.01 * torch.randn(t.shape, generator=gen, device=device, dtype=t.dtype)
        for name, t in w0.items()
    }
    return w0, w1


def _rpc(llm: Any, method: str, *args: Any) -> Any:
    """``weight_receiver_call`` on the engine's only worker, errors re-raised with type."""
    (result,) = llm.collective_rpc("weight_receiver_call", args=(method, *args))
    return raise_wire_error(result)


class OursPush:
    """``recipe.checkpoint_engine``'s ``cuda_ipc`` into the engine's worker extension."""

    def __init__(self, llm: Any, tensors: Tensors, device: torch.device, verify: bool):
        meta = [
            (n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()
        ]
        layout = BucketLayout.build(meta, 64 << 20)
        backend = "cuda_ipc" if device.type == "cuda" else "shm"
        plan = TransferPlan(backend, layout, 1, 120.0, verify)
        self.llm, self.transfer_id = llm, 0
        self.sender = make_checkpoint_engine(plan, rank=0, device=device)
        info = self.sender.prepare()
        _rpc(llm, "connect", plan.to_wire(), [[0, 1]], info)
        self.sender.init(info)  # a no-op for the sender of a shared region
        self.pool = concurrent.futures.ThreadPoolExecutor(1)

    def __call__(self, tensors: Tensors) -> None:
        self.transfer_id += 1
        received = self.pool.submit(_rpc, self.llm, "receive", self.transfer_id)
        self.sender.send(tensors.items(), self.transfer_id)
        received.result()
        _rpc(self.llm, "load", self.transfer_id)

    def close(self) -> None:
        _rpc(self.llm, "close")
        self.sender.finalize()
        self.pool.shutdown()


def vllm_push(llm: Any, packed: bool) -> Callable[[Tensors], None]:
    """vLLM's own path: ``IPCWeightTransferEngine.trainer_send_weights`` sending through
    ``LLM.update_weights`` between ``start_weight_update`` and ``finish_weight_update``."""
    from vllm.distributed.weight_transfer.ipc_engine import (
        IPCTrainerSendWeightsArgs,
        IPCWeightTransferEngine,
    )

    def send(update_info: Any) -> None:
        llm.update_weights({"update_info": dataclasses.asdict(update_info)})

    def push(tensors: Tensors) -> None:
        llm.start_weight_update()
        args = IPCTrainerSendWeightsArgs(send_mode=send, packed=packed)
        IPCWeightTransferEngine.trainer_send_weights(iter(tensors.items()), args)
        llm.finish_weight_update()

    return push


def time_pushes(
    push: Callable[[Tensors], None], w0: Tensors, w1: Tensors, repeats: int
) -> list[float]:
    """Seconds of ``repeats`` pushes alternating W1 and W0 after one untimed pair (so each
    timed push changes the weights); the engine is left on W1."""
    push(w1)
    push(w0)
    seconds = []
    for i in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        push(w1 if i % 2 == 0 else w0)
        seconds.append(time.perf_counter() - start)
    if repeats % 2 == 0:
        push(w1)
    return seconds


def engine_state(llm: Any) -> tuple[dict[str, float], list[int]]:
    """What the engine computes with: parameter sums and one greedy completion's tokens."""
    from vllm import SamplingParams

    (sums,) = llm.collective_rpc("weight_checksums")
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(3, 19))}], params, use_tqdm=False)
    return sums, list(out[0].outputs[0].token_ids)


def build_engine(model_dir: Path, args: argparse.Namespace) -> Any:
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        dtype="bfloat16",
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=512,
        enforce_eager=args.device == "cpu",
        worker_extension_cls=EXTENSION_CLS,
        seed=0,
        **({"weight_transfer_config": {"backend": "ipc"}} if args.device == "cuda" else {}),
    )


@contextlib.contextmanager
def pickle_over_vllm_rpc(enabled: bool) -> Iterator[None]:
    """``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` while the block runs, the previous value
    restored after; nothing when not ``enabled``.

    vLLM's ipc methods send torch's CUDA IPC rebuild arguments (a tensor class among them)
    through vLLM's msgpack RPC, which falls back to pickle only under this flag. It cannot be
    narrower than the engine's whole life in this process: the engine's processes read it
    once when they start, and from then on tag every RPC result with types that this process
    decodes only under the same flag. So the entrypoint sets it around the whole bench, and
    only when vLLM's methods run (ours never needs it)."""
    if not enabled:
        yield
        return
    before = os.environ.get(INSECURE_SERIALIZATION)
    os.environ[INSECURE_SERIALIZATION] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(INSECURE_SERIALIZATION, None)
        else:
            os.environ[INSECURE_SERIALIZATION] = before


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if args.device == "cuda"
        else torch.device("cpu")
    )
    model_dir = resolve_bench_model(args.model)
    llm = build_engine(model_dir, args)
    w0, w1 = trainer_tensors(model_dir, device)
    model_bytes = sum(t.numel() * t.element_size() for t in w0.values())
    ceiling = memcpy_gbps(model_bytes, device, 3)  # a D2D copy on GPU, memcpy on CPU
    rows, states = [], {}
    for method in args.methods.split(","):
        ours = None
        if method.startswith("ours"):
            ours = OursPush(llm, w0, device, verify=method == "ours")
            push: Callable[[Tensors], None] = ours
        else:
            push = vllm_push(llm, packed=method == "vllm_ipc_packed")
        seconds = time_pushes(push, w0, w1, args.repeats)
        if ours is not None:
            ours.close()
        states[method] = engine_state(llm)
        best = min(seconds)
        rows.append(
            {
                "method": method,
                "best_s": best,
                "median_s": statistics.median(seconds),
                "gbps": model_bytes / best / 1e9,
                "ceiling_gbps": ceiling,
                "model_bytes": model_bytes,
            }
        )
    check_same_engine_state(states)
    return rows


def check_same_engine_state(states: dict[str, tuple[dict[str, float], list[int]]]) -> None:
    """Every method must leave the engine computing with the same weights and tokens."""
    first, (sums, tokens) = next(iter(states.items()))
    for method, (other_sums, other_tokens) in states.items():
        if other_sums != sums:
            bad = sorted(k for k in sums if other_sums.get(k) != sums[k])[:3]
            raise SystemExit(f"engine weights after {method} differ from after {first}: {bad}")
        if other_tokens != tokens:
            raise SystemExit(f"greedy tokens after {method} differ from after {first}")


def report(rows: list[dict[str, Any]], model: str) -> str:
    lines = [f"{'method':>16} {'best_s':>7} {'median_s':>8} {'GB/s':>7} {'D2D':>7} {'ratio':>6}"]
    for r in rows:
        lines.append(
            f"{r['method']:>16} {r['best_s']:>7.3f} {r['median_s']:>8.3f} {r['gbps']:>7.1f} "
            f"{r['ceiling_gbps']:>7.0f} {r['gbps'] / r['ceiling_gbps']:>6.3f}"
        )
    by = {r["method"]: r["best_s"] for r in rows}
    theirs = [m for m in by if m.startswith("vllm")]
    if "ours" in by and theirs:
        best = min(theirs, key=by.__getitem__)
        lines.append(
            f"headline: {model} {rows[0]['model_bytes'] / 1e6:.0f} MB: ours (verified) "
            f"{by['ours']:.3f} s = {by['ours'] / by[best]:.2f}x vLLM's {best} ({by[best]:.3f} s)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="0.5B", help="a recipe.tools.bench.models size or a path"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help=f"of {list(METHODS)}")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: ours over shm only"
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        parser.error(f"unknown --methods {unknown}: allowed {list(METHODS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "recipe.tools.bench.engine_push: no CUDA device (--device cpu runs ours over shm)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if args.device == "cpu" and any(m.startswith("vllm") for m in args.methods.split(",")):
        parser.error(
            "vLLM's ipc weight transfer needs CUDA: "
            "with --device cpu use --methods ours,ours_noverify"
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with pickle_over_vllm_rpc(any(m.startswith("vllm") for m in args.methods.split(","))):
        rows = run(args)
    print(report(rows, args.model), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
