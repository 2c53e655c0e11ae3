"""``VLLMEngineControl``: the engine half of ``VLLMRolloutWorker`` (vllm_worker.py, which
mixes it in): pausing the engine, loading and checking weights, its health and shutdown.

    pause()    -> _abort_in_flight: engine.pause_generation(mode="abort") (or the older
                  form; none: cancel the streams), then wait a grace for the abort outputs
    resume()   -> engine.resume_generation, then the worker serves again
    weights    a file (``load_weights_from_safetensors`` on every engine worker) or a push
               (``weight_receiver_call``), then no adapter on top and the prefix cache reset
    checks     read_back_weights / weight_checksums (the engine's own weights, for tests)
"""

from __future__ import annotations

import asyncio
import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.workers.rollout.base import RolloutWorker
from recipe.workers.rollout.engine_log import read_root_error

if TYPE_CHECKING:
    from recipe.agent.runner import EpisodeRunner

# How long pause() lets abort outputs arrive before cancelling the streams still open
# (a request that reached the engine only after the pause sits queued there until cancelled).
_ABORT_GRACE_S = 1.0


class VLLMEngineControl(RolloutWorker):
    """The engine's pause, weights and life of a vLLM rollout worker (module docstring)."""

    _engine: Any
    _in_flight: set[asyncio.Task]
    _log_path: Path | None
    _episodes: EpisodeRunner | None

    if TYPE_CHECKING:  # provided by LoraServing

        async def _drop_adapter(self) -> None: ...

    async def _abort_in_flight(self) -> None:
        native = await self._pause_engine()
        pending = set(self._in_flight)
        if not pending:
            return
        # After a native pause the streams end with "abort" on their own; without one,
        # cancelling a stream is what aborts its engine request.
        _, still_open = await asyncio.wait(pending, timeout=_ABORT_GRACE_S if native else 0)
        for task in still_open:
            task.cancel()
        if still_open:
            await asyncio.wait(still_open)

    async def _pause_engine(self) -> bool:
        """Pause the engine's scheduler, aborting its requests; False if it has no pause."""
        pause = getattr(self._engine, "pause_generation", None)
        if pause is None:
            return False
        if "mode" in inspect.signature(pause).parameters:
            await pause(mode="abort", clear_cache=True)
        else:  # the older form of the same call
            await pause(wait_for_inflight_requests=False, clear_cache=True)
        return True

    async def _pause_idle_engine(self) -> None:
        """Pause the scheduler again after requests of our own that all ended (the adapter
        probe's). ``pause_generation`` would also clear the caches and then sleep a fixed
        20 ms for the outputs of requests still in flight (vLLM 0.26 and 0.32 alike): there
        are none, and the caches hold only what those requests computed."""
        pause = getattr(getattr(self._engine, "engine_core", None), "pause_scheduler_async", None)
        if pause is None:
            await self._pause_engine()
            return
        await pause(mode="abort", clear_cache=False)

    async def resume(self) -> None:
        self._check_open()
        resume = getattr(self._engine, "resume_generation", None)
        if resume is not None:
            await resume()
        await super().resume()

    async def _load_weights(self, path: str) -> None:
        if not os.path.isfile(path):
            raise ValueError(f"update_weights_from_file: no such file {path!r}")
        counts = await self._engine.collective_rpc("load_weights_from_safetensors", args=(path,))
        if not counts or min(counts) == 0:
            raise ValueError(f"update_weights_from_file: {path!r} holds no tensors")
        await self._drop_adapter()
        # Cached KV blocks were computed by the old weights.
        await self._engine.reset_prefix_cache()

    async def _receiver_call(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        # The receiver lives in vLLM's worker process, next to the weights; arguments are
        # plain values (collective_rpc serialises tensors as lists).
        return await self._engine.collective_rpc("weight_receiver_call", args=(method, *args))

    async def _after_weights_loaded(self) -> None:
        await self._drop_adapter()
        await self._engine.reset_prefix_cache()  # cached KV blocks came from the old weights

    async def read_back_weights(self, path: str) -> int:
        """Write the weights rank 0's kernels compute with to ``path`` (safetensors, vLLM
        names; see ``WeightUpdateExtension.read_back_weights``), tensor-parallel rank r's
        shards to ``vllm_extension.rank_path(path, r)``; returns rank 0's tensor count."""
        counts = await self._engine.collective_rpc("read_back_weights", args=(path,))
        return counts[0]

    async def weight_checksums(self) -> dict[str, float]:
        """Per-parameter float64 sums of the served weights (rank 0), keyed by vLLM name."""
        results = await self._engine.collective_rpc("weight_checksums")
        return results[0]

    async def _check_engine(self) -> None:
        await self._engine.check_health()  # EngineDeadError once the engine core process died

    def _engine_error(self) -> tuple[str | None, str | None]:
        return read_root_error(self._log_path), str(self._log_path) if self._log_path else None

    async def _close_engine(self) -> None:
        if self._episodes is not None:
            await self._episodes.close()
        self._engine.shutdown()
        # Drop it now: collected at interpreter exit, its __del__ would shut down again
        # against half-torn-down modules.
        self._engine = None
