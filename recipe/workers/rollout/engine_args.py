"""How a rollout config becomes vLLM engine args and the environment the engine starts in.

Pure decisions where possible (unit-tested without an engine); the vLLM imports are local so
the config side can be checked on a machine without vLLM.

- ``parallel_args``: tensor-parallel ranks run as processes of the replica's own actor.
- ``cpu_thread_binding`` / ``prepare_cpu_env``: vLLM-CPU's KV cache size and, with tensor
  parallelism, which cores each rank's OpenMP threads take.
- ``check_engine_kwargs``, ``eager_engine``, ``chunked_prefill_args``: the rest of the args.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

from recipe.workers.config import RolloutConfig

logger = logging.getLogger(__name__)

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def parallel_args(cfg: RolloutConfig) -> dict[str, Any]:
    """Engine args for ``rollout.tensor_parallel_size``.

    A replica is one Ray actor on one placement-group bundle that holds all of its GPUs
    (Ray sets the actor's CUDA_VISIBLE_DEVICES to them), so its ranks run as the actor's own
    processes (vLLM's ``mp`` executor): they see exactly the bundle's GPUs, and they end with
    the actor. Left to itself, vLLM inside a placement group would pick its Ray executor and
    start each rank as another Ray actor outside the replica's bundle.
    """
    if cfg.tensor_parallel_size == 1:
        return {}
    return {"distributed_executor_backend": "mp"}


def cpu_thread_binding(num_ranks: int, cpus: Sequence[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``num_ranks`` CPU workers over ``cpus``: disjoint
    contiguous slices, one per rank ("0,1|2,3"); with fewer CPUs than ranks, ranks share
    them in turn (slower, but it runs)."""
    if num_ranks < 1 or not cpus:
        raise ValueError(f"cannot bind {num_ranks} ranks over CPUs {list(cpus)}")
    ordered = sorted(cpus)
    if len(ordered) < num_ranks:
        return "|".join(str(ordered[rank % len(ordered)]) for rank in range(num_ranks))
    per_rank = len(ordered) // num_ranks
    slices = [ordered[rank * per_rank : (rank + 1) * per_rank] for rank in range(num_ranks)]
    return "|".join(",".join(str(cpu) for cpu in part) for part in slices)


def prepare_cpu_env(config: RolloutConfig) -> None:
    """Set the environment vLLM-CPU reads in the process that starts it: the KV cache size
    (per rank), and with tensor parallelism the cores of each rank's threads, unless the
    user bound them (``VLLM_CPU_OMP_THREADS_BIND``). vLLM's own ``auto`` binding gives each
    rank a NUMA node and refuses to start with fewer nodes than ranks."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    gib = max(1, math.ceil(config.cpu_kv_cache_gib))
    if gib != config.cpu_kv_cache_gib:
        logger.info(
            "rollout.cpu_kv_cache_gib=%s rounded up to %d GiB", config.cpu_kv_cache_gib, gib
        )
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    if config.tensor_parallel_size > 1 and os.environ.get(CPU_BIND_ENV, "auto") == "auto":
        binding = cpu_thread_binding(config.tensor_parallel_size, sorted(os.sched_getaffinity(0)))
        os.environ[CPU_BIND_ENV] = binding
        logger.info(
            "%d tensor-parallel CPU ranks bound to cores %s", config.tensor_parallel_size, binding
        )


def check_engine_kwargs(cfg: RolloutConfig) -> dict[str, Any]:
    """``rollout.engine_kwargs``, checked against this vLLM's engine args (``ValueError``
    naming the unknown ones); warns where one undoes a choice made here for a reason."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(cfg.engine_kwargs) - known)
    if unknown:
        raise ValueError(
            f"rollout.engine_kwargs: this vLLM has no engine args {', '.join(unknown)} "
            "(see vllm.engine.arg_utils.AsyncEngineArgs)"
        )
    if current_platform.is_cpu() and cfg.engine_kwargs.get("enable_chunked_prefill"):
        logger.warning(
            "rollout.engine_kwargs.enable_chunked_prefill=true on a CPU engine: vLLM-CPU "
            "fails on seeded requests once a step's prompts exceed its token budget"
        )
    return dict(cfg.engine_kwargs)


NUMERIC_ENGINE_ARGS = frozenset({"model", "dtype", "seed", "logprobs_mode"})
"""Engine args without which an engine computes other numbers: the raw log-probs that the
off-policy correction compares with the trainer's, the weights' dtype, the sampling seed."""


def supported_engine_args(kwargs: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """``kwargs`` limited to the engine args this vLLM has (``known``): one it lacks is
    dropped with a warning, unless it changes numerics (``NUMERIC_ENGINE_ARGS``), which fails
    the engine's start with a ``RuntimeError`` naming it."""
    dropped = sorted(set(kwargs) - known)
    numeric = [name for name in dropped if name in NUMERIC_ENGINE_ARGS]
    if numeric:
        raise RuntimeError(
            f"this vLLM has no engine args {', '.join(numeric)}: without them its log-probs "
            "are not the ones training compares against (install vllm>=0.26)"
        )
    if dropped:
        logger.warning("this vLLM has no engine args %s; using its defaults", dropped)
    return {k: v for k, v in kwargs.items() if k in known}


def eager_engine(cfg: RolloutConfig) -> bool:
    """``rollout.enforce_eager``, with None resolved: eager on CPU engines, CUDA graphs on
    GPUs. A weight push copies into the engine's parameter tensors in place
    (vllm_extension.py), so graphs captured at start keep reading the pushed weights."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu() if cfg.enforce_eager is None else cfg.enforce_eager


def chunked_prefill_args() -> dict[str, Any]:
    """Engine args that keep per-request seeds working: no chunked prefill on CPU engines.

    Every training request carries its own seed (``sample_seed``), so a response is
    reproducible whatever else the engine batches with it. vLLM samples a token even for a
    request whose prompt was only partly prefilled in a step, discards it, and rewinds that
    request's generator by its Philox offset (``gen.set_offset(gen.get_offset() - 4)`` in
    ``GPUModelRunner._bookkeeping_sync``, which the CPU runner inherits). Torch's CPU
    generator (Mersenne Twister) has no offset, so the first step whose requests exceed the
    engine's per-step token budget kills a vLLM-CPU engine ("CPU Generator does not use
    offset"). Without chunked prefill a prompt is prefilled whole within one step (vLLM then
    sizes the budget to at least ``max_model_len``) and no sampled token is ever discarded;
    requests over the budget wait for the next step. Seeds stay per request on both
    platforms; GPUs keep vLLM's default (chunked prefill on: Philox offsets rewind fine).
    """
    from vllm.platforms import current_platform

    return {"enable_chunked_prefill": False} if current_platform.is_cpu() else {}
