"""``EpisodeRunner``: the n episodes of one prompt group, on one engine, concurrently.

    rollout worker --run_group(engine, record, budgets, seeds)--> n x (fresh AgentLoop, ctx)
                   <--n Trajectories (one sequence each, loss mask, per-token versions)--

Every episode gets its own agent loop (and so its own environment object), its own token
budget (``rollout.response_length``, or a benchmark's per-sample budget) and sampling seed.
The episodes of a group and of all groups on the worker interleave on its event loop: one
episode's environment step never blocks another's model turn. An agent loop that raises ends
only its own episode (``env_error``, reward 0); cancellation (the worker shutting down)
propagates.

A checkpoint cuts episodes only where they wait for a paused engine (``EpisodeCut``); when
the environment saves its state, the cut episode carries it (``Trajectory.agent_state``)
and a later ``run_group(resume=...)`` continues it on a fresh environment object.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import AgentContext, EpisodeCut, SliceSink, TurnEngine
from recipe.agent.endpoint.episodes import EndpointEpisodes
from recipe.agent.env_loop import EnvironmentLoop
from recipe.agent.episode import Episode, EpisodeTokens
from recipe.agent.interface import AgentLoop
from recipe.agent.loading import agent_loop_factory, episodes_save_state
from recipe.agent.render import ObservationRenderer
from recipe.protocol import PromptRecord, Trajectory
from recipe.utils.ray_errors import error_line

logger = logging.getLogger(__name__)


class EpisodeRunner:
    """Builds agent loops from ``rollout.multi_turn`` and runs groups of episodes."""

    def __init__(self, config: MultiTurnConfig, tokenizer: Any, eos_token_ids: list[int]):
        self.config = config
        self.renderer = ObservationRenderer(tokenizer, eos_token_ids, config.observation_role)
        self.endpoint = EndpointEpisodes(config, self.renderer) if config.endpoint_agent else None
        """Episodes of a user's agent through the OpenAI-compatible endpoint, when set."""
        self.make_loop = agent_loop_factory(config) if self.endpoint is None else None
        self.saves_state = self.endpoint is None and episodes_save_state(config)
        """Episodes cut for a checkpoint carry their state (``Trajectory.agent_state``)."""

    async def close(self) -> None:
        """Release the endpoint (if one was started)."""
        if self.endpoint is not None:
            await self.endpoint.close()

    async def run_group(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        *,
        budgets: list[int],
        seeds: list[int | None],
        trace: Any = None,
        resume: list[Trajectory] | None = None,
    ) -> list[Trajectory]:
        """``trace``: a ``RequestTrace`` that gets each episode's turns and environment calls
        as slices on an episode track (None: no slices). ``resume``: the group as a
        checkpoint cut it: finished members pass through, cut ones continue from their
        ``agent_state`` (without one: again from scratch)."""
        members = resume if resume is not None else [None] * len(budgets)
        results = await asyncio.gather(
            *(
                self._member(engine, record, i, budget, seed, trace, cut)
                for i, (budget, seed, cut) in enumerate(zip(budgets, seeds, members, strict=True))
            )
        )
        return [
            r if isinstance(r, Trajectory) else r.to_trajectory(record.uid, i)
            for i, r in enumerate(results)
        ]

    async def _member(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        index: int,
        budget: int,
        seed: int | None,
        trace: Any,
        cut: Trajectory | None,
    ) -> Episode | Trajectory:
        if cut is not None and cut.finish_reason != "aborted":
            return cut  # finished before the checkpoint
        restarted = cut is not None and (cut.agent_state is None or not self.saves_state)
        if restarted:
            logger.warning(
                "episode %d of prompt %s was cut without a state this %s loads: it starts again",
                index,
                record.uid,
                "agent" if self.endpoint is not None else "environment",
            )
            cut = None
        episode = await self._traced(engine, record, index, budget, seed, trace, cut)
        episode.restarted = restarted
        return episode

    async def _traced(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        index: int,
        budget: int,
        seed: int | None,
        trace: Any,
        cut: Trajectory | None,
    ) -> Episode:
        """``run_episode``, its slices in ``trace``'s episode track when there is one."""
        if trace is None:
            return await self.run_episode(engine, record, budget, seed, cut=cut)
        slot = trace.begin_episode()
        tags = {"prompt_uid": record.uid, "sample": index}

        def on_slice(name: str, start_us: float, end_us: float, args: dict[str, Any]) -> None:
            trace.episode_slice(name, start_us, end_us, slot, tags | args)

        try:
            return await self.run_episode(engine, record, budget, seed, on_slice, cut)
        finally:
            trace.end_episode(slot)

    async def run_episode(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        budget: int,
        seed: int | None,
        on_slice: SliceSink | None = None,
        cut: Trajectory | None = None,
    ) -> Episode:
        """One episode: a fresh one, or the continuation of ``cut`` (an aborted trajectory
        with its ``agent_state``)."""
        if self.endpoint is not None:
            try:
                return await self.endpoint.run_episode(engine, record, budget, seed, on_slice)
            except EpisodeCut:  # an agent's coroutine cannot be saved: it starts again
                episode = Episode(EpisodeTokens(self.renderer.prompt_ids(record.prompt)), "aborted")
                return episode
        assert self.make_loop is not None
        ctx = AgentContext(
            engine,
            self.renderer,
            self.config,
            response_length=budget,
            seed=seed,
            on_slice=on_slice,
        )
        loop = self.make_loop()
        if cut is not None and not self._continue(loop, ctx, record, cut):
            return ctx.episode()
        state = None
        try:
            await loop.run(ctx, record)
        except EpisodeCut:
            ctx.finish("aborted")
            state = self._save(loop, ctx, record)
        except Exception as exc:  # the user's loop: it ends this episode, not the run
            logger.warning("agent loop failed on prompt %s: %s", record.uid, error_line(exc))
            ctx.finish("env_error", f"agent loop: {error_line(exc)}")
        if ctx.tokens is None:
            ctx.start(record.prompt)
        episode = ctx.episode()
        episode.agent_state = state
        return episode

    def _save(self, loop: AgentLoop, ctx: AgentContext, record: PromptRecord) -> dict | None:
        """The cut episode's state as JSON values; None (it starts again) when its
        environment saves none or ``state_dict`` fails."""
        if not self.saves_state:
            return None
        assert isinstance(loop, EnvironmentLoop)
        env = loop.environment
        try:
            state = ctx.state_dict() | {"environment": env.state_dict()}
            return json.loads(json.dumps(state, allow_nan=False))
        except Exception as exc:
            logger.warning(
                "%s.state_dict() on prompt %s: %s; its episode starts again from scratch "
                "(state_dict must return JSON values)",
                type(env).__name__,
                record.uid,
                error_line(exc),
            )
            return None

    def _continue(
        self, loop: AgentLoop, ctx: AgentContext, record: PromptRecord, cut: Trajectory
    ) -> bool:
        """Load ``cut`` into ``ctx`` and its environment state into ``loop``; False (the
        episode ends as ``env_error``) when the environment rejects its state."""
        assert self.saves_state and isinstance(loop, EnvironmentLoop) and cut.agent_state
        state = cut.agent_state
        ctx.load_state_dict(EpisodeTokens.from_trajectory(cut), state)
        try:
            loop.environment.load_state_dict(state["environment"], record)
        except Exception as exc:  # the user's environment: it ends this episode only
            ctx.finish("env_error", f"load_state_dict: {error_line(exc)}")
            return False
        return True
