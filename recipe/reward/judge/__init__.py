"""An LLM judge as the reward (``reward.judge.*``): a judge model scores responses where a
task has no verifier.

    config.py    JudgeConfig, the schema (validated at startup, the template read once)
    prompts.py   the built-in templates and their brace-safe rendering
    verdicts.py  parse_score / parse_winner: the documented rules that read a reply
    backend.py   JudgeCall, JudgeReply, the JudgeBackend protocol, EndpointBackend
    judge.py     Judge: the calls of a group (pointwise or pairwise), deadlines, retries
                 (a follow-up turn after an unreadable verdict), the concurrency bound
    metrics.py   JudgeStats: the counters of the calls and the judge/* metrics
"""

from recipe.reward.judge.backend import EndpointBackend, JudgeBackend, JudgeCall, JudgeReply
from recipe.reward.judge.config import JudgeConfig
from recipe.reward.judge.judge import Judge, JudgeError
from recipe.reward.judge.verdicts import parse_score, parse_winner

__all__ = [
    "EndpointBackend",
    "Judge",
    "JudgeBackend",
    "JudgeCall",
    "JudgeConfig",
    "JudgeError",
    "JudgeReply",
    "parse_score",
    "parse_winner",
]
