"""One episode as one token sequence: token-in/token-out bookkeeping.

    prompt_ids | model turn 1 | observation 1 | model turn 2 | ... |
    loss_mask  |   1 1 1 1    |    0 0 0 0    |   1 1 1 1    |
    logprobs   |  sampled lp  |   0.0 ...     |  sampled lp  |
    versions   |  v v v v+1   |  -1 -1 -1     |  v+1 ...     |      (-1: not from a policy)

Everything after the prompt is the "response" the trainer sees; it computes log-probs over
the whole sequence and uses only the tokens with mask 1. Tokens are only ever appended: what
came before is never re-rendered or re-tokenised, so the ids the engine sampled are the ids
the trainer scores. A model turn cut by a weight sync continues in place, its later tokens
carrying the newer version (``versions`` is per token).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipe.protocol import (
    ENV_TOKEN_VERSION,
    FINISH_REASONS,
    ChatMessages,
    Trajectory,
    TrajectorySegment,
)

Observation = str | ChatMessages
"""Text appended as it is, or chat messages rendered by the chat template."""

INFO_PREFIX = "info/"
"""Episode keys of the environment's ``StepResult.info`` means (``agent/info/<key>``)."""
ENV_VERSION = ENV_TOKEN_VERSION
"""``versions`` entry of a token no policy produced (an observation)."""

EPISODE_FINISH_REASONS = FINISH_REASONS
"""``stop``: the environment said done (or the model stopped without an environment);
``length``: a token or turn budget ran out; ``aborted``: dropped before the end (re-admitted);
``env_error``: the environment raised (reward 0)."""


@dataclass(slots=True)
class EpisodeTokens:
    """The growing sequence of one episode (invariant: the four response lists have equal
    length, and ``logprobs``/``versions`` are 0.0/-1 exactly where ``loss_mask`` is 0)."""

    prompt_ids: list[int]
    """Rendered first observation, length P."""
    response_ids: list[int] = field(default_factory=list)
    """Every token after the prompt, model and environment, length R."""
    loss_mask: list[int] = field(default_factory=list)
    """1 for a model token, 0 for an environment token (R,)."""
    logprobs: list[float] = field(default_factory=list)
    """Rollout log-prob of each model token, 0.0 for environment tokens (R,)."""
    versions: list[int] = field(default_factory=list)
    """Policy version that sampled each model token, ``ENV_VERSION`` otherwise (R,)."""

    def add_model(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        if not len(ids) == len(logprobs) == len(versions):
            raise ValueError(
                f"a model turn has {len(ids)} tokens, {len(logprobs)} log-probs and "
                f"{len(versions)} versions"
            )
        self.response_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions

    def add_env(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [ENV_VERSION] * len(ids)

    @classmethod
    def from_trajectory(cls, traj: Trajectory) -> EpisodeTokens:
        """The sequence of an episode cut for a checkpoint, to continue it."""
        mask = traj.loss_mask if traj.loss_mask is not None else [1] * traj.num_response_tokens
        return cls(
            list(traj.prompt_ids),
            list(traj.response_ids),
            list(mask),
            list(traj.rollout_logprobs),
            list(traj.token_versions),
        )

    @property
    def context_ids(self) -> list[int]:
        """What the engine continues from: the prompt and everything appended."""
        return self.prompt_ids + self.response_ids

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def model_versions(self) -> list[int]:
        return [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]


@dataclass(slots=True)
class Episode:
    """A finished episode, as the rollout worker hands it on (one GRPO group member)."""

    tokens: EpisodeTokens
    """The sequence (see ``EpisodeTokens``)."""
    finish_reason: str
    """One of ``EPISODE_FINISH_REASONS``."""
    reward: float | None = None
    """Sum of the environment's step rewards; None: none given, the reward function scores
    the episode."""
    num_turns: int = 0
    """Model turns generated."""
    num_tool_calls: int = 0
    """Environment steps taken (each model turn answered by the environment)."""
    num_tool_errors: int = 0
    """Steps whose tool failed (``StepResult.tool_error``)."""
    num_truncated_observations: int = 0
    """Observations cut to ``rollout.multi_turn.max_tool_response_length`` tokens."""
    env_s: list[float] = field(default_factory=list)
    """Wall seconds of each ``reset``/``step`` call."""
    error: str | None = None
    """With ``env_error``: the environment's exception, one line."""
    timed_out: bool = False
    """With ``env_error``: a ``reset``/``step`` call ran past ``step_timeout_s``."""
    info: dict[str, float] = field(default_factory=dict)
    """Means of the steps' numeric ``info`` values."""
    response_text: str = ""
    """Decoded text of the model turns, joined (what a reward function scores)."""
    agent_state: dict[str, Any] | None = None
    """With ``aborted``: what continues the episode mid-way (``Trajectory.agent_state``)."""
    segments: list[EpisodeTokens] = field(default_factory=list)
    """Earlier linear segments, oldest first (an agent that edited its history); ``tokens``
    is the last. Each is trained as its own row with the episode's advantage."""
    num_segments: int = 1
    """Segments the episode's requests opened (those without a model turn included)."""
    num_tool_parse_errors: int = 0
    """Model turns whose tool-call text could not be parsed (returned as text)."""
    num_request_errors: int = 0
    """An agent's requests the endpoint refused as malformed (4xx; no budget refusals)."""
    num_requests_throttled: int = 0
    """An agent's requests refused because too many of its episode's were in flight (429)."""
    restarted: bool = False
    """This episode was cut on a paused worker without a state to continue from, and ran
    again from its prompt when its group was resumed (``agent/episodes_restarted``)."""

    def __post_init__(self) -> None:
        if self.finish_reason not in EPISODE_FINISH_REASONS:
            raise ValueError(
                f"episode finish_reason {self.finish_reason!r} is not one of "
                f"{sorted(EPISODE_FINISH_REASONS)}"
            )

    def to_trajectory(self, prompt_uid: str, sample_index: int) -> Trajectory:
        """This episode as the group member the rollouter scores and the trainer trains on;
        the environment's reward (if any) is set, else the reward function scores it."""
        tokens = self.tokens
        return Trajectory(
            prompt_uid=prompt_uid,
            sample_index=sample_index,
            prompt_ids=list(tokens.prompt_ids),
            response_ids=list(tokens.response_ids),
            rollout_logprobs=list(tokens.logprobs),
            token_versions=list(tokens.versions),
            finish_reason=self.finish_reason,
            reward=0.0 if self.reward is None else float(self.reward),
            response_text=self.response_text,
            loss_mask=list(tokens.loss_mask),
            episode={
                "turns": float(self.num_turns),
                "tool_calls": float(self.num_tool_calls),
                "tool_errors": float(self.num_tool_errors),
                "truncated_observations": float(self.num_truncated_observations),
                "env_s": float(sum(self.env_s)),
                "env_timeouts": float(self.timed_out),
                "env_reward": float(self.reward is not None),
                "segments": float(self.num_segments),
                "tool_parse_errors": float(self.num_tool_parse_errors),
                "request_errors": float(self.num_request_errors),
                "requests_throttled": float(self.num_requests_throttled),
                "restarted": float(self.restarted),
                **{f"{INFO_PREFIX}{key}": value for key, value in self.info.items()},
            },
            agent_state=self.agent_state,
            segments=[
                TrajectorySegment(
                    prompt_ids=list(s.prompt_ids),
                    response_ids=list(s.response_ids),
                    rollout_logprobs=list(s.logprobs),
                    token_versions=list(s.versions),
                    loss_mask=list(s.loss_mask),
                )
                for s in self.segments
            ],
        )
