"""Typed messages that travel between components.

Every message is a slotted dataclass with documented fields; no untyped dict bags cross an
actor boundary. Lengths are in tokens unless a name says otherwise.

    data/ --PromptRecord--> rollout --Trajectory--> queue --> trainer (TrainBatch)

A ``Trajectory`` is one episode; an agent that edited its chat history leaves it as several
linear segments (``TrajectorySegment``s riding in the last one), each a row of the trainer.
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


def _check_response_lengths(
    owner: str,
    num_response: int,
    rollout_logprobs: list[float],
    token_versions: list[int],
    loss_mask: list[int] | None,
) -> None:
    """``ValueError`` naming ``owner`` unless the per-token lists have ``num_response``
    entries each (``loss_mask`` None: not checked)."""
    if len(rollout_logprobs) != num_response or len(token_versions) != num_response:
        raise ValueError(
            f"{owner}: {num_response} response_ids, {len(rollout_logprobs)} rollout_logprobs "
            f"and {len(token_versions)} token_versions; they must be equal"
        )
    if loss_mask is not None and len(loss_mask) != num_response:
        raise ValueError(
            f"{owner}: loss_mask has {len(loss_mask)} entries for {num_response} response tokens"
        )


def _model_versions(token_versions: list[int], loss_mask: list[int] | None) -> list[int]:
    if loss_mask is None:
        return token_versions
    return [v for v, m in zip(token_versions, loss_mask, strict=True) if m]


@dataclass(slots=True)
class TrajectorySegment:
    """An earlier linear segment of an episode whose agent edited its chat history
    (``Trajectory.segments``): its own prompt and response, trained as its own row with the
    episode's advantage. Same invariant as ``Trajectory``: the four response lists have equal
    length R."""

    prompt_ids: list[int]
    """The segment's prompt token ids (its first request, after the chat template), length P."""
    response_ids: list[int]
    """Every token after the segment's prompt, model and environment, length R."""
    rollout_logprobs: list[float]
    """Rollout log-prob of each model token, 0.0 on environment tokens (R,)."""
    token_versions: list[int]
    """Policy version that sampled each model token, ``ENV_TOKEN_VERSION`` otherwise (R,)."""
    loss_mask: list[int]
    """1 on tokens the model sampled (trained on), 0 on environment tokens (R,)."""

    def __post_init__(self) -> None:
        _check_response_lengths(
            "trajectory segment",
            len(self.response_ids),
            self.rollout_logprobs,
            self.token_versions,
            self.loss_mask,
        )

    @property
    def model_versions(self) -> list[int]:
        """Versions of the tokens a policy sampled (environment tokens left out)."""
        return _model_versions(self.token_versions, self.loss_mask)

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)


@dataclass(slots=True)
class Trajectory:
    """One episode: one response to one prompt, or an agent's episode. A GRPO group is
    ``rollout.n`` trajectories sharing ``prompt_uid``, one reward each.

    Invariant: ``response_ids``, ``rollout_logprobs``, ``token_versions`` (and ``loss_mask``
    when set) have equal length. A response resumed after a weight sync (partial rollout) keeps
    its earlier tokens with the versions that produced them, so ``min_version < max_version``
    for it. A multi-turn episode (``recipe.agent``) is one trajectory whose response holds the
    model turns (mask 1) and the observations between them (mask 0, log-prob 0.0, version
    ``ENV_TOKEN_VERSION``).

    An agent that edited its history (summarised, dropped or rewrote messages) leaves an
    episode of several linear segments: the trajectory's own tokens are the LAST segment and
    the earlier ones ride in ``segments``. Each segment is trained as its own row with this
    trajectory's reward and advantage; ``model_versions``, ``min_version`` and ``max_version``
    cover every segment (staleness sees the episode's oldest token), while the token fields
    and ``num_response_tokens`` are this (last) segment's alone.
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
    segments: list[TrajectorySegment] = field(default_factory=list)
    """Earlier linear segments of this episode, oldest first (an agent that edited its
    history); the trajectory itself is the last; each is trained as its own row with this
    trajectory's advantage."""

    def __post_init__(self) -> None:
        _check_response_lengths(
            f"trajectory of prompt {self.prompt_uid!r}",
            len(self.response_ids),
            self.rollout_logprobs,
            self.token_versions,
            self.loss_mask,
        )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"trajectory of prompt {self.prompt_uid!r}: finish_reason "
                f"{self.finish_reason!r} is not one of {sorted(FINISH_REASONS)}"
            )
        if not all(isinstance(s, TrajectorySegment) for s in self.segments):
            raise TypeError(
                f"trajectory of prompt {self.prompt_uid!r}: segments must be "
                "TrajectorySegment objects (recipe.checkpoint.codec decodes them)"
            )

    @property
    def model_versions(self) -> list[int]:
        """Versions of the tokens a policy sampled in the whole episode, segments first
        (observation tokens left out)."""
        own = _model_versions(self.token_versions, self.loss_mask)
        if not self.segments:
            return own
        return [v for segment in self.segments for v in segment.model_versions] + own

    @property
    def min_version(self) -> int:
        """Oldest version that sampled a token of the episode (-1: none did)."""
        versions = self.model_versions
        return min(versions) if versions else -1

    @property
    def max_version(self) -> int:
        """Newest version that sampled a token of the episode (-1: none did)."""
        versions = self.model_versions
        return max(versions) if versions else -1

    @property
    def num_response_tokens(self) -> int:
        """Response tokens of this (last) segment: what its budget and resumption count."""
        return len(self.response_ids)

    @property
    def num_episode_tokens(self) -> int:
        """Prompt and response tokens of every segment: what the trainer runs forward."""
        own = len(self.prompt_ids) + len(self.response_ids)
        return own + sum(len(s.prompt_ids) + len(s.response_ids) for s in self.segments)
