"""Episodes of a user's agent through the real in-process endpoint (``recipe.agent.endpoint``)
on one worker, with an engine that samples one fixed reply: for the tests of how agents are
run (threads, processes, environments), which care about the agent, not the tokens."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import TurnOutput
from recipe.agent.endpoint.episodes import EndpointEpisodes
from recipe.agent.endpoint.server import AgentServer
from recipe.agent.episode import Episode
from recipe.agent.render import ObservationRenderer
from recipe.protocol import PromptRecord
from recipe.tiny import build_tokenizer
from tests.helpers.chat_templates import TOOLS_TEMPLATE

REPLY = "Five."
"""What the engine answers every request with."""

CHAT = """
import json, os, sys, urllib.request

def chat(content, timeout_s=60):
    \"\"\"One chat request to the episode's endpoint; the reply's content.\"\"\"
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.load(response)["choices"][0]["message"]["content"]
"""
"""A command agent's preamble: ``chat(content)`` over HTTP with only the standard library
(urllib honours HTTP_PROXY and NO_PROXY, as most HTTP clients do)."""


class ReplyEngine:
    """Samples ``REPLY`` (+ EOS) for every request; counts them."""

    def __init__(self, tokenizer: Any):
        eos = tokenizer.eos_token_id
        self.ids = [*tokenizer.encode(REPLY, add_special_tokens=False), eos]
        self.num_requests = 0

    async def generate_turn(
        self, context_ids: list[int], max_tokens: int, seed: int | None
    ) -> TurnOutput:
        self.num_requests += 1
        await asyncio.sleep(0)
        ids = self.ids[:max_tokens]
        finish = "stop" if len(ids) == len(self.ids) else "length"
        return TurnOutput(ids, [-0.5] * len(ids), [0] * len(ids), finish)

    async def wait_until_running(self) -> None:
        return None


def python_command(tmp_path: Path, body: str, *args: str, name: str = "agent.py") -> str:
    """``agent_command`` running ``body`` (after ``CHAT``) as a Python script."""
    script = tmp_path / name
    script.write_text(CHAT + body)
    return " ".join([sys.executable, str(script), *args])


def run_episodes(
    tokenizer: Any,
    records: list[PromptRecord],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    **multi_turn: Any,
) -> list[Episode]:
    """Every record's episode at once, on one endpoint (one worker's) and one event loop."""
    config = MultiTurnConfig(enable=True, **multi_turn)
    endpoint = EndpointEpisodes(
        config, ObservationRenderer(tokenizer, [tokenizer.eos_token_id], "user")
    )
    endpoint.server = AgentServer("127.0.0.1")
    engine = ReplyEngine(tokenizer)

    async def go() -> list[Episode]:
        try:
            runs = [endpoint.run_episode(engine, r, 200, 1) for r in records]
            return list(await asyncio.gather(*runs))
        finally:
            await endpoint.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(go())


def chat_tokenizer(path: Path) -> Any:
    """The tiny byte-level tokenizer with a chat template."""
    tokenizer = build_tokenizer(path, model_max_length=4096)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def record(uid: str, prompt: str = "What is 2 + 3?", **extra: Any) -> PromptRecord:
    return PromptRecord(uid, prompt, "5", "test", dict(extra))
