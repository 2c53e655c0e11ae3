"""What a rollout worker is asked to generate, and how a group's samples are planned.

    GroupRequest (a caller's) --to_request(cfg)--> GenerationRequest (the worker's)
    GenerationRequest (one prompt group) --plan_group--> per sample: SampleJob | Trajectory
    SampleJob + the engine's new tokens  --finish_job--> Trajectory

A fresh sample starts from the prompt; an aborted partial (``GenerationRequest.resume``)
continues from prompt + its tokens with the remaining budget and a seed of its own; finished
members pass through. Seeds and the long-tail budgets are functions of their inputs only, so
every process plans the same group the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recipe.protocol import PromptRecord, Trajectory
from recipe.workers.config import RolloutConfig


@dataclass(slots=True)
class GenerationRequest:
    """One prompt group to generate: ``n`` responses to ``prompt_ids``."""

    prompt_uid: str
    """The prompt's uid; becomes every trajectory's ``prompt_uid`` (the GRPO group id)."""
    prompt_ids: list[int]
    """Prompt token ids (after the chat template), length P."""
    n: int
    """Responses in the group."""
    max_tokens: int
    """Max response tokens per response, counting tokens of a resumed partial."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = -1
    """Top-k cut-off; -1 disables it."""
    seed: int | None = None
    """Base sampling seed (response i uses a seed derived from it and i); None: unseeded."""
    resume: list[Trajectory] | None = None
    """A group returned earlier (length ``n``): aborted members continue, others pass through."""
    sample_max_tokens: list[int] | None = None
    """Per-response token budgets (length ``n``, each in 1..``max_tokens``); None: all
    ``max_tokens``."""
    ignore_eos: bool = False
    """Keep generating past EOS until the budget is spent (fixed-length benchmark workloads)."""
    choices: list[str] | None = None
    """Each response is exactly one of these strings (vLLM's structured outputs); None: free.
    The judge's corrected verdicts use it, never a policy's responses."""
    record: PromptRecord | None = None
    """The prompt's record; with ``rollout.multi_turn.enable`` each response is an episode
    of the environment started from it (``recipe.agent``), ``max_tokens`` its budget of
    tokens after the prompt."""
    cut_if_paused: bool = False
    """A call that finds the worker paused returns its group unstarted at once
    (``unstarted_group``) instead of waiting for the resume: the pause overtook it (Ray does
    not order an async actor's calls) and cuts it at its first token, as it cuts the groups
    already generating. For a caller that resumes cut groups itself (the fully async
    rollouter with partial rollout); else a pause's waiter would wait for a resume that comes
    only after the pause has waited for it."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"GenerationRequest({self.prompt_uid!r}).prompt_ids is empty")
        if self.n < 1:
            raise ValueError(f"GenerationRequest.n={self.n} is invalid: allowed >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"GenerationRequest.max_tokens={self.max_tokens}: allowed >= 1")
        if self.temperature < 0:
            raise ValueError(f"GenerationRequest.temperature={self.temperature}: allowed >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"GenerationRequest.top_p={self.top_p}: allowed in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"GenerationRequest.top_k={self.top_k}: allowed -1 or >= 1")
        if self.resume is not None:
            self._check_resume(self.resume)
        if self.sample_max_tokens is not None and (
            len(self.sample_max_tokens) != self.n
            or not all(1 <= m <= self.max_tokens for m in self.sample_max_tokens)
        ):
            raise ValueError(
                f"GenerationRequest.sample_max_tokens={self.sample_max_tokens}: expected "
                f"n={self.n} budgets in 1..{self.max_tokens}"
            )

    def budget(self, sample_index: int) -> int:
        """Max response tokens of response ``sample_index``."""
        if self.sample_max_tokens is None:
            return self.max_tokens
        return self.sample_max_tokens[sample_index]

    def _check_resume(self, resume: list[Trajectory]) -> None:
        if len(resume) != self.n:
            raise ValueError(
                f"GenerationRequest.resume has {len(resume)} trajectories, expected n={self.n}"
            )
        for traj in resume:
            # An episode's prompt is its environment's first observation, not prompt_ids.
            same_prompt = self.record is not None or traj.prompt_ids == self.prompt_ids
            if traj.prompt_uid != self.prompt_uid or not same_prompt:
                raise ValueError(
                    f"GenerationRequest.resume: trajectory {traj.sample_index} belongs to "
                    f"prompt {traj.prompt_uid!r}, not to {self.prompt_uid!r}"
                )


@dataclass(slots=True)
class SampleJob:
    """One response still to generate: a fresh sample or the continuation of a partial."""

    sample_index: int
    """Index within the group."""
    context_ids: list[int]
    """Engine input: prompt ids + the partial's response ids."""
    max_new_tokens: int
    """Remaining token budget (>= 1)."""
    seed: int | None
    """Per-response sampling seed, distinct per sample and per resume point."""
    partial: Trajectory | None
    """The aborted trajectory this job continues, or None for a fresh sample."""


def sample_seed(base: int | None, sample_index: int, num_done_tokens: int) -> int | None:
    """A 31-bit seed distinct per (base, sample, resume point), stable across processes."""
    if base is None:
        return None
    digest = hashlib.blake2b(f"{base}/{sample_index}/{num_done_tokens}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF


def longtail_lengths(seed: int, n: int, max_tokens: int) -> list[int]:
    """``n`` response budgets with a long tail, deterministic in ``seed``: with probability
    0.1 a budget is uniform in [0.75, 1] x ``max_tokens``, else uniform in [1/32, 1/8] x
    ``max_tokens`` (mean ~0.16 x ``max_tokens``; a batch's slowest response is ~6x its mean)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        low, high = (0.75, 1.0) if rng.random() < 0.1 else (1 / 32, 1 / 8)
        out.append(max(1, min(max_tokens, round(max_tokens * rng.uniform(low, high)))))
    return out


def plan_group(request: GenerationRequest) -> list[SampleJob | Trajectory]:
    """Per sample index: a job to run, or a finished trajectory that passes through."""
    if request.resume is None:
        return [
            SampleJob(
                i,
                list(request.prompt_ids),
                request.budget(i),
                sample_seed(request.seed, i, 0),
                None,
            )
            for i in range(request.n)
        ]
    plan: list[SampleJob | Trajectory] = []
    for traj in request.resume:
        remaining = request.budget(traj.sample_index) - traj.num_response_tokens
        if traj.finish_reason != "aborted":
            plan.append(traj)
        elif remaining <= 0:
            # The budget ran out exactly at the cut: the response is complete.
            plan.append(_replace_finish(traj, "length"))
        else:
            seed = sample_seed(request.seed, traj.sample_index, traj.num_response_tokens)
            context = list(traj.prompt_ids) + list(traj.response_ids)
            plan.append(SampleJob(traj.sample_index, context, remaining, seed, traj))
    return plan


def _replace_finish(traj: Trajectory, finish_reason: str) -> Trajectory:
    return Trajectory(
        prompt_uid=traj.prompt_uid,
        sample_index=traj.sample_index,
        prompt_ids=traj.prompt_ids,
        response_ids=traj.response_ids,
        rollout_logprobs=traj.rollout_logprobs,
        token_versions=traj.token_versions,
        finish_reason=finish_reason,
        reward=0.0,
        response_text=traj.response_text,
    )


def unstarted_group(request: GenerationRequest) -> list[Trajectory]:
    """``request``'s group as a pause at its first token leaves it: what it resumes as it
    was (finished responses, and partials still ``aborted``), fresh samples ``aborted``
    with no token; ordered by ``sample_index``."""
    if request.resume is not None:
        return sorted(request.resume, key=lambda traj: traj.sample_index)
    return [
        Trajectory(
            prompt_uid=request.prompt_uid,
            sample_index=index,
            prompt_ids=list(request.prompt_ids),
            response_ids=[],
            rollout_logprobs=[],
            token_versions=[],
            finish_reason="aborted",
            response_text="",
        )
        for index in range(request.n)
    ]


def finish_job(
    request: GenerationRequest,
    job: SampleJob,
    new_ids: list[int],
    new_logprobs: list[float],
    new_versions: list[int],
    finish_reason: str,
    tokenizer: Any,
) -> Trajectory:
    """Join a job's new tokens onto its partial (if any) into one trajectory, text decoded."""
    prior = job.partial
    response_ids = (list(prior.response_ids) if prior else []) + new_ids
    return Trajectory(
        prompt_uid=request.prompt_uid,
        sample_index=job.sample_index,
        prompt_ids=list(request.prompt_ids),
        response_ids=response_ids,
        rollout_logprobs=(list(prior.rollout_logprobs) if prior else []) + new_logprobs,
        token_versions=(list(prior.token_versions) if prior else []) + new_versions,
        finish_reason=finish_reason,
        response_text=tokenizer.decode(response_ids, skip_special_tokens=True),
    )


def group_request(
    cfg: RolloutConfig,
    prompt_uid: str,
    prompt_ids: Sequence[int],
    *,
    version: int,
    n: int,
    sampling: tuple[float, float, int],
    resume: list[Trajectory] | None = None,
    training: bool = True,
    record: PromptRecord | None = None,
) -> GenerationRequest:
    """The request of one prompt group (``RolloutReplicas.submit``): ``version`` (served now)
    seeds its sampling; ``sampling`` is (temperature, top_p, top_k). Training groups follow
    ``rollout.length_profile``; validation (``training=False``) always ends at EOS. Multi-turn
    episodes start from ``record`` (required with ``rollout.multi_turn.enable``)."""
    if cfg.multi_turn.enable and record is None:
        raise ValueError(f"prompt {prompt_uid!r}: multi-turn episodes need its PromptRecord")
    temperature, top_p, top_k = sampling
    longtail = training and cfg.length_profile == "longtail"
    return GenerationRequest(
        prompt_uid=prompt_uid,
        prompt_ids=list(prompt_ids),
        n=n,
        max_tokens=cfg.response_length,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=request_seed(cfg.seed, prompt_uid, version),
        resume=resume,
        # Budgets depend on the prompt only, so a resumed partial keeps its own.
        sample_max_tokens=longtail_lengths(
            request_seed(cfg.seed, prompt_uid, 0), n, cfg.response_length
        )
        if longtail
        else None,
        ignore_eos=longtail,
        record=record if cfg.multi_turn.enable else None,
    )


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """One prompt group as a caller asks for it (``RolloutReplicas.submit``): the prompt,
    its sampling, the served ``version`` (which seeds it); ``to_request(cfg)`` is what the
    worker gets (``group_request``)."""

    prompt_uid: str
    prompt_ids: list[int]
    version: int
    """The weights version served now: it seeds the group's sampling."""
    n: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    resume: list[Trajectory] | None = None
    """A group returned cut by a pause: its aborted members continue."""
    training: bool = True
    """Training groups follow ``rollout.length_profile``; validation always ends at EOS."""
    record: PromptRecord | None = None
    """The prompt's record, which multi-turn episodes start from."""
    cut_if_paused: bool = False
    """``GenerationRequest.cut_if_paused``."""

    def to_request(self, cfg: RolloutConfig) -> GenerationRequest:
        request = group_request(
            cfg,
            self.prompt_uid,
            self.prompt_ids,
            version=self.version,
            n=self.n,
            sampling=(self.temperature, self.top_p, self.top_k),
            resume=self.resume,
            training=self.training,
            record=self.record,
        )
        return dataclasses.replace(request, cut_if_paused=self.cut_if_paused)


def request_seed(base_seed: int, prompt_uid: str, version: int) -> int:
    digest = hashlib.blake2b(f"{base_seed}:{prompt_uid}:{version}".encode(), digest_size=4)
    return int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF
