"""``EpisodeRunner``: the n episodes of one prompt group, on one engine, concurrently.

    rollout worker --run_group(engine, record, budgets, seeds)--> n x (fresh AgentLoop, ctx)
                   <--n Trajectories (one sequence each, loss mask, per-token versions)--

Every episode gets its own agent loop (and so its own environment object), its own token
budget (``rollout.response_length``, or a benchmark's per-sample budget) and sampling seed.
The episodes of a group and of all groups on the worker interleave on its event loop: one
episode's environment step never blocks another's model turn. An agent loop that raises ends
only its own episode (``env_error``, reward 0); cancellation (the worker shutting down)
propagates.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from recipe.agent.config import MultiTurnConfig
from recipe.agent.context import AgentContext, EpisodeCut, SliceSink, TurnEngine
from recipe.agent.episode import Episode
from recipe.agent.loading import agent_loop_factory
from recipe.agent.render import ObservationRenderer
from recipe.protocol import PromptRecord, Trajectory
from recipe.utils.ray_errors import error_line

logger = logging.getLogger(__name__)


class EpisodeRunner:
    """Builds agent loops from ``rollout.multi_turn`` and runs groups of episodes."""

    def __init__(self, config: MultiTurnConfig, tokenizer: Any, eos_token_ids: list[int]):
        self.config = config
        self.make_loop = agent_loop_factory(config)
        self.renderer = ObservationRenderer(tokenizer, eos_token_ids, config.observation_role)

    async def run_group(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        *,
        budgets: list[int],
        seeds: list[int | None],
        trace: Any = None,
    ) -> list[Trajectory]:
        """``trace``: a ``RequestTrace`` that gets each episode's turns and environment calls
        as slices on an episode track (None: no slices)."""
        episodes = await asyncio.gather(
            *(
                self._traced(engine, record, i, budget, seed, trace)
                for i, (budget, seed) in enumerate(zip(budgets, seeds, strict=True))
            )
        )
        return [ep.to_trajectory(record.uid, i) for i, ep in enumerate(episodes)]

    async def _traced(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        index: int,
        budget: int,
        seed: int | None,
        trace: Any,
    ) -> Episode:
        if trace is None:
            return await self.run_episode(engine, record, budget, seed)
        slot = trace.begin_episode()
        tags = {"prompt_uid": record.uid, "sample": index}

        def on_slice(name: str, start_us: float, end_us: float, args: dict[str, Any]) -> None:
            trace.episode_slice(name, start_us, end_us, slot, tags | args)

        try:
            return await self.run_episode(engine, record, budget, seed, on_slice)
        finally:
            trace.end_episode(slot)

    async def run_episode(
        self,
        engine: TurnEngine,
        record: PromptRecord,
        budget: int,
        seed: int | None,
        on_slice: SliceSink | None = None,
    ) -> Episode:
        ctx = AgentContext(
            engine,
            self.renderer,
            self.config,
            response_length=budget,
            seed=seed,
            on_slice=on_slice,
        )
        try:
            await self.make_loop().run(ctx, record)
        except EpisodeCut:
            ctx.finish("aborted")
        except Exception as exc:  # the user's loop: it ends this episode, not the run
            logger.warning("agent loop failed on prompt %s: %s", record.uid, error_line(exc))
            ctx.finish("env_error", f"agent loop: {error_line(exc)}")
        if ctx.tokens is None:
            ctx.start(record.prompt)
        return ctx.episode()
