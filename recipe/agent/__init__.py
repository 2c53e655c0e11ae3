"""Multi-turn episodes: environments, agent loops, token-in/token-out bookkeeping.

interface.py  Environment, AgentLoop, StepResult (what users write)
context.py    AgentContext (generate / append_observation / call_env), TurnEngine
env_loop.py   EnvironmentLoop (the default loop), SingleTurnEnvironment
episode.py    EpisodeTokens, Episode (one sequence: ids, loss mask, log-probs, versions)
render.py     ObservationRenderer (text, or chat-template deltas checked at startup)
loading.py    agent_loop_factory (import paths from rollout.multi_turn)
config.py     MultiTurnConfig (rollout.multi_turn.*)
chat_session.py, tool_calls.py, tool_parsers.py, vllm_tool_parsers.py
              an OpenAI API conversation as sampled token segments; tool-call parsing
endpoint/     the OpenAI-compatible endpoint per rollout worker and user agents
              (rollout.multi_turn.agent / agent_command)
examples/     agents written against the OpenAI API
"""

from recipe.agent.context import AgentContext, TurnEngine, TurnOutput
from recipe.agent.env_loop import EnvironmentLoop, SingleTurnEnvironment
from recipe.agent.episode import Episode, EpisodeTokens, Observation
from recipe.agent.interface import AgentLoop, Environment, StepResult

__all__ = [
    "AgentContext",
    "AgentLoop",
    "Environment",
    "EnvironmentLoop",
    "Episode",
    "EpisodeTokens",
    "Observation",
    "SingleTurnEnvironment",
    "StepResult",
    "TurnEngine",
    "TurnOutput",
]
