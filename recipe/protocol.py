"""Typed messages that travel between components.

Every message is a slotted dataclass with documented fields; no untyped dict bags cross an
actor boundary. Lengths are in tokens unless a name says otherwise.

    data/ --PromptRecord--> rollout --Trajectory--> queue --> trainer (TrainBatch)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ChatMessages = list[dict[str, str]]


@dataclass(slots=True, frozen=True)
class PromptRecord:
    """One prompt of a dataset, before tokenisation.

    ``uid`` is unique within a run's train (or val) set and stable across restarts: it is the
    key of the exactly-once prompt ledger.
    """

    uid: str
    """Stable unique id, e.g. ``train-000123`` or ``<file>:<row>``."""
    prompt: str | ChatMessages
    """A plain string, or chat messages ``[{"role": ..., "content": ...}, ...]``."""
    ground_truth: str
    """The verifiable answer the reward function compares against."""
    data_source: str
    """Selects the scorer in the reward registry (verl's ``data_source``)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """Passed unchanged to the reward function as ``extra_info``."""


FINISH_REASONS = ("stop", "length", "aborted", "env_error")
ENV_TOKEN_VERSION = -1
"""``Trajectory.token_versions`` of a token no policy sampled (a multi-turn observation)."""


@dataclass(slots=True)
class Trajectory:
    """One response to one prompt. A GRPO group is ``rollout.n`` trajectories sharing
    ``prompt_uid``.

    Invariant: ``response_ids``, ``rollout_logprobs``, ``token_versions`` (and ``loss_mask``
    when set) have equal length. A response resumed after a weight sync (partial rollout) keeps
    its earlier tokens with the versions that produced them, so ``min_version < max_version``
    for it. A multi-turn episode (``recipe.agent``) is one trajectory whose response holds the
    model turns (mask 1) and the observations between them (mask 0, log-prob 0.0, version
    ``ENV_TOKEN_VERSION``).
    """

    prompt_uid: str
    """The prompt's ``PromptRecord.uid`` (also the GRPO group id)."""
    sample_index: int
    """Index of this response within its group, 0..n-1."""
    prompt_ids: list[int]
    """Prompt token ids (after the chat template), length P."""
    response_ids: list[int]
    """Generated token ids, length R <= rollout.response_length (eos included when it stopped)."""
    rollout_logprobs: list[float]
    """Log-prob of each response token under the engine's weights when it was sampled (R,)."""
    token_versions: list[int]
    """Policy version that produced each response token (R,)."""
    finish_reason: str
    """``stop`` (eos/stop string, or the environment ended the episode), ``length`` (hit a
    token or turn budget), ``aborted`` or ``env_error`` (the environment raised)."""
    reward: float = 0.0
    """Scalar reward of the full response."""
    response_text: str = ""
    """Decoded response (what the reward function scored)."""
    reward_extras: dict[str, float] = field(default_factory=dict)
    """Other numbers the reward function returned (e.g. ``acc``), logged as ``reward/<key>``."""
    loss_mask: list[int] | None = None
    """1 on tokens the model sampled (trained on), 0 on observation tokens (R,); None: every
    response token is the model's (single-turn)."""
    episode: dict[str, float] = field(default_factory=dict)
    """Multi-turn counts of this episode (``turns``, ``tool_calls``, ``tool_errors``,
    ``env_s``), logged as ``agent/*``; empty for single-turn responses."""
    agent_state: dict[str, Any] | None = None
    """An episode cut for a checkpoint (``aborted``) whose environment saves its state: what
    continues it mid-way (``recipe.agent.context.AgentContext.state_dict``; JSON values).
    None otherwise: an aborted episode without it starts again from scratch."""

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.rollout_logprobs) != n or len(self.token_versions) != n:
            raise ValueError(
                f"trajectory of prompt {self.prompt_uid!r}: {n} response_ids, "
                f"{len(self.rollout_logprobs)} rollout_logprobs and {len(self.token_versions)} "
                "token_versions; they must be equal"
            )
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(
                f"trajectory of prompt {self.prompt_uid!r}: loss_mask has "
                f"{len(self.loss_mask)} entries for {n} response tokens"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"trajectory of prompt {self.prompt_uid!r}: finish_reason "
                f"{self.finish_reason!r} is not one of {sorted(FINISH_REASONS)}"
            )

    @property
    def model_versions(self) -> list[int]:
        """Versions of the tokens a policy sampled (observation tokens left out)."""
        if self.loss_mask is None:
            return self.token_versions
        return [v for v, m in zip(self.token_versions, self.loss_mask, strict=True) if m]

    @property
    def min_version(self) -> int:
        versions = self.model_versions
        return min(versions) if versions else -1

    @property
    def max_version(self) -> int:
        versions = self.model_versions
        return max(versions) if versions else -1

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)
