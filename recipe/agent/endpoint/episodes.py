"""``EndpointEpisodes``: episodes driven by a user's agent through the worker's endpoint.

    run_episode(engine, record, budget, seed)
      server.open(ChatEpisode)  -> base URL + a key of its own
      agent.run(credentials, record)   under agent_timeout_s; its requests become turns
      -> Episode: the last segment as the episode, earlier ones as its segments

How an episode ends:

    the agent returned                  stop
    a budget refused a request          length (whether the agent returned or raised then)
    the agent raised / exited non-zero  env_error (not trained on; counted; toward
    / ran past agent_timeout_s          max_env_error_ratio), with its error line
    no request at all                   env_error ("the agent made no model request")
    a checkpoint cut it (EpisodeCut)    aborted, without a state: it starts again
    the engine failed inside a request  the engine's error is raised (a replica failure,
    (its generate call, nothing else)   not the agent's)

A request the endpoint refuses (a malformed field, messages the chat template rejects, a
token id outside the vocabulary: 4xx, ``agent/request_errors``) ends nothing by itself: the
agent sees the error and goes on, or fails and its episode is ``env_error``. When the episode
ends, its requests still in flight are cancelled before the episode is built.

The reward is the agent's; None: the reward function scores the final answer (the last
turn's content).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from recipe.agent.chat_session import ChatSession
from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import SliceSink, TurnEngine
from recipe.agent.endpoint.agents import load_agent
from recipe.agent.endpoint.chat import ChatEpisode, EpisodeLimits, renders_tools
from recipe.agent.endpoint.server import AgentServer, Credentials, body_limit
from recipe.agent.episode import Episode, EpisodeTokens
from recipe.agent.render import ObservationRenderer
from recipe.agent.tool_parsers import make_tool_parser
from recipe.protocol import PromptRecord
from recipe.utils.ray_errors import error_line

logger = logging.getLogger(__name__)


class EndpointEpisodes:
    """Runs endpoint episodes on one worker (module docstring)."""

    def __init__(self, config: MultiTurnConfig, renderer: ObservationRenderer):
        self.config, self.renderer = config, renderer
        self.agent = load_agent(config)
        self.parser = make_tool_parser(config.tool_parser, renderer.tokenizer)
        self.server = AgentServer()
        self.tools_rendered = renders_tools(renderer.tokenizer)
        self.max_context: int | None = None
        """Prompt and response tokens the engine takes (set once the engine started)."""
        self.max_prompt_length: int | None = None
        """Tokens of a new segment's prompt: the run's ``data.max_prompt_length`` (set by
        the rollout worker; None: bounded by ``max_context`` only)."""
        self.vocab_size = len(renderer.tokenizer)
        """Token ids a ``/v1/completions`` prompt may hold: ``[0, vocab_size)``."""

    async def run_episode(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        budget: int,
        seed: int | None,
        on_slice: SliceSink | None = None,
    ) -> Episode:
        await self.server.start(body_limit(self.max_context))
        limits = EpisodeLimits(
            response_length=budget,
            max_turns=self.config.max_assistant_turns,
            max_turn_tokens=self.config.max_turn_tokens,
            max_context=self.max_context,
            max_prompt=self.max_prompt_length,
        )
        chat = ChatEpisode(
            engine,
            ChatSession(self.renderer),
            self.parser,
            limits,
            vocab_size=self.vocab_size,
            seed=seed,
            on_slice=on_slice,
            tools_rendered=self.tools_rendered,
        )
        credentials = self.server.open(chat)
        start = time.perf_counter()
        try:
            reward, finish, error = await self._run_agent(credentials, record)
        finally:
            self.server.close_episode(credentials)
        agent_s = max(time.perf_counter() - start - chat.model_s, 0.0)
        return self._episode(chat, record, reward, finish, error, agent_s)

    async def _run_agent(
        self, credentials: Credentials, record: PromptRecord
    ) -> tuple[float | None, str, str | None]:
        """(reward, finish reason, error) of the agent's run; the engine's failure and a
        checkpoint's cut are raised."""
        task = asyncio.create_task(self.agent.run(credentials, record))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.config.agent_timeout_s)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        failure = self.server.failure(credentials)
        if failure is not None:
            if task.done() and not task.cancelled():
                task.exception()  # the agent's reaction to the failure: superseded by it
            raise failure
        if not done:
            limit = f"{self.config.agent_timeout_s:g}"
            return None, "timeout", f"agent: no return within agent_timeout_s={limit} s"
        exc = task.exception()
        if exc is not None:
            line = error_line(exc)
            if exc.__cause__ is not None:  # e.g. the transport error under a client's own
                line += f" ({error_line(exc.__cause__)})"
            logger.warning("agent failed on prompt %s: %s", record.uid, line)
            return None, "env_error", f"agent: {line}"
        return task.result(), "stop", None

    def _episode(
        self,
        chat: ChatEpisode,
        record: PromptRecord,
        reward: float | None,
        finish: str,
        error: str | None,
        agent_s: float,
    ) -> Episode:
        trained = [s.tokens for s in chat.session.segments if s.tokens.num_model_tokens]
        timed_out = finish == "timeout"
        if timed_out:
            finish = "env_error"
        if not trained and finish != "env_error":
            finish, error = "env_error", "agent: the agent made no model request"
        if chat.budget_spent and not timed_out and trained:
            finish, error = "length", None  # an agent failing on the refusal included
        if finish == "env_error":
            reward = None
        tokens = trained[-1] if trained else EpisodeTokens(self.renderer.prompt_ids(record.prompt))
        return Episode(
            tokens=tokens,
            segments=trained[:-1],
            finish_reason=finish,
            reward=reward,
            num_turns=chat.num_turns,
            num_tool_calls=chat.num_tool_calls,
            num_tool_parse_errors=chat.num_tool_parse_errors,
            num_request_errors=chat.num_request_errors,
            num_requests_throttled=chat.num_requests_throttled,
            env_s=[agent_s],
            error=error,
            timed_out=timed_out,
            response_text=chat.last_text,
            num_segments=len(chat.session.segments),
        )

    async def close(self) -> None:
        await self.agent.close()
        await self.server.close()
