"""``ActorBackend``: the judge calls of any process of a run, answered by the run's own judge
engines (``JudgeServer``, recipe/workers/judge_server.py).

    RewardFunction (driver or rollouter) --Judge--> ActorBackend --complete(call)--> JudgeServer
                                                                   (named actor JUDGE_ACTOR)

The server is a named Ray actor of the run's namespace, so a reward function rebuilt from its
config in another process (the fully async rollouter) finds it by name; nothing but the name
crosses. The handle is looked up on the first call and again after a call that found the
actor gone (it is restarted under the same name only by a new run).
"""

from __future__ import annotations

import asyncio
from typing import Any

from recipe.reward.judge.backend import JudgeCall, JudgeReply

JUDGE_ACTOR = "judge"
"""The name of the run's ``JudgeServer`` actor."""
LOOKUP_TIMEOUT_S = 60.0
"""How long a first call waits for the server's name to appear (it starts with the run)."""


class JudgeUnavailable(RuntimeError):
    """No judge server of that name in the run's Ray namespace within the lookup deadline."""


class ActorBackend:
    """``JudgeBackend`` over the run's ``JudgeServer`` actor (module docstring)."""

    constrains = False
    """Whether the server keeps replies to ``JudgeCall.choices``: asked at the lookup, which
    the first call makes, before any retry could send choices."""

    def __init__(self, name: str = JUDGE_ACTOR, lookup_timeout_s: float = LOOKUP_TIMEOUT_S):
        self.name = name
        self.lookup_timeout_s = lookup_timeout_s
        self._handle: Any = None

    def __reduce__(self) -> tuple[type[ActorBackend], tuple[str, float]]:
        return (ActorBackend, (self.name, self.lookup_timeout_s))

    async def complete(self, call: JudgeCall) -> JudgeReply:
        import ray

        handle = self._handle or await self._lookup()
        try:
            reply: JudgeReply = await handle.complete.remote(call)
        except ray.exceptions.RayActorError:
            self._handle = None  # a later attempt looks the name up again
            raise
        return reply

    async def _lookup(self) -> Any:
        import ray

        deadline = asyncio.get_running_loop().time() + self.lookup_timeout_s
        while True:
            try:
                handle = ray.get_actor(self.name)
                self.constrains = bool(await handle.constrains.remote())
                self._handle = handle
                return handle
            except ValueError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise JudgeUnavailable(
                        f"no judge server {self.name!r} in this Ray namespace within "
                        f"{self.lookup_timeout_s:g} s (reward.judge.model starts it with the run)"
                    ) from None
                await asyncio.sleep(0.5)
