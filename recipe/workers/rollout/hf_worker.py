"""``HFRolloutWorker``: rollout with transformers' ``generate`` for machines without vLLM.

Same surface and contract as the vLLM worker, simpler engine: one batch at a time (a group's
responses that share a context length run as one batch with a KV cache and no padding),
run in a thread so the actor's event loop keeps answering ``pause()``.

Rollout logprobs are the raw log-softmax of the logits at each sampled token
(``output_logits``: before temperature / top-k / top-p), as the trainer computes them.
Pause is checked after every decoding step by a stopping criterion: the batch stops, and
responses that had not finished come back ``aborted`` with the tokens they had.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import torch

from recipe.faults import DivergedPolicyError
from recipe.model import HFModelConfig, ModelConfig
from recipe.protocol import Trajectory
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.base import RolloutWorker
from recipe.workers.rollout.requests import GenerationRequest, SampleJob, finish_job, plan_group

logger = logging.getLogger(__name__)


def _stop_when_paused(worker: HFRolloutWorker) -> Any:
    """A transformers stopping criterion: stop every row once the worker is paused."""
    from transformers import StoppingCriteria

    class StopWhenPaused(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            return torch.full((input_ids.shape[0],), worker.is_paused(), dtype=torch.bool)

    return StopWhenPaused()


class HFRolloutWorker(RolloutWorker):
    """A rollout worker that runs one transformers causal LM."""

    def __init__(
        self,
        model: ModelConfig,
        config: RolloutConfig,
        log_path: str | None = None,
        max_prompt_length: int | None = None,
    ) -> None:
        """``log_path`` is unused: the engine runs in this process, its errors are its own;
        ``max_prompt_length`` too: the hf backend runs no episodes."""
        super().__init__()
        from transformers import AutoModelForCausalLM, GenerationConfig

        self._model_cfg = HFModelConfig.from_config(model)
        self._tokenizer = self._model_cfg.tokenizer
        self._stop_ids = set(self._model_cfg.eos_token_ids)
        self._device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._model = AutoModelForCausalLM.from_pretrained(
            self._model_cfg.path,
            dtype=getattr(torch, model.dtype),
            trust_remote_code=model.trust_remote_code,
        ).to(self._device)
        self._model.eval()
        # A neutral default, so sampling knobs of the directory's generation_config.json
        # (top_k, repetition_penalty, ...) cannot leak into rollouts the trainer scores.
        self._model.generation_config = GenerationConfig(
            eos_token_id=self._model_cfg.eos_token_ids, pad_token_id=self._model_cfg.pad_token_id
        )
        torch.manual_seed(config.seed)  # unseeded requests draw from this stream
        # One batch on the model at a time; pause() takes it to know nothing is in flight.
        self._lock = asyncio.Lock()

    async def _generate_group(self, request: GenerationRequest) -> list[Trajectory]:
        plan = plan_group(request)
        jobs = [item for item in plan if isinstance(item, SampleJob)]
        done: dict[int, Trajectory] = {}
        for batch in _batches_by_context(jobs):
            async with self._lock:
                if self._paused:  # paused while this batch waited: it starts no work
                    results = [self._finish(request, job, [], [], "aborted", 0) for job in batch]
                else:
                    results = await asyncio.to_thread(self._run_batch, request, batch)
            done.update((t.sample_index, t) for t in results)
        return [done[item.sample_index] if isinstance(item, SampleJob) else item for item in plan]

    @torch.no_grad()
    def _run_batch(self, request: GenerationRequest, batch: list[SampleJob]) -> list[Trajectory]:
        from transformers import GenerationConfig, StoppingCriteriaList

        version = self._version  # constant: weights change only while paused and idle
        input_ids = torch.tensor([job.context_ids for job in batch], device=self._device)
        max_new = batch[0].max_new_tokens
        sampling: dict[str, Any] = {"do_sample": False}
        if request.temperature > 0:
            top_k = request.top_k if request.top_k > 0 else 0
            sampling = dict(
                do_sample=True, temperature=request.temperature, top_p=request.top_p, top_k=top_k
            )
        gen_config = GenerationConfig(
            max_new_tokens=max_new,
            eos_token_id=sorted(self._stop_ids),
            pad_token_id=self._model_cfg.pad_token_id,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling,
        )
        seed = batch[0].seed  # one RNG stream per batch: its first response's seed
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            try:
                out = self._model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=gen_config,
                    stopping_criteria=StoppingCriteriaList([_stop_when_paused(self)]),
                )
            except RuntimeError as exc:
                if "probability tensor contains" not in str(exc):
                    raise
                raise DivergedPolicyError(
                    f"the weights of version {version} give non-finite next-token "
                    "probabilities: training diverged (see actor/grad_norm and "
                    "actor/skipped_steps; lower actor.lr)"
                ) from exc
        new_tokens = out.sequences[:, input_ids.shape[1] :]  # (B, T)
        logits = torch.stack(out.logits, dim=1).float()  # (B, T, V), raw
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1))[..., 0]
        results = []
        for row, job in enumerate(batch):
            ids, reason = self._cut(new_tokens[row].tolist(), max_new)
            lps = logprobs[row, : len(ids)].tolist()
            results.append(self._finish(request, job, ids, lps, reason, version))
        return results

    def _cut(self, tokens: list[int], max_new: int) -> tuple[list[int], str]:
        """Trim the padding after a stop token and name why the response ended."""
        for i, tok in enumerate(tokens):
            if tok in self._stop_ids:
                return tokens[: i + 1], "stop"
        return tokens, "length" if len(tokens) >= max_new else "aborted"

    def _finish(
        self,
        request: GenerationRequest,
        job: SampleJob,
        ids: list[int],
        logprobs: list[float],
        reason: str,
        version: int,
    ) -> Trajectory:
        versions = [version] * len(ids)
        return finish_job(request, job, ids, logprobs, versions, reason, self._tokenizer)

    async def _abort_in_flight(self) -> None:
        # The stopping criterion ends the running batch at its next step; holding the lock
        # once proves it is done and no batch is on the model.
        async with self._lock:
            pass

    async def _load_weights(self, path: str) -> None:
        async with self._lock:
            await asyncio.to_thread(self._copy_weights, path)

    @torch.no_grad()
    def _copy_weights(self, path: str) -> None:
        from safetensors.torch import load_file

        try:
            tensors = load_file(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"update_weights_from_file: cannot read {path!r} ({exc})") from exc
        self._copy_named_tensors(tensors, f"update_weights_from_file({path!r})")

    @torch.no_grad()
    def _copy_named_tensors(self, tensors: dict[str, torch.Tensor], what: str) -> None:
        """Copy full HF-named tensors into the model, all checked before the first copy."""
        params = self._model.state_dict()
        unknown = sorted(set(tensors) - set(params))
        tied = (
            {"lm_head.weight"}
            if self._model.config.get_text_config().tie_word_embeddings
            else set()
        )
        missing = sorted(set(params) - set(tensors) - tied)
        bad_shape = [n for n, t in tensors.items() if n in params and t.shape != params[n].shape]
        if unknown or missing or bad_shape:
            # Checked before any copy: a bad file never leaves the model half-updated.
            raise ValueError(
                f"{what} does not match the model: unknown "
                f"{unknown[:5]}, missing {missing[:5]}, wrong shape {bad_shape[:5]}"
            )
        for name, tensor in tensors.items():
            params[name].copy_(tensor)

    async def _receiver_call(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        # The weights live in this process: the receiver does too (created on first use).
        receiver = getattr(self, "_weight_receiver", None)
        if receiver is None:
            from recipe.checkpoint_engine.endpoints import WeightReceiver

            receiver = self._weight_receiver = WeightReceiver(self._load_pushed, self._device)
        async with self._lock:  # off the event loop, never beside a generating batch
            return [await asyncio.to_thread(receiver.call, method, *args)]

    def _load_pushed(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
        named = dict(tensors)
        self._copy_named_tensors(named, "a pushed weight set")
        return len(named)

    async def _close_engine(self) -> None:
        async with self._lock:
            self._model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _batches_by_context(jobs: list[SampleJob]) -> list[list[SampleJob]]:
    """Group jobs of equal context length and budget: each group runs as one unpadded batch."""
    buckets: dict[tuple[int, int], list[SampleJob]] = {}
    for job in jobs:
        buckets.setdefault((len(job.context_ids), job.max_new_tokens), []).append(job)
    return list(buckets.values())
