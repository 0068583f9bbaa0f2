"""The journal writes of async steps, run off the event loop and tracked until they land.

An async step's fsynced journal append must not stall every other coroutine for the length
of a disk flush, so it runs in a worker thread; the run still has to know which of those
writes are in flight (a run paused by one coroutine reports the pause only after a sibling's
request already on its way is recorded).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

__all__ = ["OffLoop", "Offload"]

T = TypeVar("T")
Offload = Callable[[Callable[[], Any]], Awaitable[Any]]
"""A way to run a call off the loop (an async session's ordered queue), or the default."""


class OffLoop:
    """Calls handed off the event loop, remembered until each one is done."""

    def __init__(self) -> None:
        self.inflight: set[Any] = set()

    async def call(self, offload: Offload | None, call: Callable[[], T]) -> T:
        import asyncio  # here, not at the top: ~20 ms of every CLI run that only snapshots

        future: asyncio.Future[Any]
        if offload is not None:
            future = asyncio.ensure_future(offload(call))
        else:  # asyncio.to_thread's own steps, but its future as is: wrapping the coroutine in
            # a task (to track it) cost two more event-loop turns per step
            run = functools.partial(contextvars.copy_context().run, call)
            future = asyncio.get_running_loop().run_in_executor(None, run)
        self.inflight.add(future)
        future.add_done_callback(self.inflight.discard)
        return cast(T, await future)

    async def settle(self) -> None:
        """Wait for the calls handed off so far, and for those they lead to (a sibling may
        hand off one more write after each one lands). Never waits for a step's body."""
        import asyncio

        for _ in range(100):
            pending = [f for f in self.inflight if not f.done()]
            if not pending:
                return
            await asyncio.wait(pending)
