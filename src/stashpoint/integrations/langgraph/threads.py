"""What the saver knows of a LangGraph thread: its checkpoints by namespace and id, which
records hold whose writes, its pending writes, and the engine objects of its branches, built
from the store on first use and rebuilt when another writer moved a head."""

from __future__ import annotations

import builtins
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...langgraph_format import RECORD_META as _META
from ...session import Session
from .framework import RunnableConfig, get_checkpoint_id
from .records import CpKey, Entry, Write, WriteKey, entry_of

if TYPE_CHECKING:
    from .saver import StashpointSaver


@dataclass
class StateCache:
    """Encoded state of one checkpoint, so that the next put encodes only what changed."""

    of: str
    """Record id whose state this is."""
    conv_views: builtins.list[Any] | None = None
    """Copies of the contents of the messages as stored (see
    :func:`~stashpoint.conversation.snapshot`)."""
    conv_items: builtins.list[str] | None = None
    """Messages as stored: base64 text of their packed bytes."""
    values: dict[str, tuple[Any, Any, bytes]] = field(default_factory=dict)
    """channel -> (version, object, packed)"""


@dataclass
class Thread:
    thread_id: str
    session: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    loaded: bool = False
    heads: dict[str, str] = field(default_factory=dict)
    entries: dict[CpKey, Entry] = field(default_factory=dict)
    """Checkpoints LangGraph sees."""
    records: dict[str, Entry] = field(default_factory=dict)
    """Every LangGraph checkpoint record of the session, seen or hidden, by record id."""
    known: set[CpKey] = field(default_factory=set)
    holders: dict[CpKey, builtins.list[Entry]] = field(default_factory=dict)
    """Seen checkpoints holding writes of a checkpoint (its children, mostly)."""
    removed: set[str] = field(default_factory=set)
    pending: dict[CpKey, dict[WriteKey, Write]] = field(default_factory=dict)
    pending_raw: str | None = None
    branches: dict[str, Session] = field(default_factory=dict)
    caches: dict[str, StateCache] = field(default_factory=dict)
    """branch -> encoded state of its head as this process last wrote it."""
    last_read: StateCache | None = None
    held: dict[CpKey, builtins.list[Write]] = field(default_factory=dict)
    """A checkpoint's writes that records hold, in LangGraph's order (records never change;
    an entry goes when a new holder of that checkpoint is indexed)."""
    restored: str | None = None
    """Record whose files ``restore_files`` just put back (for the replay that follows)."""


def _thread(self: StashpointSaver, thread_id: str, *, check: bool) -> Thread:
    """The thread's index, built from the store on first use; with ``check``, rebuilt when
    another writer moved a branch head, and pending writes re-read when they changed."""
    with self._lock:
        th = self._threads.get(thread_id)
        if th is None:
            th = self._threads[thread_id] = Thread(thread_id, self.session_name(thread_id))
            while len(self._threads) > self._max_threads:
                self._threads.popitem(last=False)
        else:
            self._threads.move_to_end(thread_id)
    with th.lock:
        if not th.loaded:
            self._load(th)
        elif check:
            if self.store.branches(th.session) != th.heads:
                self._load(th)
            else:
                self._merge_stored_pending(th)
    return th


def _load(self: StashpointSaver, th: Thread) -> None:
    """(Re)build a thread's index from its records, each verified with its chain link."""
    store = self.store
    heads = store.branches(th.session)
    records = store.records(th.session)
    pruned = set(store.pruned(th.session)) if records else set()
    th.entries, th.records, th.known, th.holders = {}, {}, set(), {}
    th.removed, th.pending, th.pending_raw = set(), {}, None
    th.caches, th.last_read, th.held = {}, None, {}
    th.branches = {b: s for b, s in th.branches.items() if b in heads}
    for cp in reversed(records):
        lg = cp.meta.get(_META)
        if not isinstance(lg, dict):
            continue
        if "removed" in lg:
            th.removed.add(cp.id)
        elif isinstance(lg.get("id"), str):
            self._index(th, entry_of(cp, lg), hidden=cp.id in pruned)
    th.heads = heads
    th.loaded = True
    self._merge_stored_pending(th)


def _index(self: StashpointSaver, th: Thread, e: Entry, *, hidden: bool = False) -> None:
    th.records[e.id] = e
    th.known.add((e.ns, e.cpid))
    if hidden:
        return
    old = th.entries.get((e.ns, e.cpid))
    th.entries[(e.ns, e.cpid)] = e
    if old is not None:
        for target in old.targets:
            th.held.pop(target, None)
            if old in th.holders.get(target, ()):
                th.holders[target].remove(old)
    for target in e.targets:
        th.held.pop(target, None)
        th.holders.setdefault(target, []).append(e)


def _find(self: StashpointSaver, config: RunnableConfig) -> tuple[Thread, Entry | None]:
    conf = config["configurable"]
    th = self._thread(str(conf["thread_id"]), check=True)
    ns = str(conf.get("checkpoint_ns") or "")
    with th.lock:
        cpid = get_checkpoint_id(config)
        if cpid:
            return th, th.entries.get((ns, cpid))
        best = None
        for e in th.entries.values():
            if e.ns == ns and (best is None or e.cpid > best.cpid):
                best = e
        return th, best


class ThreadIndex:
    """The methods above, as :class:`StashpointSaver` has them."""

    _thread = _thread
    _load = _load
    _index = _index
    _find = _find


def describe(config: RunnableConfig) -> str:
    conf = config.get("configurable") or {}
    parts = [f"thread {conf.get('thread_id')!r}"]
    if conf.get("checkpoint_ns"):
        parts.append(f"namespace {conf['checkpoint_ns']!r}")
    if conf.get("checkpoint_id"):
        parts.append(f"checkpoint {conf['checkpoint_id']}")
    return ", ".join(parts)
