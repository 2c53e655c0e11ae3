"""``JudgeServer``: the judge model (``reward.judge.model``) served by the run's own engines.

    any process's Judge --ActorBackend--> JudgeServer (named actor "judge", async)
                                            |  chat template, token budget check
                                            +--generate(n=1)--> judge replica 0..k-1 (vLLM)

The server is one async Ray actor that holds ``reward.judge.replicas`` rollout workers loading
the judge model: the same engines as the policy's (start-up deadline, logs under
RUN_DIR/engines/judge/replica_R.log, one death classifier), which never receive weights. Calls go
round robin over the replicas and run concurrently; vLLM batches the calls of every group in
flight. A replica found dead by a call is restarted (at most ``rollout.max_restarts`` times
over the run) and the call fails, so the judge's retry goes to a live engine.

Placement (recipe/run/placement.py): on CPU machines the CPU engine; on a cluster with a whole
GPU to spare per replica, one GPU each (``judge_own_gpus``); else the replicas take
``reward.judge.gpu_memory_utilization`` of a GPU beside the policy's engine (the trainer's Ray
share shrinks by as much). Sharing a GPU, they start once the policy's engines
have (``after``): vLLM sizes its KV cache from the device's free memory, measured at its start
and around a profiling pass, and refuses to start when another process changed it in between
(on an H100, a judge engine started beside a starting policy engine failed to start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipe.model import HFModelConfig, ModelConfig
from recipe.reward.judge.backend import JudgeCall, JudgeReply
from recipe.reward.judge.config import JudgeConfig
from recipe.reward.judge.remote import JUDGE_ACTOR
from recipe.workers.config import RolloutConfig
from recipe.workers.rollout.requests import GenerationRequest

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)

PROMPT_MARGIN = 16
"""Tokens kept free past a judge prompt and its reply budget (the template's own ends)."""


class JudgePromptTooLong(ValueError):
    """A judge prompt that does not fit ``reward.judge.max_model_len`` with its reply."""


def encode_call(tokenizer: Any, call: JudgeCall, max_model_len: int) -> list[int]:
    """The prompt token ids of ``call``: its messages through the judge tokenizer's chat
    template (``add_special_tokens=False``: the template wrote them); ``JudgePromptTooLong``
    when they, ``call.max_tokens`` and ``PROMPT_MARGIN`` do not fit ``max_model_len``
    (``reward.judge.max_model_len``). Every engine that serves the judge model encodes so."""
    from recipe.data.prompts import render_prompt

    text = render_prompt(tokenizer, call.messages)
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    room = max_model_len - call.max_tokens - PROMPT_MARGIN
    if len(ids) > room:
        raise JudgePromptTooLong(
            f"a judge prompt of {len(ids)} tokens does not fit reward.judge.max_model_len="
            f"{max_model_len} with reward.judge.max_tokens={call.max_tokens} "
            "(raise max_model_len, or shorten the template or the responses)"
        )
    return ids


def judge_request(uid: str, prompt_ids: list[int], call: JudgeCall) -> GenerationRequest:
    """The engine request of one judge call: one reply with the call's own sampling."""
    return GenerationRequest(
        uid,
        prompt_ids,
        n=1,
        max_tokens=call.max_tokens,
        temperature=call.temperature,
        top_p=call.top_p,
        seed=call.seed,
        choices=None if call.choices is None else list(call.choices),
    )


OWN_GPU_MEMORY_UTILIZATION = 0.9
"""The share of a GPU of its own that a judge engine's vLLM takes (vLLM's default)."""


def judge_rollout_config(
    judge: JudgeConfig, policy: RolloutConfig, *, own_gpu: bool = False
) -> RolloutConfig:
    """The engine config of the judge's replicas: the policy's engine settings (backend,
    restarts, deadlines, CPU cache) with the judge's size, memory and context; ``own_gpu``:
    each replica alone on its GPU (``OWN_GPU_MEMORY_UTILIZATION`` of it)."""
    return dataclasses.replace(
        policy,
        n=1,
        temperature=judge.temperature,
        top_p=judge.top_p,
        top_k=-1,
        response_length=judge.max_tokens,
        num_replicas=judge.replicas,
        tensor_parallel_size=1,
        gpu_memory_utilization=(
            OWN_GPU_MEMORY_UTILIZATION if own_gpu else judge.gpu_memory_utilization
        ),
        max_num_seqs=judge.max_num_seqs,
        start_timeout_s=judge.start_timeout_s,
        generation_timeout_s=judge.timeout_s,
        stream_tokens=False,
        engine_kwargs=(  # vLLM's args (the hf backend takes none; encode_call bounds it)
            {**policy.engine_kwargs, "max_model_len": judge.max_model_len}
            if policy.backend == "vllm"
            else dict(policy.engine_kwargs)
        ),
        multi_turn=dataclasses.replace(policy.multi_turn, enable=False),
    )


class JudgeServer:
    """The judge model's replicas behind one async actor (module docstring)."""

    def __init__(
        self,
        judge: JudgeConfig,
        model: ModelConfig,
        rollout: RolloutConfig,
        *,
        device: str,
        gpu_fraction: float,
        log_dir: str | None,
        after: list[Any] | None = None,
        own_gpu: bool = False,
    ) -> None:
        """``model``: the judge model, its path resolved (a local folder). ``after``: Ray
        object refs (the policy's engines starting) to wait for, at most
        ``rollout.start_timeout_s``, before the judge's engines start. ``own_gpu``: each
        replica alone on a GPU (``gpu_fraction`` 1)."""
        from recipe.workers.rollout import make_rollout_worker_cls
        from recipe.workers.rollout.replicas import RolloutReplicas

        if after:
            wait_for_policy_engines(after, rollout.start_timeout_s)
        loaded = HFModelConfig.from_config(model)
        self._judge = judge
        self._tokenizer = loaded.tokenizer
        self._max_restarts = rollout.max_restarts
        self._constrains = make_rollout_worker_cls(rollout.backend).keeps_choices
        self._restarts = 0
        self._uids = itertools.count()
        self._restarting: dict[int, asyncio.Task[None]] = {}
        self._replicas = RolloutReplicas(
            loaded,
            judge_rollout_config(judge, rollout, own_gpu=own_gpu),
            device=device,
            gpu_fraction=gpu_fraction,
            log_dir=Path(log_dir) if log_dir else None,
            num_cpus=0,  # beside the run's reserved groups, which may hold every CPU
        )

    def ready(self) -> int:
        """The number of replicas serving (the constructor returns once all started)."""
        return len(self._replicas.workers)

    async def process_ids(self) -> list[dict[str, Any]]:
        """Each replica's worker and engine process ids (``RolloutWorker.process_ids``)."""
        return list(await asyncio.gather(*(w.process_ids() for w in self._replicas.workers)))

    def constrains(self) -> bool:
        """Whether its engines keep replies to ``JudgeCall.choices``: vLLM's structured
        outputs do; the HF engine does not, and is sent no choices."""
        return self._constrains

    def num_restarts(self) -> int:
        """Replicas restarted after dying, over the run."""
        return self._restarts

    async def complete(self, call: JudgeCall) -> JudgeReply:
        """One judge reply to ``call``'s messages; ``JudgePromptTooLong`` when they do not
        fit the judge's context with ``call.max_tokens``; a dead replica's error (after its
        restart began) otherwise."""
        prompt_ids = encode_call(self._tokenizer, call, self._judge.max_model_len)
        request = judge_request(f"judge-{next(self._uids)}", prompt_ids, call)
        index = self._replicas.next_replica()
        try:
            [traj] = await self._replicas.workers[index].generate(request)
        except Exception as exc:
            if await self._replicas.worker_error(exc) is not None:
                self._restart(index)
            raise
        return JudgeReply(traj.response_text, len(prompt_ids), traj.num_response_tokens)

    def _restart(self, index: int) -> None:
        """Restart replica ``index`` once however many calls found it dead; past
        ``rollout.max_restarts`` restarts over the run, the calls keep failing (the judge's
        retries end in a ``JudgeError`` that stops the run)."""
        if index in self._restarting or self._restarts >= self._max_restarts:
            return
        self._restarts += 1
        logger.warning("judge replica %d died: restarting it (%d so far)", index, self._restarts)
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._start, index))
        self._restarting[index] = task
        task.add_done_callback(lambda _: self._restarting.pop(index, None))

    def _start(self, index: int) -> None:
        import ray

        worker = self._replicas.restart(index)
        ray.get(worker.get_version(), timeout=self._judge.start_timeout_s)

    def shutdown(self) -> None:
        self._replicas.shutdown()


def wait_for_policy_engines(refs: list[Any], timeout_s: float) -> None:
    """Wait for ``refs``; a start that failed or outlasted ``timeout_s`` fails this one too,
    in one line naming what it waited for (the policy engines' own error is the run's)."""
    import ray

    try:
        ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(
            f"the judge's engines waited {timeout_s:g} s (rollout.start_timeout_s) for the "
            "policy's engines to start first, in vain"
        ) from None
    except Exception as exc:
        raise RuntimeError(
            f"the judge's engines did not start: the policy's engines, which start first, "
            f"failed ({type(exc).__name__})"
        ) from None


def start_judge_server(
    judge: JudgeConfig,
    model: ModelConfig,
    rollout: RolloutConfig,
    *,
    device: str,
    gpu_fraction: float,
    log_dir: Path | None,
    after: list[Any] | None = None,
    own_gpu: bool = False,
) -> Any:
    """Start the run's ``JudgeServer`` as the named actor ``JUDGE_ACTOR``; its handle, which
    the caller keeps for the run and ends with ``stop_judge``. Its engines start in the
    background, after ``after`` resolved: ``wait_judge`` waits for them."""
    import ray

    return (
        ray.remote(JudgeServer)
        .options(name=JUDGE_ACTOR, num_cpus=0, max_concurrency=1000)
        .remote(
            judge,
            model,
            rollout,
            device=device,
            gpu_fraction=gpu_fraction,
            log_dir=str(log_dir) if log_dir else None,
            after=after,
            own_gpu=own_gpu,
        )
    )


def judge_ready(handle: Any) -> ObjectRef[None]:
    """Resolves once the judge's engines serve (raises the engine's error when they failed
    to start); the caller waits on it beside its other start-up calls."""
    return handle.ready.remote()


def wait_judge(handle: Any, timeout_s: float) -> None:
    """Wait for the judge's engines to serve; ``RunFailure`` past ``timeout_s``
    (``reward.judge.start_timeout_s``), the engine's own error when it failed to start."""
    import ray

    from recipe.faults import RunFailure

    try:
        ray.get(judge_ready(handle), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RunFailure(
            f"the judge's engines did not start within reward.judge.start_timeout_s="
            f"{timeout_s:g} s (their log: RUN_DIR/engines/judge/replica_R.log)"
        ) from None


def stop_judge(handle: Any) -> None:
    """Shut the judge's engines down and end its actor (None: nothing); never raises."""
    if handle is None:
        return
    import ray

    try:
        ray.get(handle.shutdown.remote(), timeout=60)
    except Exception:  # the engines may be gone already; end the actor anyway
        logger.exception("shutting the judge's engines down failed")
    ray.kill(handle)
