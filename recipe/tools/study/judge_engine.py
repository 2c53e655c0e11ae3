"""``EngineBackend``: a ``JudgeBackend`` over the judge model (``reward.judge.model``) on the
run's rollout worker class, in this process: no Ray, no ``JudgeServer`` actor.

    Judge --JudgeCall--> EngineBackend.complete
                           encode_call (the judge tokenizer's chat template, the
                           reward.judge.max_model_len check: as JudgeServer encodes)
                           --generate(n=1)--> the run's rollout worker (one engine,
                                              judge_rollout_config: the judge's context,
                                              reply budget and sampling)

A study tool judges a fixed sample and then exits, so one engine in the tool's own process
serves it, as ``python -m recipe.tools.study.lengths`` runs the policy's. Replica restarts
are the run's ``JudgeServer``'s; here a dead engine fails the calls, which the ``Judge``
retries and then reports as errors.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from recipe.config import RecipeConfig
from recipe.model import HFModelConfig, ModelConfig
from recipe.reward.judge import JudgeCall, JudgeReply
from recipe.workers.judge_server import encode_call, judge_request, judge_rollout_config


class EngineBackend:
    """``JudgeBackend`` over an engine of the judge model in this process (module
    docstring); ``start`` builds it, ``shutdown`` ends the engine."""

    def __init__(
        self, worker: Any, tokenizer: Any, max_model_len: int, *, constrains: bool = True
    ) -> None:
        """``worker``: a started rollout worker serving the judge model; ``tokenizer``: the
        judge model's; ``max_model_len``: ``reward.judge.max_model_len``; ``constrains``:
        whether the worker keeps replies to ``JudgeCall.choices`` (vLLM's does, HF's not)."""
        self.constrains = constrains
        self._worker = worker
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._uids = itertools.count()

    @classmethod
    def start(cls, cfg: RecipeConfig, model: HFModelConfig, log_path: Path | None) -> EngineBackend:
        """Start the judge's engine (``cfg.rollout.backend``, ``judge_rollout_config``), its
        processes' output in ``log_path`` (None: this process's stdout). Call it on the event
        loop that will call ``complete``."""
        from recipe.workers.rollout import make_rollout_worker_cls

        judge = cfg.reward.judge
        rollout = judge_rollout_config(judge, cfg.rollout)
        # The backends share the constructor of VLLMRolloutWorker; the base class declares none.
        worker_cls: Any = make_rollout_worker_cls(rollout.backend)
        spec = ModelConfig(
            str(model.path), dtype=model.dtype, trust_remote_code=model.trust_remote_code
        )
        worker = worker_cls(spec, rollout, str(log_path) if log_path else None)
        return cls(
            worker, model.tokenizer, judge.max_model_len, constrains=worker_cls.keeps_choices
        )

    async def complete(self, call: JudgeCall) -> JudgeReply:
        prompt_ids = encode_call(self._tokenizer, call, self._max_model_len)
        request = judge_request(f"judge-{next(self._uids)}", prompt_ids, call)
        [traj] = await self._worker.generate(request)
        return JudgeReply(traj.response_text, len(prompt_ids), traj.num_response_tokens)

    async def shutdown(self) -> None:
        await self._worker.shutdown()
