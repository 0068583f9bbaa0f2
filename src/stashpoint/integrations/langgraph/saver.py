"""The LangGraph checkpointer, :class:`StashpointSaver`: its constructor and LangGraph's
interface, each operation built from the parts in the sibling modules."""

from __future__ import annotations

import builtins
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from ..._store import Store
from ...aio import SerialQueue
from ...errors import UsageError
from ...model import Checkpoint
from ...opening import open_store
from ...redact import make_redactor
from .async_api import AsyncMethods
from .files import DURABILITY, FILES_BRANCH, Ahead, Files, When, WorkspaceFiles
from .framework import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    LGCheckpoint,
    RunnableConfig,
    SerializerProtocol,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from .pending import PendingMap, PendingWrites
from .reading import Reader, Reading, Views
from .records import Entry, Serializing, Write
from .removing import Removing
from .threads import Thread, ThreadIndex, describe
from .writing import Writing

__all__ = ["FILES_BRANCH", "StashpointSaver"]

_KEEP_LOGS = 64  # conversation logs whose decoded messages the saver keeps


class StashpointSaver(
    Serializing,
    ThreadIndex,
    Reading,
    PendingWrites,
    WorkspaceFiles,
    Writing,
    Removing,
    AsyncMethods,
    BaseCheckpointSaver[int],
):
    """A LangGraph checkpointer (``BaseCheckpointSaver``) backed by a stashpoint store.

    Args:
        store: a :class:`stashpoint.Store`, or a URL/path to open (default ``./.stashpoint``;
            ``memory://``, ``postgresql://…`` and ``redis://…`` work too); a store opened
            here is closed by :meth:`close`.
        workspace: a directory snapshotted with every root-namespace checkpoint.
        restore_on_time_travel: when a put's parent is not the head of its line (time
            travel, a fork), first rewind the workspace files to the parent's snapshot.
        conversation_channel: the channel kept as an append-only conversation (None: none).
        session_prefix: a thread's stashpoint session is named prefix + thread id.
        serde: LangGraph serializer (default: LangGraph's ``JsonPlusSerializer``).
        force: allow a workspace at ``/`` or ``$HOME``.
        bind: ``workspace`` is where this saver's threads live, whatever directory their
            checkpoints were taken in (a thread imported from a bundle, a moved project):
            restores write there and the threads are bound to it. Without it, restoring a
            thread's files into a directory its checkpoints were not taken in is refused.
        redact: scrub secrets from every value, message and metadata before it is serialized
            (the stashpoint session sees only serialized bytes, where no pattern can match);
            the same argument as :class:`stashpoint.Session`'s ``redact``. A callable gets
            LangGraph's values themselves (message objects included).

    The sync methods do their I/O in the calling thread, the async ones in a worker thread.
    Channel versions are integers.
    """

    def __init__(
        self,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        restore_on_time_travel: bool = False,
        conversation_channel: str | None = "messages",
        session_prefix: str = "lg:",
        serde: SerializerProtocol | None = None,
        force: bool = False,
        redact: bool | Mapping[str, str] | Callable[[Any], Any] | None = None,
        bind: bool = False,
    ) -> None:
        super().__init__(serde=serde)
        if not session_prefix:
            raise UsageError("session_prefix must not be empty")
        if restore_on_time_travel and workspace is None:
            raise UsageError("restore_on_time_travel needs a workspace directory")
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            self.store, self._owns_store = open_store(store), True
        self.workspace = os.fspath(workspace) if workspace is not None else None
        self.restore_on_time_travel = restore_on_time_travel
        self.conversation_channel = conversation_channel
        self.session_prefix = session_prefix
        self.force = force
        self.bind = bind
        self.redactor = make_redactor(redact, Path(workspace) if workspace is not None else None)
        self._threads: OrderedDict[str, Thread] = OrderedDict()
        self._views = Views(_KEEP_LOGS)
        self._tiny: dict[bytes, Any] = {}
        self._lock = threading.RLock()
        self._max_threads = 256
        self._warned = False
        self._version = 0  # the last version get_next_version handed out
        self._files_lock = threading.RLock()
        self._files_ws: Files | None = None
        self._ahead: OrderedDict[int, Ahead] = OrderedDict()
        self._calls = [SerialQueue() for _ in range(8)]  # async calls, by thread id: _queue

    # -- stashpoint views ----------------------------------------------------------------
    def session_name(self, thread_id: str) -> str:
        """The stashpoint session of a LangGraph thread (``stashpoint --session NAME log``)."""
        return self.session_prefix + str(thread_id)

    def record(self, config: RunnableConfig) -> Checkpoint:
        """The stashpoint checkpoint behind a LangGraph checkpoint (``stashpoint show ID``)."""
        _th, entry = self._find(config)
        if entry is None:
            raise UsageError(f"no LangGraph checkpoint for {describe(config)}")
        return entry.record

    # -- LangGraph's interface: reading --------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._note_loop(config)
        th, entry = self._find(config)
        if entry is None:
            return None
        with th.lock:
            tup, cache = self._tuple(th, entry, Reader(self), seed=True)
            th.last_read = cache
        return tup

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        conf = (config or {}).get("configurable") or {}
        p = self.session_prefix
        if conf.get("thread_id") is not None:
            thread_ids = [str(conf["thread_id"])]
        else:
            thread_ids = [s[len(p) :] for s in self.store.sessions() if s.startswith(p)]
        ns = conf.get("checkpoint_ns")
        wanted = conf.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        picked: builtins.list[tuple[Thread, Entry]] = []
        readers: dict[str, Reader] = {}
        for thread_id in thread_ids:
            th = self._thread(thread_id, check=True)
            reader = readers[th.session] = Reader(self)
            with th.lock:
                if filter:
                    self._prefetch_details(th.entries.values())
                for e in th.entries.values():
                    if (
                        (ns is not None and e.ns != ns)
                        or (wanted and e.cpid != wanted)
                        or (before_id and e.cpid >= before_id)
                    ):
                        continue
                    if filter:
                        md = self._details(e, reader)["md"]
                        if not all(md.get(k) == v for k, v in filter.items()):
                            continue
                    picked.append((th, e))
        picked.sort(key=lambda te: (te[1].cpid, te[1].ns), reverse=True)
        if limit is not None:
            picked = picked[: max(limit, 0)]
        by_thread: dict[str, tuple[Thread, builtins.list[Entry]]] = {}
        for th, e in picked:  # their fields, and those of the records holding their writes
            got = by_thread.setdefault(th.session, (th, []))[1]
            got.append(e)
            got += th.holders.get((e.ns, e.cpid), ())
        for th, entries in by_thread.values():
            with th.lock:
                self._prefetch_details(entries)
        for th, e in picked:
            with th.lock:
                tup, _cache = self._tuple(th, e, readers[th.session], seed=False)
            yield tup

    # -- LangGraph's interface: writing --------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns") or "")
        parent = conf.get("checkpoint_id") or None
        md = dict(get_serializable_checkpoint_metadata(config, metadata))
        when = When(str(md.get("source") or ""), conf.get(DURABILITY))
        th = self._thread(thread_id, check=False)
        with th.lock:
            self._put(th, ns, cast(dict[str, Any], checkpoint), md, new_versions, parent, when)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        key = (str(conf.get("checkpoint_ns") or ""), str(conf["checkpoint_id"]))
        th = self._thread(str(conf["thread_id"]), check=False)
        encoded: dict[int, bytes | builtins.list[bytes]] = {}  # once, whatever the retries

        def add(pending: PendingMap) -> bool:
            have = self._writes_of(th, key, Reader(self)) if key in th.holders else {}
            mine = pending.setdefault(key, {})
            changed = False
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                if idx >= 0 and ((task_id, idx) in have or (task_id, idx) in mine):
                    continue  # regular channels keep the first write, as in LangGraph's savers
                if i not in encoded:
                    encoded[i] = self._encode_write(value)
                mine[(task_id, idx)] = Write(task_id, idx, channel, task_path, encoded[i])
                changed = True
            if not mine:
                del pending[key]
            return changed

        with th.lock:
            self._update_pending(th, add)

    def delete_thread(self, thread_id: str) -> None:
        th = self._thread(str(thread_id), check=True)
        with th.lock:
            self._remove(th, self._all_records(th), reason="delete_thread", everything=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(_ids(run_ids, "run_ids"))
        if not runs:
            return
        p = self.session_prefix
        for name in [s for s in self.store.sessions() if s.startswith(p)]:
            th = self._thread(name[len(p) :], check=True)
            with th.lock:
                reader = Reader(self)
                doomed = {
                    e.id
                    for e in th.entries.values()
                    if self._details(e, reader)["md"].get("run_id") in runs
                }
                if doomed:
                    self._remove(th, doomed, reason="delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        src = self._thread(str(source_thread_id), check=True)
        dst = self._thread(str(target_thread_id), check=True)
        if src is dst:
            return
        first, second = sorted((src, dst), key=lambda t: t.session)
        with first.lock, second.lock:
            reader = Reader(self)
            for e in sorted(src.entries.values(), key=lambda x: x.id):
                self._copy_entry(dst, e, reader)

            def copy(pending: PendingMap) -> bool:
                for key, writes in src.pending.items():
                    if key in src.entries:
                        pending.setdefault(key, {}).update(writes)
                return True

            self._update_pending(dst, copy)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest`` raises ``NotImplementedError`` (and prunes nothing) when a thread
        uses a ``DeltaChannel``, as LangGraph's PostgresSaver does: its latest value is
        rebuilt from the writes of the checkpoints before, which keep_latest would hide."""
        ids = [str(t) for t in _ids(thread_ids, "thread_ids")]
        if strategy not in ("keep_latest", "delete"):
            raise UsageError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        if strategy == "keep_latest":
            delta = sorted(t for t in dict.fromkeys(ids) if self._uses_delta(t))
            if delta:
                raise NotImplementedError(
                    f"keep_latest can't prune threads that use a DeltaChannel: {', '.join(delta)}"
                )
        for thread_id in ids:
            th = self._thread(thread_id, check=True)
            with th.lock:
                everything = strategy == "delete"
                doomed = self._all_records(th)
                if not everything:
                    latest: dict[str, Entry] = {}
                    for e in th.entries.values():
                        if e.ns not in latest or e.cpid > latest[e.ns].cpid:
                            latest[e.ns] = e
                    doomed -= {e.id for e in latest.values()}
                    doomed -= set(self.store.pruned(th.session))
                if doomed:
                    self._remove(th, doomed, reason="prune", everything=everything)

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Close the store if this saver opened it."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> StashpointSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StashpointSaver({self.store.url!r}, workspace={self.workspace!r})"


def _ids(ids: Sequence[str], what: str) -> Sequence[str]:
    """``ids``, refusing one string: iterating it would name other threads (or runs)."""
    if isinstance(ids, str):
        raise TypeError(f"{what} must be a sequence of IDs, not a str")
    return ids
