"""Async actors in this process, called from another thread as the driver calls Ray actors.

    LoopThread        an asyncio event loop in a daemon thread: where the "actors" run (the
                      fully async rollouter, its message queue, its scripted engines), as an
                      async Ray actor runs every call on its one event loop
    ThreadHandle(obj) ``h.method.remote(...)`` from any thread runs ``obj.method(...)`` on the
                      loop (awaited when it is a coroutine) and returns a
                      ``concurrent.futures.Future``, the ObjectRef of these actors
    FutureWaits       ``Waits`` (fully_async_policy/driver/clients.py) over those futures

Arguments and results are passed by reference, not serialised as Ray would: a test that
needs Ray's copy semantics runs against real actors (tests/integration/).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread until ``close``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float = 30.0) -> T:
        """Run the coroutine ``make()`` on the loop; its result (or error) here."""

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def close(self) -> None:
        """Cancel what still runs on the loop, then stop it and its thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            self.call(cancel_all)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class _ThreadRemote:
    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any]) -> None:
        self._loop, self._fn = loop, fn

    def remote(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        async def call() -> Any:
            result = self._fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(call(), self._loop)


class ThreadHandle:
    """``obj`` called from another thread as a Ray actor is (module docstring)."""

    def __init__(self, obj: Any, loop: LoopThread) -> None:
        self.obj, self._loop = obj, loop.loop

    def __getattr__(self, name: str) -> _ThreadRemote:
        return _ThreadRemote(self._loop, getattr(self.obj, name))


class FutureWaits:
    """``Waits`` over ``ThreadHandle``'s futures; a wait past its timeout raises
    ``TimeoutError``, as Ray's ``GetTimeoutError`` is one."""

    def get(self, ref: concurrent.futures.Future, *, timeout: float | None = None) -> Any:
        return ref.result(timeout)

    def first_ready(
        self, refs: Sequence[concurrent.futures.Future], *, timeout: float | None
    ) -> list[concurrent.futures.Future]:
        done, _ = concurrent.futures.wait(
            refs, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return [ref for ref in refs if ref in done]
