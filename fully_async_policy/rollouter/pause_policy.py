"""``PausePolicy``: what a sync's pause does with the groups in flight, chosen once from config.

Three ways, one per pair of ``async_training.partial_rollout`` and ``rollout.multi_turn.enable``::

    policy          partial_rollout  multi_turn  hold (before the pause)    pause
    DRAIN           false            either      groups in flight finish    nothing in flight
                                                 on the old weights
    CUT             true             false       nothing to wait for        in-flight groups come
                                                                            back cut (partials,
                                                                            resumed at end_sync)
    KEEP_EPISODES   true             true        nothing to wait for        episodes stay in the
                                                                            workers; their turns go
                                                                            on on the new weights

The rollouter (sync.py, checkpoint.py) asks its policy at each step of a sync instead of reading the
flags again, so a fourth way is one more member here.
"""

from __future__ import annotations

from enum import Enum

from recipe.config import RecipeConfig


class PausePolicy(Enum):
    DRAIN = "drain"
    """Wait at the hold for the groups in flight to finish on the old weights."""
    CUT = "cut"
    """The pause cuts the groups in flight; they come back as partials."""
    KEEP_EPISODES = "keep_episodes"
    """Episodes stay in flight, waiting in the paused workers (recipe.agent)."""

    @classmethod
    def of(cls, cfg: RecipeConfig) -> PausePolicy:
        """The policy ``cfg``'s ``async_training.partial_rollout`` and
        ``rollout.multi_turn.enable`` choose."""
        if not cfg.async_training.partial_rollout:
            return cls.DRAIN
        return cls.KEEP_EPISODES if cfg.rollout.multi_turn.enable else cls.CUT

    @property
    def drains_at_hold(self) -> bool:
        """The hold waits for the groups in flight (``rollout.generation_timeout_s``)."""
        return self is PausePolicy.DRAIN

    @property
    def waits_for_cut_groups(self) -> bool:
        """The pause waits for the groups it cut to come back (``checkpoint_engine.timeout_s``)."""
        return self is PausePolicy.CUT

    @property
    def cuts_overtaken_calls(self) -> bool:
        """A group whose call reaches a worker after the pause (Ray does not order an async
        actor's calls) comes back unstarted (``GenerationRequest.cut_if_paused``), cut at its
        first token as the pause cuts the others, instead of waiting for the resume."""
        return self is PausePolicy.CUT

    @property
    def keeps_episodes(self) -> bool:
        """Groups still in flight after the pause are episodes waiting in the workers, counted
        with the partial groups."""
        return self is PausePolicy.KEEP_EPISODES
