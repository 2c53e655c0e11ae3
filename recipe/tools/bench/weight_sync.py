"""``python -m recipe.tools.bench.weight_sync``: GB/s of a weight push against a same-run memcpy.

    main process (sender)                          receiver process(es) (spawned)
    random Qwen2-shaped tensors --pack/send-->     stage + verify --load--> "engine" tensors
    t = send start .. last receiver's load done    (the load is a copy, as in an engine)

Per parameter-set size and backend it prints model bytes, end-to-end seconds (best of
``--repeats``), GB/s of model bytes per replica, the same run's ceiling (a plain copy of the
same bytes: ``torch`` memcpy on CPU, a device-to-device copy on GPU) and the ratio of the two,
plus the checksum time on both sides (the cost of verification). Each process runs torch with
``--threads`` (default 1, what a ``num_cpus=1`` Ray actor gets): on an oversubscribed host,
per-tensor parallel copies spend more time in thread barriers than in copying. The last line is the
headline: the largest size through the fastest backend, as a ratio to the ceiling.

CPU: ``--sizes 10M,50M,100M`` (default). GPU: ``--device cuda --sizes 0.5B,1.5B,7B
--backends cuda_ipc,nccl`` (nccl needs 2 GPUs). There is no engine pause in this loop: the
pause window is reported by ``ParameterSynchronizer`` (``sync/pause_s``) in real runs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import multiprocessing as mp
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from recipe.checkpoint_engine.base import TransferPlan, raise_wire_error
from recipe.checkpoint_engine.endpoints import WeightReceiver
from recipe.checkpoint_engine.factory import make_checkpoint_engine
from recipe.checkpoint_engine.layout import BucketLayout, TensorMeta, as_bytes

logger = logging.getLogger(__name__)

# name -> (hidden, intermediate, vocab, layers); the large ones follow Qwen2.5's shapes.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "2M": (128, 512, 6000, 4),
    "10M": (256, 1024, 8192, 8),
    "50M": (512, 2048, 16384, 10),
    "100M": (768, 3072, 32000, 8),
    "0.5B": (896, 4864, 151936, 24),
    "1.5B": (1536, 8960, 151936, 28),
    "7B": (3584, 18944, 152064, 28),
}


def synthetic_metadata(size: str, dtype: str) -> list[TensorMeta]:
    """A Qwen2-like decoder's tensors (tied embedding, q/k/v biases, 4x smaller k/v)."""
    hidden, inter, vocab, layers = SIZES[size]
    kv = max(hidden // 4, 64)
    meta: list[TensorMeta] = [("model.embed_tokens.weight", (vocab, hidden), dtype)]
    for i in range(layers):
        p = f"model.layers.{i}."
        meta += [
            (p + "self_attn.q_proj.weight", (hidden, hidden), dtype),
            (p + "self_attn.q_proj.bias", (hidden,), dtype),
            (p + "self_attn.k_proj.weight", (kv, hidden), dtype),
            (p + "self_attn.k_proj.bias", (kv,), dtype),
            (p + "self_attn.v_proj.weight", (kv, hidden), dtype),
            (p + "self_attn.v_proj.bias", (kv,), dtype),
            (p + "self_attn.o_proj.weight", (hidden, hidden), dtype),
            (p + "mlp.gate_proj.weight", (inter, hidden), dtype),
            (p + "mlp.up_proj.weight", (inter, hidden), dtype),
            (p + "mlp.down_proj.weight", (hidden, inter), dtype),
            (p + "input_layernorm.weight", (hidden,), "float32"),  # mixed dtypes on purpose
            (p + "post_attention_layernorm.weight", (hidden,), "float32"),
        ]
    return [*meta, ("model.norm.weight", (hidden,), "float32")]


def random_tensors(meta: list[TensorMeta], device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    return {
        name: torch.randn(shape, generator=gen, device=device).to(getattr(torch, dtype))
        for name, shape, dtype in meta
    }


def _receiver_main(conn: Any, device: str, meta: list[TensorMeta], threads: int) -> None:
    """A receiver process: an engine stand-in whose load copies into its own tensors."""
    torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:  # "cuda" alone: this process's current device
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    engine = {n: torch.empty(s, dtype=getattr(torch, d), device=dev) for n, s, d in meta}

    def load(tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
        count = 0
        for name, tensor in tensors:
            engine[name].copy_(tensor)
            count += 1
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return count

    receiver = WeightReceiver(load, dev)
    while True:
        method, args = conn.recv()
        if method == "exit":
            receiver.close()
            return
        if method == "digest":
            conn.send(digest(engine))
            continue
        try:
            conn.send(receiver.call(method, *args))
        except Exception as exc:  # reported to the driver, which fails the run
            conn.send({"exception": repr(exc)})


def digest(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """A hash of every tensor's bytes (bitwise equality across processes and devices)."""
    return {
        name: hashlib.blake2b(as_bytes(t).cpu().numpy().tobytes(), digest_size=16).hexdigest()
        for name, t in tensors.items()
    }


def _result(conn: Any, timeout_s: float = 300.0) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"a receiver process did not answer within {timeout_s:.0f} s")
    try:
        message = conn.recv()
    except EOFError as exc:  # the parent closed its copy of the child's end: the child died
        raise RuntimeError("a receiver process died (see its traceback above)") from exc
    result = raise_wire_error(message)
    if isinstance(result, dict) and "exception" in result:
        raise RuntimeError(f"receiver failed: {result['exception']}")
    return result


def memcpy_gbps(num_bytes: int, device: torch.device, repeats: int) -> float:
    """The ceiling: one plain copy of ``num_bytes`` (best of ``repeats``)."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first copy also faults the pages in
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return num_bytes / best / 1e9


def run_backend(backend: str, meta: list[TensorMeta], args: argparse.Namespace) -> dict[str, float]:
    """Best-of-``repeats`` end-to-end push through ``backend`` to ``args.receivers``."""
    sender_dev = torch.device(args.device)
    count = torch.cuda.device_count() if sender_dev.type == "cuda" else 1
    recv_devs = [
        args.device if backend != "nccl" else f"cuda:{(1 + r) % count}"
        for r in range(args.receivers)
    ]
    tensors = random_tensors(meta, sender_dev)
    layout = BucketLayout.build(meta, args.bucket_mb << 20)
    plan = TransferPlan(backend, layout, args.receivers, args.timeout_s, not args.no_verify)
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for dev in recv_devs:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=_receiver_main, args=(theirs, dev, meta, args.threads), daemon=True
        )
        proc.start()
        theirs.close()  # so a receiver that dies reads as EOF here instead of a long wait
        pipes.append(mine)
        procs.append(proc)
    sender = make_checkpoint_engine(plan, rank=0, device=sender_dev)
    try:
        info = sender.prepare()
        for r, conn in enumerate(pipes):
            conn.send(("connect", (plan.to_wire(), [[0, r + 1]], info)))
        sender.init(info)
        for conn in pipes:
            _result(conn)
        pushes = range(1, args.repeats + 2)  # the first push faults pages in: not timed
        runs = [_one_push(sender, tensors, pipes, transfer_id) for transfer_id in pushes][1:]
        expected = digest(tensors)
        for conn in pipes:
            conn.send(("digest", ()))
        equal = all(_result(conn) == expected for conn in pipes)
    finally:
        for conn in pipes:
            with contextlib.suppress(OSError):  # a receiver that died has no pipe left
                conn.send(("exit", ()))
        for proc in procs:
            proc.join(30)
        sender.finalize()
    best = min(runs, key=lambda r: r["seconds"])
    median_s = statistics.median(r["seconds"] for r in runs)
    return {
        **best,
        "median_s": median_s,
        "bytes": float(layout.model_bytes),
        "bitwise_equal": float(equal),
    }


def _one_push(sender: Any, tensors: dict, pipes: list, transfer_id: int) -> dict[str, float]:
    start = time.perf_counter()
    for conn in pipes:
        conn.send(("receive", (transfer_id,)))
    sent = sender.send(tensors.items(), transfer_id)
    received = [_result(conn) for conn in pipes]
    for conn in pipes:
        conn.send(("load", (transfer_id,)))
    loaded = [_result(conn) for conn in pipes]
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "send_s": sent.seconds,
        "load_s": max(r["seconds"] for r in loaded),
        "verify_s": sent.verify_s + max(r["verify_s"] for r in received),
    }


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,50M,100M", help=f"of {list(SIZES)}")
    parser.add_argument("--backends", default="", help="default: shm,gloo (cpu), cuda_ipc,nccl")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (Ray actors get 1)"
    )
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backends = (
        args.backends.split(",")
        if args.backends
        else (["shm", "gloo"] if args.device == "cpu" else ["cuda_ipc", "nccl"])
    )
    if "nccl" in backends and args.device == "cuda" and torch.cuda.device_count() < 2:
        backends.remove("nccl")
    lines = [
        f"{'size':>5} {'params':>8} {'MB':>8} {'backend':>8} {'best_s':>7} {'GB/s':>6} "
        f"{'memcpy':>7} {'ratio':>6} {'verify_s':>8} {'load_s':>7} {'bitwise':>7}"
    ]
    print(lines[0], flush=True)
    headline = ""
    rows: list[dict[str, Any]] = []
    for size in args.sizes.split(","):
        meta = synthetic_metadata(size, args.dtype)
        params = sum(_numel(shape) for _, shape, _ in meta)
        num_bytes = BucketLayout.build(meta, 1 << 30).model_bytes
        ceiling = memcpy_gbps(num_bytes, torch.device(args.device), args.repeats)
        results = {b: run_backend(b, meta, args) for b in backends}
        for backend, res in results.items():
            gbps = res["bytes"] / res["seconds"] / 1e9
            line = (
                f"{size:>5} {params / 1e6:>7.1f}M {num_bytes / 1e6:>8.1f} {backend:>8} "
                f"{res['seconds']:>7.3f} {gbps:>6.2f} {ceiling:>7.2f} {gbps / ceiling:>6.3f} "
                f"{res['verify_s']:>8.3f} {res['load_s']:>7.3f} {bool(res['bitwise_equal'])!s:>7}"
            )
            lines.append(line)
            print(line, flush=True)
            rows.append(
                {
                    "size": size,
                    "backend": backend,
                    "model_bytes": num_bytes,
                    "seconds": res["seconds"],
                    "gbps": gbps,
                    "ceiling_gbps": ceiling,
                    "verify_s": res["verify_s"],
                    "bitwise_equal": bool(res["bitwise_equal"]),
                }
            )
        best = min(results, key=lambda b: results[b]["seconds"])
        gbps = results[best]["bytes"] / results[best]["seconds"] / 1e9
        headline = (
            f"headline: {best} {size} {args.dtype}: {gbps:.2f} GB/s of model bytes per "
            f"replica end to end = {gbps / ceiling:.3f}x the {args.device} memcpy "
            f"ceiling ({ceiling:.2f} GB/s)"
        )
    lines.append(headline)
    print(headline, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "rows": rows}, indent=2))
    return lines


def _numel(shape: Any) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


if __name__ == "__main__":
    main()
