"""LangGraph: a checkpoint saver on any stashpoint store.

    from stashpoint.integrations.langgraph import StashpointSaver

    saver = StashpointSaver(".stashpoint", workspace="repo/", restore_on_time_travel=True)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "ticket-42"}}
    graph.invoke(inputs, config, durability="sync")
    saver.restore_files(past.config)           # time travel: repo/ as it was there
    graph.invoke(None, past.config, durability="sync")

How LangGraph's model maps onto stashpoint's:

- **Thread -> session.** LangGraph thread ``T`` is the stashpoint session ``lg:T``. Every
  ``put`` is one stashpoint checkpoint (kind ``auto``) sealed into that session's hash chain,
  with the files of the workspace directory when the saver has one (root namespace only).
  The record's ``meta["langgraph"]`` names the LangGraph checkpoint (id, parent, namespace);
  versions, ``versions_seen``, metadata and the parent's writes are the state value
  ``langgraph`` (``stashpoint show`` prints them).
- **Parents -> branches.** A namespace's history is branch ``main`` (subgraph namespace ``N``:
  ``ns:N``). A put whose parent is the head of its branch extends it; a put from an older
  checkpoint (time travel, ``update_state`` on the past) starts branch
  ``<base>@<checkpoint id>`` at the parent's record. ``stashpoint --session lg:T log --graph``
  draws LangGraph's own tree; ``stashpoint diff`` compares any two LangGraph checkpoints.
- **Messages -> conversation.** The ``messages`` channel (``conversation_channel``) is the
  stashpoint conversation: an append-only log shared by a line of history, one entry per
  message, so a step that adds k messages stores O(k) bytes, not the whole list again
  (LangGraph's SQLite saver re-stores it at every step). Other channels are state values,
  content-addressed: a channel that did not change costs nothing. Every value goes through
  the saver's ``serde`` (LangGraph's serializer, encryption included); the bytes are stored
  zstd-compressed with a fixed dictionary of LangChain's message envelope.
- **Pending writes.** ``put_writes`` is durable at once, in one store-level key per thread
  (``langgraph:pending:<session>``, with a MAC from the store's hasher: keyed when the store
  is), with LangGraph's rules (special channels replace, others keep the first write). When
  the next checkpoint of that line is put, the writes move into it; a write that is the very
  messages the new checkpoint appended is kept as a reference to them, so a step's messages
  are stored once, not twice.
- **Deleting.** stashpoint records are never removed (their digests chain). ``delete_thread``,
  ``delete_for_runs`` and ``prune`` hide checkpoints from LangGraph and mark their records
  pruned, so ``stashpoint gc`` frees what only they used; a branch whose head goes first gets
  an empty ``langgraph: removed`` checkpoint as its head (heads are never pruned).
  ``stashpoint verify`` keeps passing. ``copy_thread`` copies checkpoints and writes, not
  workspace snapshots. Retention (``stashpoint prune``) hides what it prunes the same way.
  ``prune(strategy="keep_latest")`` refuses a thread with a ``DeltaChannel`` (as LangGraph's
  PostgresSaver does): its value is rebuilt from the checkpoints it would hide.
- **Files.** With ``workspace=``, each root-namespace checkpoint snapshots that directory as
  its superstep left it, in every durability mode: LangGraph's default (``"async"``) saves a
  checkpoint while the next step already runs, so the directory is scanned at the superstep's
  end, on the graph's thread (:meth:`StashpointSaver.get_next_version` says why there), and
  the put stores that scan. A replay's first checkpoint (``source: fork``) is a copy of its
  parent, files included.
  :meth:`StashpointSaver.restore_files` puts back the files of any checkpoint, after a safety
  checkpoint of what is there now (branch ``langgraph-files``): call it before a replay,
  ``graph.invoke(None, past_config)``, since LangGraph starts the replay's first node while it
  saves. With ``restore_on_time_travel=True``, the saves that start a new line from a past
  checkpoint before any node runs (a new input there with ``durability="sync"``,
  ``update_state`` there) first rewind the files to that checkpoint's, on the new branch
  (undoable like any rewind). Reading never touches files.

Reads verify every record and chain link they use and every message against its running
hash, once per saver: the saver keeps the decoded messages of the last conversation logs it
read (logs are append-only), so after a first read ``list`` and ``get_tuple`` decode only
messages added since. Tuples share those message objects (and, within one ``list`` call, the
decoded values common to several checkpoints): treat them as read-only. A ``put`` finds the
messages already stored by content: each message's fields are compared with a copy taken when
it was stored or first read by ``get_tuple`` (one ``list ==`` in C, ~2,200 CPU
instructions a LangChain message: at 2,000 messages, ~3x the rest of a put), so a
node that changes a message in place and returns it (``msg.content = "edited"; return
{"messages": [msg]}``) has the change stored, as LangGraph's own savers do; only the changed
message and those after it are serialized again. (A message changed in place also changes
what earlier tuples of this saver show in this process: they share the object; a new saver
reads what was stored.) ``list`` takes no copies: no put compares with most checkpoints it
returns (a run starts with ``get_tuple``); a message it handed out is copied from its stored
bytes, not from the object, which someone may have changed since. Other channels are
serialized again whenever their version moves, as in LangGraph's own savers.

One process should write a thread at a time (LangGraph's own model): records are protected
by the store's compare-and-set, the pending-writes key by a re-read before each update.

Needs ``pip install 'stashpoint[langgraph]'``.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import contextvars
import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import msgspec

from ..errors import MissingExtraError
from ..langgraph_format import RECORD_META as _META
from ..langgraph_format import (
    _decompressor,
    _pack,
    _text,
    _unpack,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:
    raise MissingExtraError(
        "stashpoint.integrations.langgraph needs LangGraph: pip install 'stashpoint[langgraph]'"
    ) from exc

from .. import serde
from .._store import Store
from ..aio import SerialQueue
from ..conversation import fields_of, snapshot
from ..errors import IntegrityError, SerializationError, UsageError
from ..integrity import EMPTY_CHAIN
from ..metakeys import LANGGRAPH_PENDING
from ..model import Checkpoint, LogRef
from ..opening import open_store
from ..redact import Redactor, make_redactor
from ..session import (
    RewindResult,
    Session,
    StashpointWarning,
    same_prefix,
)
from ..stores.base import BlobRow
from ..workspace import ScanResult, Workspace, check_root
from ..workspace.statcache import StatCache

__all__ = ["FILES_BRANCH", "StashpointSaver"]

FILES_BRANCH = "langgraph-files"
"""Branch where :meth:`StashpointSaver.restore_files` records its safety and rewind
checkpoints (outside LangGraph's lines of history)."""
_DETAILS = "langgraph"  # state key of a put's LangGraph fields
_CONV_KEY = "messages"  # the stashpoint session's conversation key
_DURABILITY = "__pregel_durability"  # where LangGraph's configurable says how it saves
_VALUE = "ch:"  # state key prefix of a channel value
_KNOWN = frozenset(
    ("v", "id", "ts", "channel_values", "channel_versions", "versions_seen", "updated_channels")
)
_INLINE_MAX = 64  # channel values up to this many packed bytes live in the details value
_KEEP_BRANCHES = 8  # engine objects and encoded states kept per thread
_KEEP_LOGS = 64  # conversation logs whose decoded messages the saver keeps
_KEEP_TINY = 4096  # tiny immutable values kept decoded
_IMMUTABLE = frozenset((type(None), bool, int, float, str, bytes))
# Metadata keys of a DeltaChannel thread (those LangGraph's PostgresSaver checks in prune)
_DELTA_MD = frozenset(("counters_since_delta_snapshot", "delta_writes_versioned"))

_json = msgspec.json.Decoder()
_json_out = msgspec.json.Encoder()


def _msgpack_array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _untext(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise IntegrityError(f"malformed {what} in the store")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise IntegrityError(f"malformed {what} in the store") from exc


# -- what the saver knows of a thread ---------------------------------------------------------


class _When(NamedTuple):
    """How LangGraph saves a checkpoint: its metadata ``source`` and the run's durability."""

    source: str
    durability: str | None

    @property
    def racing(self) -> bool:
        """Saved while the next step may already run (LangGraph's default durability)."""
        return self.source in ("input", "loop") and self.durability not in ("sync", "exit")


class _Ahead(NamedTuple):
    """A workspace scan taken at a superstep's end, for the checkpoint of that superstep."""

    result: ScanResult
    rows: builtins.list[BlobRow]
    """Blob rows the scan found missing from the store: committed with the checkpoint."""
    scanned: StatCache | None
    pending: StatCache | None
    """The stat cache the scan built: the baseline of later scans once committed."""


class _Files(Workspace):
    """The saver's workspace, one object shared by its root-namespace sessions, whose scan
    can be taken ahead (:meth:`StashpointSaver.get_next_version`) and handed to the put.

    ``Session.checkpoint`` scans its workspace itself; set :attr:`ahead` and that scan is the
    one taken ahead. Only while holding the saver's files lock: a scan keeps its stat cache in
    the workspace until the checkpoint commits (:meth:`Workspace.save_cache`)."""

    ahead: _Ahead | None = None

    def scan(self, *, progress: Any = None) -> tuple[ScanResult, builtins.list[BlobRow]]:
        got, self.ahead = self.ahead, None
        if got is None:
            return super().scan(progress=progress)
        self._scanned, self._pending_cache = got.scanned, got.pending
        return got.result, got.rows

    def scan_ahead(self) -> _Ahead:
        result, rows = super().scan()
        got = _Ahead(result, rows, self._scanned, self._pending_cache)
        self._scanned = self._pending_cache = None
        return got


@dataclass
class _Loop:
    """A graph run, as its first call (``get_tuple``, in the run's own context) shows it."""

    saver: int
    root: bool
    """The root namespace: a subgraph's supersteps need no scan (its checkpoints have no files)."""
    sync: bool
    """``durability="sync"``: each put is done before the next step starts, and scans then."""
    exit: bool
    """``durability="exit"``: only the last superstep's scan is ever put."""
    last: int | None = None
    """The version of its last scan taken ahead."""


_LOOP: contextvars.ContextVar[_Loop] = contextvars.ContextVar("stashpoint_lg_loop")
_KEEP_AHEAD = 32  # scans taken ahead and not yet put (subgraph steps, interrupts, forks)


class _Ref(NamedTuple):
    """A write whose value is messages the holder record appended to its conversation."""

    start: int
    length: int
    single: bool
    """The write's value was one message, not a list."""


_Value = bytes | builtins.list[bytes] | _Ref
"""A packed value, a list of packed items (the value was a ``list``), or a reference."""


class _Write(NamedTuple):
    task: str
    idx: int
    channel: str
    path: str
    value: _Value
    holder: str | None = None
    """The record holding the write (None: the pending-writes key)."""


_WriteKey = tuple[str, int]  # (task id, idx)
_CpKey = tuple[str, str]  # (namespace, LangGraph checkpoint id)


@dataclass
class _Entry:
    """One LangGraph checkpoint: its stashpoint record and, once read, its LangGraph fields."""

    record: Checkpoint
    ns: str
    cpid: str
    parent: str | None
    targets: builtins.list[_CpKey] = field(default_factory=builtins.list)
    """Checkpoints whose writes this record holds: its parent, and any whose writes came
    after their child was saved (LangGraph saves writes and checkpoints concurrently)."""
    details: dict[str, Any] | None = None
    writes: builtins.list[tuple[_CpKey, _Write]] | None = None
    """The writes this record holds, with the checkpoint each is for, once read."""

    @property
    def id(self) -> str:
        return self.record.id


@dataclass
class _StateCache:
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
class _Thread:
    thread_id: str
    session: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    loaded: bool = False
    heads: dict[str, str] = field(default_factory=dict)
    entries: dict[_CpKey, _Entry] = field(default_factory=dict)
    """Checkpoints LangGraph sees."""
    records: dict[str, _Entry] = field(default_factory=dict)
    """Every LangGraph checkpoint record of the session, seen or hidden, by record id."""
    known: set[_CpKey] = field(default_factory=set)
    holders: dict[_CpKey, builtins.list[_Entry]] = field(default_factory=dict)
    """Seen checkpoints holding writes of a checkpoint (its children, mostly)."""
    removed: set[str] = field(default_factory=set)
    pending: dict[_CpKey, dict[_WriteKey, _Write]] = field(default_factory=dict)
    pending_raw: str | None = None
    branches: dict[str, Session] = field(default_factory=dict)
    caches: dict[str, _StateCache] = field(default_factory=dict)
    """branch -> encoded state of its head as this process last wrote it."""
    last_read: _StateCache | None = None
    held: dict[_CpKey, builtins.list[_Write]] = field(default_factory=dict)
    """A checkpoint's writes that records hold, in LangGraph's order (records never change;
    an entry goes when a new holder of that checkpoint is indexed)."""
    restored: str | None = None
    """Record whose files ``restore_files`` just put back (for the replay that follows)."""


# -- reading records: verified, each stored thing decoded once per reader ---------------------


class _View:
    """Messages [0, n) of a log as one list, its fork parent's prefix included: verified rows,
    stored items and decoded objects, each grown on demand. Logs are append-only and messages
    immutable, so the saver keeps views across reads (:class:`_Views`)."""

    __slots__ = ("base", "items", "lock", "objs", "own", "rows", "shown", "views")

    def __init__(self, base: str | None, own: int) -> None:
        self.base, self.own = base, own
        self.lock = threading.RLock()
        self.rows: builtins.list[tuple[bytes, bytes]] = []
        self.items: builtins.list[str] = []
        self.objs: builtins.list[Any] = []
        self.views: builtins.list[Any] = []
        """Copies of the messages' contents as stored (see
        :func:`~stashpoint.conversation.snapshot`), taken only when a put may compare with
        them (``get_tuple``): ``list`` copies nothing."""
        self.shown = 0
        """``objs[:shown]`` were handed out before their copies were taken: someone may have
        changed them, so their copies come from the stored bytes."""


class _Views:
    """The saver's views of the logs it read last (LRU by log): a cold ``get_tuple`` decodes
    a conversation once, and every later read of that line, ``list`` included, reuses it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.lock = threading.Lock()
        self.logs: OrderedDict[str, _View] = OrderedDict()

    def get(self, log: str) -> _View | None:
        with self.lock:
            v = self.logs.get(log)
            if v is not None:
                self.logs.move_to_end(log)
            return v

    def add(self, log: str, v: _View) -> _View:
        with self.lock:
            got = self.logs.setdefault(log, v)  # another reader's, if it got there first
            self.logs.move_to_end(log)
            while len(self.logs) > self.keep:
                self.logs.popitem(last=False)
            return got


class _Reader:
    def __init__(self, saver: StashpointSaver) -> None:
        self.saver = saver
        self.store = saver.store
        self.views: dict[str, _View] = {}
        self.values: dict[str, Any] = {}
        self.packed: dict[str, bytes] = {}

    def _view(self, log: str, length: int) -> _View:
        v = self.views.get(log) or self.saver._views.get(log)
        if v is not None:
            self.views[log] = v
            if len(v.rows) >= length:
                return v
        if v is None:
            info = self.store.log_info(log)
            if info is None:
                raise IntegrityError(f"conversation log {log} is missing")
            own = info.parent_len if info.parent is not None else 0
            v = _View(info.parent if own else None, own)
            if v.base is not None:
                v.rows = self._view(v.base, own).rows[:own]
            v = self.views[log] = self.saver._views.add(log, v)
        with v.lock:
            return self._extend(log, v, length)

    def _extend(self, log: str, v: _View, length: int) -> _View:
        start = len(v.rows)
        if length > start:
            rows = self.store.read_messages(log, start, length)
            if len(rows) != length - start or any(r.idx != start + i for i, r in enumerate(rows)):
                raise IntegrityError(f"conversation log {log} has missing messages")
            # integrity.message_chain on bytes, not hex: H(prev || message)
            chain = v.rows[-1][0] if v.rows else bytes.fromhex(EMPTY_CHAIN)
            sha256 = hashlib.sha256
            for r in rows:
                chain = sha256(chain + r.data).digest()
                if chain != r.chain:
                    raise IntegrityError(f"conversation log {log} is corrupt")
                v.rows.append((r.chain, r.data))
        return v

    def _checked(self, conv: LogRef) -> _View:
        v = self._view(conv.log, conv.length)
        tip = v.rows[conv.length - 1][0].hex() if conv.length else EMPTY_CHAIN
        if len(v.rows) < conv.length or tip != conv.hash:
            raise IntegrityError(
                f"conversation of length {conv.length} in log {conv.log} does not match its hash"
            )
        return v

    def _items(self, log: str, v: _View, n: int) -> builtins.list[str]:
        if len(v.items) < n:
            with v.lock:
                self._more_items(log, v, n)
        return v.items

    def _more_items(self, log: str, v: _View, n: int) -> None:
        if len(v.items) < n:
            if v.base is not None and len(v.items) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.items.extend(self._items(v.base, base, upto)[len(v.items) : upto])
            datas = [data for _chain, data in v.rows[len(v.items) : n]]
            try:  # the stored JSON strings as one JSON array: one call into the C decoder
                got = _json.decode(b"[" + b",".join(datas) + b"]") if datas else []
            except msgspec.DecodeError:
                got = [serde.decode(data) for data in datas]  # names what is wrong
            if len(got) != len(datas) or not all(type(item) is str for item in got):
                raise IntegrityError(f"conversation log {log} holds a malformed message")
            v.items.extend(got)

    def _objs(self, log: str, v: _View, n: int) -> builtins.list[Any]:
        if len(v.objs) < n:
            with v.lock:
                self._more_objs(log, v, n)
        return v.objs

    def _more_objs(self, log: str, v: _View, n: int) -> None:
        if len(v.objs) < n:
            if v.base is not None and len(v.objs) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.objs.extend(self._objs(v.base, base, upto)[len(v.objs) : upto])
            items = self._items(log, v, n)
            v.objs.extend(
                self.saver._loads_many([_untext(i, "message") for i in items[len(v.objs) : n]])
            )

    def _copies(self, log: str, v: _View, n: int) -> builtins.list[Any]:
        if len(v.views) < n:
            with v.lock:
                self._more_copies(log, v, n)
        return v.views

    def _more_copies(self, log: str, v: _View, n: int) -> None:
        objs = self._objs(log, v, n)
        if len(v.views) < n:
            if v.base is not None and len(v.views) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.views.extend(self._copies(v.base, base, upto)[len(v.views) : upto])
            if len(v.views) < min(v.shown, n):  # decoded again: objects nobody else holds
                items = self._items(log, v, n)[len(v.views) : min(v.shown, n)]
                v.views.extend(
                    fields_of(self.saver._loads_many([_untext(i, "message") for i in items]))
                )
            v.views.extend(map(snapshot, fields_of(objs[len(v.views) : n])))

    def _show(self, log: str, v: _View, n: int) -> None:
        """Note that messages ``[0, n)`` are handed out (a fork's prefix: its parent log's)."""
        if v.shown < n:
            with v.lock:
                v.shown = max(v.shown, n)
            if v.base is not None:
                upto = min(v.own, n)
                self._show(v.base, self._view(v.base, upto), upto)

    def conv_items(self, conv: LogRef) -> builtins.list[str]:
        return self._items(conv.log, self._checked(conv), conv.length)[: conv.length]

    def conv_views(self, conv: LogRef) -> builtins.list[Any]:
        """Copies of the contents of a conversation's messages, as stored."""
        return self._copies(conv.log, self._checked(conv), conv.length)[: conv.length]

    def conv_objects(
        self, conv: LogRef, start: int = 0, stop: int | None = None
    ) -> builtins.list[Any]:
        """Messages ``[start, stop)`` of a conversation (default: all), a new list."""
        end = conv.length if stop is None else min(stop, conv.length)
        v = self._checked(conv)
        objs = self._objs(conv.log, v, conv.length)
        self._show(conv.log, v, end)
        return objs[start:end]

    def packed_value(self, hexd: str) -> bytes:
        got = self.packed.get(hexd)
        if got is None:
            raw = serde.decode(self.saver.store.blobs.read(bytes.fromhex(hexd)))
            got = self.packed[hexd] = _untext(raw, "channel value")
        return got

    def value(self, hexd: str) -> Any:
        if hexd not in self.values:
            self.values[hexd] = self.saver._loads(self.packed_value(hexd))
        return self.values[hexd]


# -- the saver ---------------------------------------------------------------------------------


class StashpointSaver(BaseCheckpointSaver[int]):
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
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._views = _Views(_KEEP_LOGS)
        self._tiny: dict[bytes, Any] = {}
        self._lock = threading.RLock()
        self._max_threads = 256
        self._warned = False
        self._version = 0  # the last version get_next_version handed out
        self._files_lock = threading.RLock()
        self._files_ws: _Files | None = None
        self._ahead: OrderedDict[int, _Ahead] = OrderedDict()
        self._calls = [SerialQueue() for _ in range(8)]  # async calls, by thread id: _queue

    # -- stashpoint views ----------------------------------------------------------------
    def session_name(self, thread_id: str) -> str:
        """The stashpoint session of a LangGraph thread (``stashpoint --session NAME log``)."""
        return self.session_prefix + str(thread_id)

    def record(self, config: RunnableConfig) -> Checkpoint:
        """The stashpoint checkpoint behind a LangGraph checkpoint (``stashpoint show ID``)."""
        _th, entry = self._find(config)
        if entry is None:
            raise UsageError(f"no LangGraph checkpoint for {_describe(config)}")
        return entry.record

    def restore_files(self, config: RunnableConfig) -> RewindResult:
        """Put the workspace files back as they were at a checkpoint (the thread's latest if
        the config names none), into the saver's workspace only when the thread's
        checkpoints were taken there (or the saver was made with ``bind=True``). A safety
        checkpoint of the files there now comes first, on branch ``langgraph-files``: the
        result's ``undo`` is the shell command that undoes it, from any directory."""
        if self.workspace is None:
            raise UsageError("this saver has no workspace directory to restore files into")
        th, entry = self._find(config)
        if entry is None:
            raise UsageError(f"no LangGraph checkpoint for {_describe(config)}")
        if entry.record.workspace is None:
            raise UsageError(f"checkpoint {entry.cpid} has no workspace snapshot")
        with th.lock, self._files_lock:
            files = Session(
                self.store,
                th.session,
                workspace=self.workspace,
                branch=FILES_BRANCH,
                force=self.force,
                redact=False,
                bind=self.bind,
            )
            result = files.rewind(entry.id, state=False)
            th.heads = self.store.branches(th.session)
            th.restored = entry.id  # a replay from there need not (and must not) restore again
            return result

    # -- LangGraph's interface: reading --------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._note_loop(config)
        th, entry = self._find(config)
        if entry is None:
            return None
        with th.lock:
            tup, cache = self._tuple(th, entry, _Reader(self), seed=True)
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
        picked: builtins.list[tuple[_Thread, _Entry]] = []
        readers: dict[str, _Reader] = {}
        for thread_id in thread_ids:
            th = self._thread(thread_id, check=True)
            reader = readers[th.session] = _Reader(self)
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
        by_thread: dict[str, tuple[_Thread, builtins.list[_Entry]]] = {}
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
        when = _When(str(md.get("source") or ""), conf.get(_DURABILITY))
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

    def get_next_version(self, current: int | None, channel: None = None) -> int:
        """The next channel version; and, with a workspace, the moment a superstep's files
        are taken.

        **Why here.** A checkpoint's files must be the workspace as its superstep left it.
        LangGraph creates the checkpoint at the superstep boundary but hands it to ``put`` in
        a background thread; in its default durability, ``"async"``, the next superstep's
        nodes already run meanwhile, so a scan in ``put`` may see (and in practice does) the
        files the next tool writes. LangGraph calls this method once per superstep boundary
        (``apply_writes``, after every task of the step finished, before the next step's tasks
        are prepared), synchronously, on the thread that runs the graph, in every durability
        mode, and the version it returns goes into that superstep's checkpoint: its highest
        channel version. So the workspace is scanned here and the scan kept under that
        version; the put of the checkpoint whose highest version it is commits it (blobs
        included: a scan taken ahead writes nothing). The other hooks do not fit: ``put`` and
        ``put_writes`` run in background threads, and wrapping the loop's executor would mean
        patching LangGraph's internals.

        **Versions.** One more than both ``current`` and every version this saver handed out
        before: still increasing for every channel, as LangGraph requires, and never the same
        for two boundaries, so the scans of graphs running at once on one saver (two threads,
        a subgraph inside its parent's step) cannot be taken for each other's.

        **Cost.** One workspace scan per superstep, as ``put`` scanned before (``put`` now
        scans only when no scan was taken for its checkpoint: a fork's, a copy's), but on the
        graph's thread: with ``ainvoke``, on the event loop (an incremental scan: a ``stat``
        of each file, a read of the changed ones). A run with ``durability="sync"`` is not
        scanned ahead (LangGraph waits for each put before the next step's nodes run, so the
        put scans, in a worker thread with ``aput``), nor are a subgraph's steps (its
        checkpoints record no files). With ``durability="exit"`` every superstep is still
        scanned, so that the checkpoint saved at exit holds the files of its superstep, not
        those a node interrupted in the next one had already written. While a put commits, a
        scan waits for it (one lock for the workspace's stat cache). Which run calls is told
        by :meth:`get_tuple`, which LangGraph calls first in the run's own context.
        """
        with self._files_lock:
            v = max(current if isinstance(current, int) else 0, self._version) + 1
            self._version = v
        if self.workspace is not None:
            loop = _LOOP.get(None)
            if loop is None or loop.saver != id(self):
                self._scan_ahead(v, None)
            elif loop.root and not loop.sync:
                self._scan_ahead(v, loop)
        return v

    def _note_loop(self, config: RunnableConfig) -> None:
        """A graph run starts with ``get_tuple`` in its own context: note its namespace."""
        conf = config.get("configurable") or {}
        ns = conf.get("checkpoint_ns") or ""
        how = conf.get(_DURABILITY)
        _LOOP.set(_Loop(id(self), ns == "", how == "sync", how == "exit"))

    def _files(self) -> _Files:
        if self._files_ws is None:
            assert self.workspace is not None
            store = self.store
            self._files_ws = _Files(
                check_root(Path(self.workspace), force=self.force),
                store.blobs,
                store_id=store.id,
                epoch=store.gc_epoch,
                cache_dir=store.cache_dir,
                exclude=store.own_paths,
            )
        return self._files_ws

    def _scan_ahead(self, version: int, loop: _Loop | None) -> None:
        with self._files_lock:
            try:
                got = self._files().scan_ahead()
            except Exception:  # the put scans itself, and reports what is wrong
                return
            self._ahead[version] = got
            if loop is not None:
                if loop.exit and loop.last is not None:  # superseded: never put
                    self._ahead.pop(loop.last, None)
                loop.last = version
            while len(self._ahead) > _KEEP_AHEAD:
                self._ahead.popitem(last=False)

    def _ahead_for(self, versions: Mapping[str, Any]) -> _Ahead | None:
        """The scan taken at the end of the superstep whose checkpoint has ``versions``."""
        top = max((v for v in versions.values() if type(v) is int), default=None)
        return self._ahead.pop(top, None) if top is not None else None

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
        with th.lock:
            self._merge_stored_pending(th)
            have = self._writes_of(th, key, _Reader(self)) if key in th.holders else {}
            mine = th.pending.setdefault(key, {})
            changed = False
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                if idx >= 0 and ((task_id, idx) in have or (task_id, idx) in mine):
                    continue  # regular channels keep the first write, as in LangGraph's savers
                mine[(task_id, idx)] = _Write(
                    task_id, idx, channel, task_path, self._encode_write(value)
                )
                changed = True
            if not mine:
                del th.pending[key]
            if changed:
                self._save_pending(th)

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
                reader = _Reader(self)
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
            reader = _Reader(self)
            for e in sorted(src.entries.values(), key=lambda x: x.id):
                self._copy_entry(dst, e, reader)
            for key, writes in src.pending.items():
                if key in src.entries:
                    dst.pending.setdefault(key, {}).update(writes)
            self._save_pending(dst)

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
                    latest: dict[str, _Entry] = {}
                    for e in th.entries.values():
                        if e.ns not in latest or e.cpid > latest[e.ns].cpid:
                            latest[e.ns] = e
                    doomed -= {e.id for e in latest.values()}
                    doomed -= set(self.store.pruned(th.session))
                if doomed:
                    self._remove(th, doomed, reason="prune", everything=everything)

    # -- async: the same operations in a worker thread -----------------------------------
    def _queue(self, thread: Any) -> SerialQueue:
        """Where a thread's async calls run, one at a time in the order made (other threads'
        mostly beside them): calls without a thread share one queue."""
        if isinstance(thread, dict):
            thread = (thread.get("configurable") or {}).get("thread_id")
        return self._calls[hash(str(thread)) % len(self._calls)]

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._note_loop(config)  # here: the worker thread runs in a copy of this context
        return await self._queue(config).call(self.get_tuple, config)

    async def alist(
        self,
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
        self,
        config: RunnableConfig,
        checkpoint: LGCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._queue(config).call(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._queue(config).call(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._queue(thread_id).call(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._queue(None).call(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._queue(None).call(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._queue(None).call(self.prune, thread_ids, strategy=strategy)

    async def arestore_files(self, config: RunnableConfig) -> RewindResult:
        return await self._queue(config).call(self.restore_files, config)

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

    # -- internals: the thread index -----------------------------------------------------
    def _thread(self, thread_id: str, *, check: bool) -> _Thread:
        """The thread's index, built from the store on first use; with ``check``, rebuilt when
        another writer moved a branch head, and pending writes re-read when they changed."""
        with self._lock:
            th = self._threads.get(thread_id)
            if th is None:
                th = self._threads[thread_id] = _Thread(thread_id, self.session_name(thread_id))
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

    def _load(self, th: _Thread) -> None:
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
                self._index(th, _entry(cp, lg), hidden=cp.id in pruned)
        th.heads = heads
        th.loaded = True
        self._merge_stored_pending(th)

    def _index(self, th: _Thread, e: _Entry, *, hidden: bool = False) -> None:
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

    def _find(self, config: RunnableConfig) -> tuple[_Thread, _Entry | None]:
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

    def _prefetch_details(self, entries: Iterable[_Entry]) -> None:
        """Read the LangGraph fields of many checkpoints in one store query, not one each."""
        todo = {e.id: e for e in entries if e.details is None}
        wanted = {}
        for e in todo.values():
            hexd = e.record.state.values.get(_DETAILS)
            if hexd is None:
                raise IntegrityError(f"checkpoint {e.id} lost its LangGraph fields")
            wanted[e.id] = bytes.fromhex(hexd)
        if len(wanted) > 1:
            got = self.store.blobs.read_many(builtins.list(dict.fromkeys(wanted.values())))
            for ident, digest in wanted.items():
                self._details(todo[ident], None, got[digest])

    def _details(
        self, e: _Entry, reader: _Reader | None, raw: bytes | None = None
    ) -> dict[str, Any]:
        """A checkpoint's LangGraph fields (versions, metadata, the parent's writes)."""
        if e.details is None:
            hexd = e.record.state.values.get(_DETAILS)
            if hexd is None:
                raise IntegrityError(f"checkpoint {e.id} lost its LangGraph fields")
            if raw is None:
                raw = self.store.blobs.read(bytes.fromhex(hexd))
            try:  # a JSON text (see _details_text) stored as a string value
                text = _json.decode(raw)
                tree = _json.decode(text) if isinstance(text, str) else None
            except msgspec.DecodeError as exc:
                raise IntegrityError(f"checkpoint {e.id} has malformed LangGraph fields") from exc
            if not isinstance(tree, dict):
                raise IntegrityError(f"checkpoint {e.id} has malformed LangGraph fields")
            details: dict[str, Any] = {}
            for key, value in tree.items():
                if key.endswith("!"):  # stashpoint's encoding could not carry it: LangGraph's did
                    details[key[:-1]] = self._loads(_untext(value, "LangGraph field"))
                elif key in ("md", "x"):
                    details[key] = serde.from_tree(value)
                else:
                    details[key] = value
            e.details = details
        return e.details

    def _details_text(self, details: dict[str, Any]) -> str:
        """A checkpoint's LangGraph fields as one JSON text: encoded in C, not walked in
        Python (the state value ``langgraph``). Metadata and extra fields go through
        stashpoint's encoding (tuples, sets, dates...) or, failing that, LangGraph's."""
        tree: dict[str, Any] = {}
        for key, value in details.items():
            if key in ("md", "x"):
                if self.redactor is not None:
                    value = self.redactor(value)
                try:
                    tree[key] = serde.to_tree(value)
                except SerializationError:
                    tree[key + "!"] = _text(self._dumps(value))
            else:
                tree[key] = value
        try:
            return _json_out.encode(tree).decode()
        except (TypeError, ValueError, msgspec.EncodeError):  # versions of an unusual type
            for key in ("cv", "vs", "uc", "ts", "v"):
                if key in tree:
                    tree[key + "!"] = _text(_pack(self.serde.dumps_typed(tree.pop(key))))
            return _json_out.encode(tree).decode()

    def _held(self, e: _Entry, reader: _Reader) -> builtins.list[tuple[_CpKey, _Write]]:
        """The writes a checkpoint's record holds, each with the checkpoint it is for."""
        if e.writes is None:
            rows = self._details(e, reader).get("w") or ()
            parent = (e.ns, e.parent or "")
            e.writes = builtins.list(_embedded(e.id, parent, rows))
        return e.writes

    # -- internals: pending writes -------------------------------------------------------
    def _writes_of(self, th: _Thread, key: _CpKey, reader: _Reader) -> dict[_WriteKey, _Write]:
        """A checkpoint's writes: those moved into later records (its children's, mostly),
        then the pending ones (where a special channel's latest write wins)."""
        out: dict[_WriteKey, _Write] = {}
        for holder in th.holders.get(key, ()):
            for target, w in self._held(holder, reader):
                if target == key:
                    out.setdefault((w.task, w.idx), w)
        for wk, w in th.pending.get(key, {}).items():
            if wk not in out or wk[1] < 0:
                out[wk] = w
        return out

    def _merge_stored_pending(self, th: _Thread) -> None:
        """Take in writes another process stored since we last looked (ours stay)."""
        raw = self.store.session_value(th.session, LANGGRAPH_PENDING)
        if raw == th.pending_raw:
            return
        th.pending_raw = raw
        if raw is None:
            return
        reader = _Reader(self)
        for key, w in self._parse_pending(th, raw):
            if key in th.holders and (w.task, w.idx) in self._writes_of(th, key, reader):
                continue  # already moved into a record
            th.pending.setdefault(key, {}).setdefault((w.task, w.idx), w)

    def _parse_pending(self, th: _Thread, raw: str) -> builtins.list[tuple[_CpKey, _Write]]:
        try:
            doc = json.loads(raw)
            body, mac = str(doc["w"]), str(doc["mac"])
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"pending LangGraph writes of {th.session} are corrupt") from exc
        if mac != self.store.hasher.digest(body.encode()):
            raise IntegrityError(
                f"pending LangGraph writes of {th.session} do not match their digest"
            )
        out = []
        try:
            for ns, cpid, task, idx, channel, path, value in json.loads(body):
                w = _Write(str(task), int(idx), str(channel), str(path), _from_json(value))
                out.append(((str(ns), str(cpid)), w))
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"pending LangGraph writes of {th.session} are corrupt") from exc
        return out

    def _save_pending(self, th: _Thread) -> None:
        rows = [
            [ns, cpid, w.task, w.idx, w.channel, w.path, _to_json(w.value)]
            for (ns, cpid), writes in th.pending.items()
            for w in writes.values()
        ]
        if not rows:
            if th.pending_raw is not None:
                self.store.set_session_value(th.session, LANGGRAPH_PENDING, None)
                th.pending_raw = None
            return
        body = json.dumps(rows, separators=(",", ":"))
        raw = json.dumps({"w": body, "mac": self.store.hasher.digest(body.encode())})
        self.store.set_session_value(th.session, LANGGRAPH_PENDING, raw)
        th.pending_raw = raw

    def _dumps(self, value: Any) -> bytes:
        """A value packed by LangGraph's serializer, scrubbed of secrets first: the session
        that stores it sees only those bytes, where no secret pattern can match."""
        if self.redactor is not None:
            value = self.redactor(value)
        return _pack(self.serde.dumps_typed(value))

    def _encode_write(self, value: Any) -> bytes | builtins.list[bytes]:
        if type(value) is builtins.list:
            return [self._dumps(v) for v in value]
        return self._dumps(value)

    def _materialize(self, th: _Thread, w: _Write, reader: _Reader) -> bytes | builtins.list[bytes]:
        """A write's value as packed bytes, a reference resolved."""
        if not isinstance(w.value, _Ref):
            return w.value
        holder = th.records.get(w.holder or "")
        conv = holder.record.state.conversation if holder is not None else None
        if conv is None:
            raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
        got = reader.conv_items(conv)[w.value.start : w.value.start + w.value.length]
        if len(got) != w.value.length:
            raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
        items = [_untext(t, "message") for t in got]
        return items[0] if w.value.single else items

    # -- internals: put ------------------------------------------------------------------
    def _session(self, th: _Thread, branch: str, ns: str) -> Session:
        s = th.branches.get(branch)
        if s is not None and (s.head.id if s.head is not None else None) != th.heads.get(branch):
            s = None  # another writer moved the branch: a fresh engine object reads it again
        if s is None:
            files = self.workspace is not None and ns == ""
            while len(th.branches) >= _KEEP_BRANCHES:
                del th.branches[next(iter(th.branches))]
            s = th.branches[branch] = Session(
                self.store,
                th.session,
                workspace=self.workspace if files else None,
                branch=branch,
                force=self.force,
                redact=False,  # the saver scrubs values before serializing them (_dumps)
                bind=self.bind,
            )
            if files:
                s.workspace = self._files()  # shared: scans taken ahead, one stat cache
        return s

    def _branch_for(
        self, th: _Thread, ns: str, cpid: str, parent: _Entry | None
    ) -> tuple[str, bool]:
        """The branch a new checkpoint goes on, and whether it starts there at ``parent``."""
        base = "main" if ns == "" else f"ns:{ns}"
        if parent is not None:
            if th.heads.get(parent.record.branch) == parent.id:
                return parent.record.branch, False
            return f"{base}@{cpid}", True
        head = th.heads.get(base)
        if head is None or head in th.removed:
            return base, False
        return f"{base}@{cpid}", False

    def _put(
        self,
        th: _Thread,
        ns: str,
        checkpoint: dict[str, Any],
        md: dict[str, Any],
        new_versions: ChannelVersions,
        parent: str | None,
        when: _When,
    ) -> None:
        cpid = str(checkpoint["id"])
        pe = th.entries.get((ns, parent)) if parent else None
        if parent and pe is None and (ns, parent) not in th.known:  # another process's?
            self._load(th)
            pe = th.entries.get((ns, parent))
        cache = None
        if pe is not None:
            for c in (th.caches.get(pe.record.branch), th.last_read):
                if c is not None and c.of == pe.id:
                    cache = c
                    break
        reader = _Reader(self)
        versions = dict(checkpoint.get("channel_versions") or {})
        values = checkpoint.get("channel_values") or {}
        pversions = self._details(pe, reader)["cv"] if pe is not None else {}
        conv_ch = self.conversation_channel
        state: dict[str, Any] = {}
        new_values: dict[str, tuple[Any, Any, bytes]] = {}
        conv_views: builtins.list[Any] | None = None
        conv_items: builtins.list[str] | None = None
        inline: dict[str, str] = {}
        appended_from = 0
        for ch, ver in versions.items():
            # A channel whose version did not move keeps the parent's value (LangGraph's
            # savers store a value only for the channels in new_versions).
            inherit = pe is not None and ch not in new_versions and pversions.get(ch) == ver
            if ch == conv_ch:
                if inherit and pe is not None and pe.record.state.conversation is not None:
                    if cache is not None and cache.conv_items is not None:
                        conv_views, conv_items = cache.conv_views, cache.conv_items
                    else:
                        conv_items = reader.conv_items(pe.record.state.conversation)
                    appended_from = len(conv_items)
                    state[_CONV_KEY] = conv_items
                    continue
                if not inherit and type(values.get(ch)) is builtins.list:
                    conv_items, appended_from, conv_views = self._encode_conversation(
                        values[ch], cache
                    )
                    state[_CONV_KEY] = conv_items
                    continue
            packed: bytes | None = None
            obj: Any = _MISSING
            if inherit and pe is not None:
                old = cache.values.get(ch) if cache is not None else None
                if old is not None and old[0] == ver:
                    obj, packed = old[1], old[2]
                elif (hexd := pe.record.state.values.get(_VALUE + ch)) is not None:
                    packed = reader.packed_value(hexd)
                elif (text := self._details(pe, reader).get("iv", {}).get(ch)) is not None:
                    packed = _untext(text, "channel value")
            if packed is None:
                if ch not in values:
                    continue  # empty at this version
                obj = values[ch]
                # The same object is not the same value once its version moved: a node may
                # have changed it in place (``s["todo"].append(x); return {"todo": s["todo"]}``).
                old = cache.values.get(ch) if cache is not None and inherit else None
                packed = old[2] if old is not None and old[1] is obj else self._dumps(obj)
            if len(packed) <= _INLINE_MAX:  # tiny: cheaper inside the details than on its own
                inline[ch] = _text(packed)
            else:
                state[_VALUE + ch] = _text(packed)
            new_values[ch] = (ver, obj, packed)
        details: dict[str, Any] = {
            "ts": checkpoint.get("ts"),
            "v": checkpoint.get("v"),
            "cv": versions,
            "vs": checkpoint.get("versions_seen") or {},
            "md": md,
        }
        if inline:
            details["iv"] = inline
        if checkpoint.get("updated_channels") is not None:
            details["uc"] = checkpoint["updated_channels"]
        extra = {k: v for k, v in checkpoint.items() if k not in _KNOWN}
        if extra:
            details["x"] = extra
        if _CONV_KEY in state and conv_ch != _CONV_KEY:
            details["conv"] = conv_ch
        # Writes move into the new record: its parent's, and those of any saved checkpoint
        # that arrived after that checkpoint's child (LangGraph saves both concurrently).
        moved = {key: th.pending.pop(key) for key in builtins.list(th.pending) if key in th.known}
        targets: builtins.list[_CpKey] = []
        if moved:
            home = (ns, parent or "")
            details["w"] = self._embed(th, moved, home, conv_items, appended_from, reader)
            targets = [key for key in moved if key != home]
        try:
            sealed = self._commit(
                th, ns, cpid, parent, pe, details, state, when=when, targets=targets
            )
        except BaseException:
            for key, writes in moved.items():
                th.pending.setdefault(key, {}).update(writes)
            raise
        entry = _entry(sealed, sealed.meta[_META])
        entry.details = details
        self._index(th, entry)
        th.caches.pop(sealed.branch, None)
        th.caches[sealed.branch] = _StateCache(
            sealed.id,
            conv_views,
            conv_items,
            new_values,
        )
        while len(th.caches) > _KEEP_BRANCHES:  # the lines written last (each holds messages)
            del th.caches[next(iter(th.caches))]

    def _encode_conversation(
        self, msgs: builtins.list[Any], cache: _StateCache | None
    ) -> tuple[builtins.list[str], int, builtins.list[Any]]:
        """Packed messages, the parent's reused for the prefix they share, and copies of the
        messages' contents to compare the next put's with.

        The prefix is found by content, not identity: a node that changes a message in place
        and returns it (``msg.content = "edited"; return {"messages": [msg]}``) hands back the
        very object of the parent's list, and the change must still be stored. What is
        compared is each message's ``__dict__`` (a LangChain message's fields) with a copy
        taken when it was stored: one ``list ==`` in C over dicts whose unchanged strings
        are the same objects. That costs ~2,200 CPU instructions a message at every put
        (~300 to reach its ``__dict__``, ~1,900 to compare its 6-9 fields; the identity test
        it replaced took ~8), ~4.4 M at 2,000 messages where the rest of a put is ~1.5 M,
        against ~15 us to serialize one message again; no cheaper test sees a change in
        place (the objects and their dicts stay the same; only their contents tell).
        """
        old_views = cache.conv_views if cache is not None else None
        old_items = cache.conv_items if cache is not None else None
        views = fields_of(msgs)
        if old_views is None or old_items is None:
            n, items, kept = 0, [], []
        else:  # each list copied once (the parent's stay as they are: other caches hold them)
            n = same_prefix(views, old_views)
            items, kept = old_items[:n], old_views[:n]
        if n < len(msgs):  # copies first: a node that runs on while this put does (durability
            # "async") may change a message in place; then the stored form is the newer one and
            # the next put, comparing with the older copy, stores the change again, never misses it
            kept.extend(map(snapshot, views[n:]))
            items.extend([_text(self._dumps(m)) for m in msgs[n:]])
        return items, n, kept

    def _embed(
        self,
        th: _Thread,
        moved: dict[_CpKey, dict[_WriteKey, _Write]],
        home: _CpKey,
        conv: builtins.list[str] | None,
        start: int,
        reader: _Reader,
    ) -> builtins.list[builtins.list[Any]]:
        """Pending writes as the new record keeps them, ``[task, idx, channel, path, value]``
        (plus ``ns, checkpoint id`` for another checkpoint than the record's parent, ``home``).
        A write that is messages of this record's conversation becomes a reference to them:
        a step's new messages are stored once, not twice."""
        out: builtins.list[builtins.list[Any]] = []
        for key, writes in moved.items():
            for w in writes.values():
                packed = self._materialize(th, w, reader)
                many = isinstance(packed, builtins.list)
                items = (
                    [_text(v) for v in packed]
                    if isinstance(packed, builtins.list)
                    else [_text(packed)]
                )
                value: Any = items if many else items[0]
                k = len(items)
                if conv is not None and k and w.channel == self.conversation_channel:
                    # the parent's writes are what this record appended; later ones are near
                    # the end of the conversation
                    lo = start if key == home else max(0, len(conv) - k - 512)
                    for a in range(len(conv) - k, lo - 1, -1):
                        if conv[a] == items[0] and conv[a : a + k] == items:
                            value = [a, k, not many]
                            break
                row = [w.task, w.idx, w.channel, w.path, value]
                out.append(row if key == home else [*row, *key])
        return out

    def _commit(
        self,
        th: _Thread,
        ns: str,
        cpid: str,
        parent: str | None,
        pe: _Entry | None,
        details: dict[str, Any],
        state: dict[str, Any],
        *,
        when: _When | None = None,
        targets: Sequence[_CpKey] = (),
    ) -> Checkpoint:
        state[_DETAILS] = self._details_text(details)
        meta: dict[str, Any] = {"id": cpid}
        if parent:
            meta["p"] = parent
        if ns:
            meta["ns"] = ns
        if targets:  # whose writes it holds, besides its parent's (read without the details)
            meta["wt"] = [builtins.list(t) for t in targets]
        branch, fork = self._branch_for(th, ns, cpid, pe)
        if fork:
            assert pe is not None
            self.store.start_branch(th.session, branch, pe.id)
            th.heads[branch] = pe.id
        session = self._session(th, branch, ns)
        # A fork checkpoint (a replay's first) is a copy of its parent, files included; a copy
        # (``when`` None) records no files; every other put snapshots the workspace.
        files = when is not None and when.source != "fork"
        ws = session.workspace if files and isinstance(session.workspace, _Files) else None
        with self._files_lock if ws is not None else contextlib.nullcontext():
            if ws is not None:
                # the files of this checkpoint's superstep (else the put scans them now); a
                # restore below takes them as its safety checkpoint's and then scans anew
                ws.ahead = self._ahead_for(details["cv"])
            try:
                if fork and when is not None and session.workspace is not None and pe is not None:
                    self._restore_for(th, session, pe, when)
                expected = session.head.id if session.head is not None else None
                md = details.get("md") or {}
                what = f"{md.get('source', 'put')} step {md.get('step')}" + (
                    f" [{ns}]" if ns else ""
                )
                record_meta: dict[str, Any] = {_META: meta}
                red = self.redactor
                if isinstance(red, Redactor) and red.counts:
                    record_meta["stashpoint_redacted"] = dict(sorted(red.counts.items()))
                    red.counts.clear()
                sealed = session.checkpoint(
                    state, kind="auto", message=what, meta=record_meta, files=files
                )
            finally:
                if ws is not None:
                    ws.ahead = None
        th.heads[branch] = sealed.id
        th.restored = None
        if sealed.parent != expected:  # another writer got in between: re-read next time
            th.loaded = False
        return sealed

    def _restore_for(self, th: _Thread, session: Session, pe: _Entry, when: _When) -> None:
        """A new line of history starts at ``pe``: with ``restore_on_time_travel``, put the
        files back as they were there, when no node can be running (else say why not)."""
        restored, th.restored = th.restored, None
        if not self.restore_on_time_travel or pe.record.workspace is None or restored == pe.id:
            return
        if when.source == "update" or (when.source == "input" and when.durability == "sync"):
            session.rewind(pe.id, state=False)  # after a safety checkpoint: undoable
            return
        how = (
            "a replay runs its first node while LangGraph saves this checkpoint: call "
            "saver.restore_files(config) before graph.invoke(None, config)"
            if when.source == "fork"
            else "run the graph with durability='sync'"
        )
        warnings.warn(
            f"the workspace files were not restored to checkpoint {pe.cpid}: {how}",
            StashpointWarning,
            stacklevel=5,
        )

    def _copy_entry(self, dst: _Thread, e: _Entry, reader: _Reader) -> None:
        """Put one checkpoint of another thread into ``dst`` as it is stored."""
        cp = e.record
        state: dict[str, Any] = {
            k: _text(reader.packed_value(h))
            for k, h in cp.state.values.items()
            if k.startswith(_VALUE)
        }
        if cp.state.conversation is not None:
            state[_CONV_KEY] = reader.conv_items(cp.state.conversation)
        details = dict(self._details(e, reader))
        pe = dst.entries.get((e.ns, e.parent)) if e.parent else None
        home = (e.ns, e.parent or "")
        targets = [t for t in e.targets if t != home]
        sealed = self._commit(dst, e.ns, e.cpid, e.parent, pe, details, state, targets=targets)
        entry = _entry(sealed, sealed.meta[_META])
        self._index(dst, entry)

    # -- internals: removing -------------------------------------------------------------
    def _all_records(self, th: _Thread) -> set[str]:
        """Every record of the thread's session: LangGraph's and the bookkeeping around them
        (rewinds of time travel and ``restore_files``, earlier ``removed`` heads)."""
        return set(self.store.record_ids(th.session))

    def _uses_delta(self, thread_id: str) -> bool:
        """Whether a checkpoint of the thread has DeltaChannel counters in its metadata
        (what LangGraph writes while a delta channel's value is not snapshotted)."""
        th = self._thread(thread_id, check=True)
        with th.lock:
            self._prefetch_details(th.entries.values())
            reader = _Reader(self)
            return any(
                not _DELTA_MD.isdisjoint(self._details(e, reader)["md"])
                for e in th.entries.values()
            )

    def _remove(
        self, th: _Thread, doomed: set[str], *, reason: str, everything: bool = False
    ) -> None:
        """Hide checkpoints from LangGraph and mark their records pruned for GC.

        Writes that a removed record holds for a checkpoint that stays go back to the pending
        key first; a branch whose head goes gets a ``removed`` checkpoint as its new head.
        """
        reader = _Reader(self)
        gone = {key for key, e in th.entries.items() if e.id in doomed}
        if not everything:
            for key, holders in th.holders.items():
                if key in gone or key not in th.entries:
                    continue
                for holder in holders:
                    if holder.id not in doomed:
                        continue
                    for target, w in self._held(holder, reader):
                        if target != key:
                            continue
                        value = self._materialize(th, w, reader)
                        th.pending.setdefault(key, {}).setdefault(
                            (w.task, w.idx), _Write(w.task, w.idx, w.channel, w.path, value)
                        )
        for key in builtins.list(th.pending):
            if everything or key in gone:
                del th.pending[key]
        self._save_pending(th)
        for branch, head in self.store.branches(th.session).items():
            if head not in th.removed and (everything or head in doomed):
                Session(self.store, th.session, branch=branch, redact=False).checkpoint(
                    {},
                    kind="edit",
                    message=f"langgraph {reason}: removed from LangGraph's view",
                    meta={_META: {"removed": reason}},
                )
        if doomed:
            self.store.prune(th.session, doomed)
        self._load(th)

    # -- internals: reading ------------------------------------------------------------
    def _loads(self, packed: bytes) -> Any:
        if len(packed) > _INLINE_MAX:
            return self.serde.loads_typed(_unpack(packed))
        # Tiny values (LangGraph's ``branch:to:X`` channels and writes are None) recur in
        # every checkpoint: an immutable result is decoded once per saver, not per tuple.
        got = self._tiny.get(packed, _MISSING)
        if got is _MISSING:
            got = self.serde.loads_typed(_unpack(packed))
            if type(got) in _IMMUTABLE and len(self._tiny) < _KEEP_TINY:
                self._tiny[packed] = got
        return got

    def _loads_many(self, packed: builtins.list[bytes]) -> builtins.list[Any]:
        """Values decoded in order. With LangGraph's own serializer, a run of msgpack values
        is decoded as one msgpack array: one call into its C decoder instead of one per
        message (what its SQLite saver does for a whole message list)."""
        d = _decompressor()
        typed = [_unpack(p, d) for p in packed]
        if (
            len(typed) > 1
            and type(self.serde) is JsonPlusSerializer
            and all(t == "msgpack" for t, _ in typed)
        ):
            array = _msgpack_array_header(len(typed)) + b"".join(data for _, data in typed)
            try:
                got = self.serde.loads_typed(("msgpack", array))
            except Exception:  # decoded one by one below, which names the error
                got = None
            if type(got) is builtins.list and len(got) == len(typed):
                return got
        loads = self.serde.loads_typed
        return [loads(t) for t in typed]

    def _tuple(
        self, th: _Thread, e: _Entry, reader: _Reader, *, seed: bool
    ) -> tuple[CheckpointTuple, _StateCache | None]:
        details, cp = self._details(e, reader), e.record
        cache = _StateCache(cp.id) if seed else None
        cv: dict[str, Any] = details["cv"]
        values: dict[str, Any] = {}
        state_values = cp.state.values
        if len(state_values) > 1:  # channel values besides the details
            for key, hexd in state_values.items():
                if key.startswith(_VALUE):
                    ch = key[len(_VALUE) :]
                    got = values[ch] = reader.value(hexd)
                    if cache is not None:
                        cache.values[ch] = (cv.get(ch), got, reader.packed_value(hexd))
        iv = details.get("iv")
        if iv:
            for ch, text in iv.items():
                packed = _untext(text, "channel value")
                got = values[ch] = self._loads(packed)
                if cache is not None:
                    cache.values[ch] = (cv.get(ch), got, packed)
        conv = cp.state.conversation
        if conv is not None:
            if cache is not None:  # copied first: from the objects, unless handed out before
                cache.conv_views = reader.conv_views(conv)
                cache.conv_items = reader.conv_items(conv)
            values[details.get("conv", _CONV_KEY)] = reader.conv_objects(conv)
        uc = details.get("uc")
        checkpoint: Any = {  # a LangGraph Checkpoint (a TypedDict)
            "v": details.get("v"),
            "id": e.cpid,
            "ts": details.get("ts"),
            "channel_values": values,
            "channel_versions": cv.copy(),
            "versions_seen": {k: v.copy() for k, v in details["vs"].items()},
            "updated_channels": uc if uc is None else _fresh(uc),
        }
        if "x" in details:
            checkpoint.update(_fresh(details["x"]))
        here = (e.ns, e.cpid)
        pending: builtins.list[PendingWrite] = []
        writes: builtins.list[_Write] | None = None
        if here in th.pending:
            writes = builtins.list(self._writes_of(th, here, reader).values())
            writes.sort(key=_write_order)
        elif here in th.holders:
            writes = th.held.get(here)
            if writes is None:
                writes = builtins.list(self._writes_of(th, here, reader).values())
                writes.sort(key=_write_order)
                th.held[here] = writes
        if writes:
            pending = [(w.task, w.channel, self._write_value(th, w, reader)) for w in writes]
        conf = {"thread_id": th.thread_id, "checkpoint_ns": e.ns, "checkpoint_id": e.cpid}
        parent: Any = None
        if e.parent:
            parent = {"configurable": {**conf, "checkpoint_id": e.parent}}
        md: Any = _fresh(details["md"])
        config: Any = {"configurable": conf}
        tup = CheckpointTuple(config, checkpoint, md, parent, pending)
        return tup, cache

    def _write_value(self, th: _Thread, w: _Write, reader: _Reader) -> Any:
        if isinstance(w.value, _Ref):
            holder = th.records.get(w.holder or "")
            conv = holder.record.state.conversation if holder is not None else None
            if conv is None:
                raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
            got = reader.conv_objects(conv, w.value.start, w.value.start + w.value.length)
            if len(got) != w.value.length:
                raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
            return got[0] if w.value.single else got
        if isinstance(w.value, builtins.list):
            return [self._loads(v) for v in w.value]
        return self._loads(w.value)


# -- helpers ------------------------------------------------------------------------------------

_MISSING: Any = object()


def _fresh(x: Any) -> Any:
    """A copy of the dicts and lists in ``x`` (callers may change what they are given)."""
    if type(x) is dict:
        return {k: v if type(v) not in _NESTED else _fresh(v) for k, v in x.items()}
    if type(x) is builtins.list:
        return [v if type(v) not in _NESTED else _fresh(v) for v in x]
    return x


_NESTED = (dict, builtins.list)


def _ids(ids: Sequence[str], what: str) -> Sequence[str]:
    """``ids``, refusing one string: iterating it would name other threads (or runs)."""
    if isinstance(ids, str):
        raise TypeError(f"{what} must be a sequence of IDs, not a str")
    return ids


def _write_order(w: _Write) -> tuple[str, str, int]:
    return (w.path, w.task, w.idx)


def _entry(cp: Checkpoint, meta: Any) -> _Entry:
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise IntegrityError(f"checkpoint {cp.id} has malformed LangGraph metadata")
    ns, parent = str(meta.get("ns", "")), meta.get("p")
    entry = _Entry(cp, ns, meta["id"], str(parent) if parent else None)
    if entry.parent is not None:
        entry.targets.append((ns, entry.parent))
    try:
        entry.targets += [(str(t_ns), str(t_id)) for t_ns, t_id in meta.get("wt") or ()]
    except (TypeError, ValueError) as exc:
        raise IntegrityError(f"checkpoint {cp.id} has malformed LangGraph metadata") from exc
    return entry


def _embedded(holder: str, home: _CpKey, rows: Any) -> Iterator[tuple[_CpKey, _Write]]:
    """Writes a record holds: ``[task, idx, channel, path, value]`` for its parent (``home``),
    plus ``ns, checkpoint id`` for another; value is packed bytes, a list of them, or
    ``[start, length, single]`` into the record's conversation."""
    try:
        for row in rows:
            task, idx, channel, path, value = row[:5]
            target = (str(row[5]), str(row[6])) if len(row) == 7 else home
            v: _Value
            if isinstance(value, builtins.list) and value and isinstance(value[0], int):
                v = _Ref(int(value[0]), int(value[1]), bool(value[2]))
            elif isinstance(value, builtins.list):
                v = [_untext(x, "write") for x in value]
            else:
                v = _untext(value, "write")
            yield target, _Write(str(task), int(idx), str(channel), str(path), v, holder)
    except (ValueError, TypeError, IndexError) as exc:
        raise IntegrityError(f"checkpoint {holder} has malformed LangGraph writes") from exc


def _to_json(value: _Value) -> Any:
    if isinstance(value, _Ref):
        raise AssertionError("pending writes hold values, not references")
    if isinstance(value, builtins.list):
        return [base64.b64encode(v).decode("ascii") for v in value]
    return base64.b64encode(value).decode("ascii")


def _from_json(value: Any) -> bytes | builtins.list[bytes]:
    if isinstance(value, builtins.list):
        return [base64.b64decode(str(v), validate=True) for v in value]
    return base64.b64decode(str(value), validate=True)


def _describe(config: RunnableConfig) -> str:
    conf = config.get("configurable") or {}
    parts = [f"thread {conf.get('thread_id')!r}"]
    if conf.get("checkpoint_ns"):
        parts.append(f"namespace {conf['checkpoint_ns']!r}")
    if conf.get("checkpoint_id"):
        parts.append(f"checkpoint {conf['checkpoint_id']}")
    return ", ".join(parts)
