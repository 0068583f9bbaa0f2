"""The saver's async methods: the sync ones, run in a worker thread through the serial queues
of :mod:`stashpoint.aio`, one queue per thread's calls so they keep their order."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from ...aio import SerialQueue
from ...session import RewindResult
from .framework import (
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    LGCheckpoint,
    RunnableConfig,
)

if TYPE_CHECKING:
    from .saver import StashpointSaver


def _queue(self: StashpointSaver, thread: Any) -> SerialQueue:
    """Where a thread's async calls run, one at a time in the order made (other threads'
    mostly beside them): calls without a thread share one queue."""
    if isinstance(thread, dict):
        thread = (thread.get("configurable") or {}).get("thread_id")
    return self._calls[hash(str(thread)) % len(self._calls)]


async def aget_tuple(self: StashpointSaver, config: RunnableConfig) -> CheckpointTuple | None:
    self._note_loop(config)  # here: the worker thread runs in a copy of this context
    return await self._queue(config).call(self.get_tuple, config)


async def alist(
    self: StashpointSaver,
    config: RunnableConfig | None,
    *,
    filter: dict[str, Any] | None = None,
    before: RunnableConfig | None = None,
    limit: int | None = None,
) -> AsyncIterator[CheckpointTuple]:
    def collect() -> builtins.list[CheckpointTuple]:
        return builtins.list(self.list(config, filter=filter, before=before, limit=limit))

    for tup in await self._queue(config).call(collect):
        yield tup


async def aput(
    self: StashpointSaver,
    config: RunnableConfig,
    checkpoint: LGCheckpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> RunnableConfig:
    return await self._queue(config).call(self.put, config, checkpoint, metadata, new_versions)


async def aput_writes(
    self: StashpointSaver,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str = "",
) -> None:
    await self._queue(config).call(self.put_writes, config, writes, task_id, task_path)


async def adelete_thread(self: StashpointSaver, thread_id: str) -> None:
    await self._queue(thread_id).call(self.delete_thread, thread_id)


async def adelete_for_runs(self: StashpointSaver, run_ids: Sequence[str]) -> None:
    await self._queue(None).call(self.delete_for_runs, run_ids)


async def acopy_thread(self: StashpointSaver, source_thread_id: str, target_thread_id: str) -> None:
    await self._queue(None).call(self.copy_thread, source_thread_id, target_thread_id)


async def aprune(
    self: StashpointSaver, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
) -> None:
    await self._queue(None).call(self.prune, thread_ids, strategy=strategy)


async def arestore_files(self: StashpointSaver, config: RunnableConfig) -> RewindResult:
    return await self._queue(config).call(self.restore_files, config)


class AsyncMethods:
    """The methods above, as :class:`StashpointSaver` has them."""

    _queue = _queue
    aget_tuple = aget_tuple
    alist = alist
    aput = aput
    aput_writes = aput_writes
    adelete_thread = adelete_thread
    adelete_for_runs = adelete_for_runs
    acopy_thread = acopy_thread
    aprune = aprune
    arestore_files = arestore_files
