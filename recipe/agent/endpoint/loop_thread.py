"""Run a coroutine on an event loop of its own, in a thread of its own.

A function agent is the user's code, and user code blocks: ``subprocess.run`` for a tool,
``time.sleep``, a synchronous HTTP client, even one calling its own episode's endpoint. On
the rollout worker's event loop such a call stalls the engine and every episode of the
worker (one to its own endpoint never returns, since the endpoint is served on that loop),
and the deadline that should end it cannot fire. So each episode's agent runs here:

    worker's loop                            the episode's thread (a daemon)
    await run_on_own_loop(make, name)  --->  asyncio.run(make()): the agent's client is
                                             created, used and closed on this loop
        <- its result or its exception  ---
    cancelled (agent_timeout_s)        --->  its task is cancelled; a thread still running
                                             CANCEL_GRACE_S later is blocked in a call that
                                             cannot be stopped: abandoned, one warning, it
                                             finishes in the background

One thread per episode, not a pool: in any pool smaller than the episodes in flight, one
blocking agent stalls the episodes sharing its loop, so isolation needs a loop per episode.
An episode's thread mostly waits on sockets (no CPU, a stack's pages touched); the episodes
in flight on a worker are bounded by its admission, and so are the threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

CANCEL_GRACE_S = 1.0
"""How long a cancelled agent has to unwind (close its client) before its thread is
abandoned; the episode's end waits this long at most."""


class AgentCancelledError(Exception):
    """The agent's own code cancelled the task it runs in (not the episode's deadline)."""


class _LoopThread(threading.Thread):
    """``asyncio.run(make())`` in a daemon thread; ``result`` gets its outcome."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Any]], name: str):
        super().__init__(name=name, daemon=True)  # an abandoned agent never holds up exit
        self._make = make
        self.result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # RUNNING from the start: cancelling the worker's side cannot cancel this future,
        # only the agent's task (``cancel``), so the thread always delivers its outcome
        self.result.set_running_or_notify_cancel()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def run(self) -> None:
        try:
            value = asyncio.run(self._main())
        except asyncio.CancelledError:
            self.result.set_exception(AgentCancelledError("the agent's task was cancelled"))
        except BaseException as exc:  # the agent's failure, handed to the worker's loop
            self.result.set_exception(exc)
        else:
            self.result.set_result(value)

    async def _main(self) -> Any:
        task = asyncio.current_task()
        assert task is not None  # run by asyncio.run
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), task
            if self._cancelled:  # the deadline came before the loop started
                task.cancel()
        return await self._make()

    def cancel(self) -> None:
        """Cancel the agent's task from another thread (it stops at its next ``await``)."""
        with self._lock:
            self._cancelled = True
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)


async def run_on_own_loop(make: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """``await make()`` on a loop in a thread of its own (module docstring); cancelling this
    cancels it there, waiting at most ``CANCEL_GRACE_S`` for it to unwind."""
    thread = _LoopThread(make, name)
    thread.start()
    try:
        result: T = await asyncio.wrap_future(thread.result)
        return result
    except asyncio.CancelledError:
        thread.cancel()
        unwound = asyncio.wrap_future(thread.result)
        await asyncio.wait({unwound}, timeout=CANCEL_GRACE_S)
        if unwound.done():
            unwound.exception()  # the episode's outcome is its deadline, whatever this says
        else:
            unwound.cancel()  # only this wrapper: the thread cannot be stopped
            logger.warning(
                "%s did not stop within %g s of its cancellation (blocked in a call that "
                "cannot be interrupted): its thread is abandoned and finishes in the background",
                name,
                CANCEL_GRACE_S,
            )
        raise
