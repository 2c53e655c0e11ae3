"""Metrics of a step's multi-turn episodes, and the stop when too many environments fail.

agent/turns_mean, agent/tool_calls_mean     per episode
agent/segments_mean                         linear segments per episode (1 unless an agent
                                            edited its history; each is a training row)
agent/tool_parse_errors                     model turns whose tool calls did not parse
agent/request_errors                        agents' requests the endpoint refused as
                                            malformed (4xx: a bad field, messages the chat
                                            template rejects; budgets not counted)
agent/requests_throttled                    agents' requests refused with 429 (more than
                                            an episode may have in flight)
agent/episodes_restarted                    members of a resumed group that were cut
                                            without a state to continue from (an agent's
                                            episode; a failed state_dict), run again
agent/tool_errors, agent/env_errors,
agent/env_timeouts (episodes ended by a call past step_timeout_s; also env_errors),
agent/truncated_observations                counts over the step
agent/env_s_p50, agent/env_s_p99            environment seconds per episode
agent/finish_<reason>                       share of episodes per finish reason
agent/model_token_ratio                     model tokens / all tokens after the prompts
agent/info/<key>                            mean of the environment's ``StepResult.info``
                                            numbers over the episodes that report the key
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from recipe.agent.episode import INFO_PREFIX
from recipe.faults import RunFailure
from recipe.protocol import Trajectory


def agent_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The ``agent/*`` metrics of the episodes among ``trajs`` (empty without episodes)."""
    episodes = [t for t in trajs if t.episode]
    if not episodes:
        return {}
    num = len(episodes)
    env_s = sorted(t.episode.get("env_s", 0.0) for t in episodes)
    model = sum(sum(t.loss_mask or []) for t in episodes)
    total = sum(t.num_response_tokens for t in episodes)
    out = {
        "agent/turns_mean": sum(t.episode.get("turns", 0.0) for t in episodes) / num,
        "agent/tool_calls_mean": sum(t.episode.get("tool_calls", 0.0) for t in episodes) / num,
        "agent/segments_mean": sum(t.episode.get("segments", 1.0) for t in episodes) / num,
        "agent/tool_errors": sum(t.episode.get("tool_errors", 0.0) for t in episodes),
        "agent/tool_parse_errors": sum(t.episode.get("tool_parse_errors", 0.0) for t in episodes),
        "agent/request_errors": sum(t.episode.get("request_errors", 0.0) for t in episodes),
        "agent/requests_throttled": sum(t.episode.get("requests_throttled", 0.0) for t in episodes),
        "agent/episodes_restarted": sum(t.episode.get("restarted", 0.0) for t in episodes),
        "agent/env_errors": float(sum(t.finish_reason == "env_error" for t in episodes)),
        "agent/env_timeouts": sum(t.episode.get("env_timeouts", 0.0) for t in episodes),
        "agent/truncated_observations": sum(
            t.episode.get("truncated_observations", 0.0) for t in episodes
        ),
        "agent/env_s_p50": _quantile(env_s, 0.5),
        "agent/env_s_p99": _quantile(env_s, 0.99),
        "agent/model_token_ratio": model / total if total else 0.0,
    }
    for reason, count in sorted(Counter(t.finish_reason for t in episodes).items()):
        out[f"agent/finish_{reason}"] = count / num
    info: dict[str, list[float]] = {}
    for traj in episodes:
        for key, value in traj.episode.items():
            if key.startswith(INFO_PREFIX):
                info.setdefault(key, []).append(value)
    for key, values in sorted(info.items()):
        out[f"agent/{key}"] = sum(values) / len(values)
    return out


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class EnvironmentFailureError(RunFailure):
    """Too many of one step's episodes ended in an environment error (the run stops with
    this one line, as for any ``RunFailure``)."""


def check_env_errors(trajs: Sequence[Trajectory], max_ratio: float, environment: str) -> None:
    """Raise (one line naming the environment and a prompt uid) when more than ``max_ratio``
    of the episodes among ``trajs`` ended in ``env_error``."""
    episodes = [t for t in trajs if t.episode]
    failed = [t for t in episodes if t.finish_reason == "env_error"]
    if episodes and len(failed) / len(episodes) > max_ratio:
        raise EnvironmentFailureError(
            f"{len(failed)} of {len(episodes)} episodes of this step ended in an error of "
            f"environment {environment} (more than rollout.multi_turn.max_env_error_ratio="
            f"{max_ratio:g}), e.g. on prompt {failed[0].prompt_uid!r}"
        )
