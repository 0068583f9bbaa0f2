"""The metadata-store interfaces: one narrow protocol per capability, and their composite.

A backend implements :class:`MetadataStore`, which is every capability at once; code that
needs only some of them names the narrow protocol (:class:`MetaKV`, :class:`BlobRows`,
:class:`LogRows`, :class:`CheckpointRecords`, :class:`Refs`, :class:`Leases`,
:class:`Collection`, :class:`Retention`, :class:`Lifecycle`), so what it may touch is visible
in its signature and a wrapper forwards by capability (:mod:`.forwarding`).

Backends store opaque rows: sealing, verifying and decoding records happens above them, in the
session engine, so a backend cannot weaken integrity by accident and a new backend is a few
hundred lines of I/O. The one operation that needs care is :meth:`MetadataStore.commit`: it must
apply everything in a :class:`Commit` atomically, after checking the branch head and the
conversation log tip it was computed against (compare-and-set), or apply nothing.

Garbage collection (:mod:`stashpoint.gc`) adds a second protocol the backends carry out
atomically: *condemned* blobs. GC first marks unreferenced blobs condemned (durably, bumping
``gc_epoch``); from then on :meth:`BlobRows.has_blobs` reports them absent, so a writer that
needs one stores it again, and storing a blob removes its mark (revives it). GC later deletes
only blobs whose mark is still there, claiming the mark and deleting the row in one
transaction, so a revival and a deletion can never both win.
"""

from __future__ import annotations

import enum
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .. import metakeys
from ..errors import (
    GcEpochChanged,
    LeaseHeld,
    LeaseLost,
)

__all__ = [
    "BlobInfo",
    "BlobRow",
    "BlobRows",
    "Capability",
    "CheckpointRecords",
    "CheckpointRow",
    "Collection",
    "Commit",
    "Fence",
    "GcEpochChanged",
    "LeaseInfo",
    "Leases",
    "Lifecycle",
    "LogAppend",
    "LogInfo",
    "LogRows",
    "MessageRow",
    "MetaKV",
    "MetadataStore",
    "Refs",
    "Retention",
    "WriterRegistry",
]

GC_EPOCH_KEY = metakeys.GC_EPOCH
"""Store meta key bumped whenever GC condemns blobs; stat caches and commits are tied to it."""

EPOCH_MAX_AGE = 1.0
"""How long a writer may rely on a ``gc_epoch`` it read (seconds); far below GC's grace."""


class BlobRow(NamedTuple):
    digest: bytes
    """SHA-256 of the uncompressed content (32 bytes)."""
    codec: int
    """How ``data`` is encoded; see :mod:`stashpoint.blobs`."""
    size: int
    """Uncompressed size."""
    data: bytes


class BlobInfo(NamedTuple):
    """What GC and ``du`` need to know about a stored blob row, without its payload."""

    digest: bytes
    codec: int
    size: int
    """Uncompressed size."""
    stored: int
    """Bytes of the row's data (compressed content, chunk list or pack pointer)."""
    ref: bytes | None
    """The data itself when it names other storage (a chunk list or a pack pointer)."""


class CheckpointRow(NamedTuple):
    id: str
    session: str
    branch: str
    parent: str | None
    body: bytes
    """Canonical encoding of the record (see :mod:`stashpoint.integrity`)."""
    digest: str


class MessageRow(NamedTuple):
    idx: int
    chain: bytes
    """Running hash after this message (32 bytes)."""
    data: bytes


class LogInfo(NamedTuple):
    session: str
    parent: str | None
    parent_len: int
    """The log continues the first ``parent_len`` messages of ``parent``."""
    length: int
    """Total conversation length at the log's tip (parent prefix included)."""


@dataclass(frozen=True, init=False)
class LogAppend:
    log: str
    start: int
    """Index of the first new message; must equal the log's current length."""
    messages: Sequence[tuple[bytes, bytes]]
    """(chain, data) pairs."""
    new: LogInfo | None = None
    """Set when the log is created by this commit."""
    fence: Fence | None = None
    """When set, the append is refused with :class:`LeaseLost` unless the lease still holds."""
    session: str | None = None
    """For an append without a fence: refused with :class:`LeaseHeld` while another worker
    holds a live lease on this session (a durable run's journal names its session)."""

    def __init__(
        self,
        log: str,
        start: int,
        messages: Sequence[tuple[bytes, bytes]],
        new: LogInfo | None = None,
        fence: Fence | None = None,
        session: str | None = None,
    ) -> None:
        # Straight into __dict__, as Commit does: one per checkpoint that adds messages.
        self.__dict__.update(
            log=log, start=start, messages=messages, new=new, fence=fence, session=session
        )


@dataclass(frozen=True, init=False)
class Commit:
    """Everything one checkpoint adds, applied atomically by :meth:`MetadataStore.commit`."""

    row: CheckpointRow
    expected_head: str | None
    """The branch head the record was built on (its parent), or None for a new branch."""
    append: LogAppend | None = None
    blobs: Sequence[BlobRow] = ()
    move_head: bool = True
    gc_epoch: str | None = None
    """When set, the ``gc_epoch`` the writer read before checking which blobs exist: the
    commit is refused with :class:`GcEpochChanged` if a GC condemned blobs since."""
    fence: Fence | None = None
    """When set, checked in the commit's own transaction: a worker whose lease was taken
    over cannot write, however late its commit arrives (:class:`LeaseLost`)."""
    durable: bool = True
    """False: the commit may return before it is on disk (a deferred durability level, see
    :mod:`stashpoint.durability`); :meth:`MetadataStore.flush` makes it durable later. A
    backend that cannot defer ignores it (it is then more durable than asked, never less)."""
    head_auth: str | None = None
    """Stored beside the moved head (same row): the ref's sequence number and MAC
    (:mod:`stashpoint.stores.refauth`); opaque to the backend."""

    def __init__(
        self,
        row: CheckpointRow,
        expected_head: str | None,
        append: LogAppend | None = None,
        blobs: Sequence[BlobRow] = (),
        move_head: bool = True,
        gc_epoch: str | None = None,
        fence: Fence | None = None,
        durable: bool = True,
        head_auth: str | None = None,
    ) -> None:
        # The fields straight into __dict__: a frozen dataclass's generated constructor
        # (one object.__setattr__ per field) costs ~16k CPU instructions, this ~2k, once per
        # checkpoint. Still frozen: assigning a field afterwards raises.
        self.__dict__.update(
            row=row,
            expected_head=expected_head,
            append=append,
            blobs=blobs,
            move_head=move_head,
            gc_epoch=gc_epoch,
            fence=fence,
            durable=durable,
            head_auth=head_auth,
        )

    def with_head_auth(self, auth: str | None) -> Commit:
        """This commit with ``head_auth`` set. A copy of its ``__dict__`` (see ``__init__``)."""
        new = object.__new__(Commit)
        new.__dict__.update(self.__dict__)
        new.__dict__["head_auth"] = auth
        return new


class Fence(NamedTuple):
    """A lease's fencing token: the session it covers and the token it was granted."""

    session: str
    token: int


def grant_lease(
    session: str,
    current: tuple[str, int, float] | None,
    owner: str,
    ttl: float,
    now: float,
) -> tuple[str, int, float]:
    """The lease rule every backend applies: ``current`` is (owner, token, expires) or None;
    returns the new (owner, token, expires) or raises :class:`LeaseHeld`."""
    if current is None:
        return owner, 1, now + ttl
    holder, token, expires = current
    if expires > now and holder != owner:
        raise lease_held(session, holder, expires - now)
    if expires <= now:
        token += 1  # a takeover (or a fresh start): fence off every earlier holder
    return owner, token, now + ttl


def lease_held(session: str, holder: str, left: float) -> LeaseHeld:
    return LeaseHeld(
        f"session {session!r} is leased by {holder} for another {left:.1f} s; wait for it to "
        "be released or expire (stashpoint refuses writes from anyone else meanwhile)",
        owner=holder,
        expires_in=left,
    )


def lease_lost(fence: Fence, now_token: int | None) -> LeaseLost:
    return LeaseLost(
        f"the lease on session {fence.session!r} was taken over by another worker (our token "
        f"{fence.token}, now {now_token}); this worker's write was refused"
    )


class LeaseInfo(NamedTuple):
    session: str
    owner: str
    token: int
    """Grows by one at every acquisition, so a newer holder always has a larger token."""
    expires_in: float
    """Seconds until it expires (negative: expired, free to take over)."""


class WriterRegistry:
    """Threads of this process between a blob check and their commit.

    GC may assume no writer is in flight only when this process has none: a writer that
    checked which blobs exist, then commits after a condemnation, would reference a blob about
    to go. One registry belongs to one backend object; wrappers share it (``wrapper.writers is
    inner.writers``), so a write begun through a wrapper is ended by the backend's commit."""

    __slots__ = ("_lock", "_threads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}

    def begin(self) -> None:
        """This thread is about to rely on which blobs exist (a scan, an import): until its
        next successful commit, a GC in this process cannot assume no writer is in flight."""
        with self._lock:
            self._threads[threading.get_ident()] = threading.current_thread()

    def end(self) -> None:
        """Called by backends after a successful commit (cheap when nobody began one)."""
        if self._threads:
            with self._lock:
                self._threads.pop(threading.get_ident(), None)

    def in_flight(self) -> int:
        """Writers in flight other than the calling thread (dead threads are forgotten)."""
        me = threading.get_ident()
        with self._lock:
            for ident, thread in list(self._threads.items()):
                if not thread.is_alive():
                    del self._threads[ident]
            return sum(1 for ident in self._threads if ident != me)


# -- the capabilities ---------------------------------------------------------------------
# One protocol per concern. Consumers and wrappers name the narrow one they use;
# :class:`MetadataStore` is the composite every backend implements.


class MetaKV(Protocol):
    """Store-level settings: a small string key-value space (names in :mod:`..metakeys`)."""

    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str | None) -> None:
        """Set (or with None delete) a store-level setting, durably."""

    @abstractmethod
    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        """Store-level settings whose key starts with ``prefix``."""

    @abstractmethod
    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        """Set (or with None delete) a setting only if it still holds ``expected`` (None:
        only if it is absent), atomically with respect to every other writer of the store,
        in this process or another; whether it did. A value several writers change (the
        LangGraph saver's pending writes) is read, changed and swapped, and read again when
        the swap fails, so that no writer's change overwrites another's."""


class BlobRows(Protocol):
    """Inline blob rows (small contents, chunk lists, pack pointers), by digest."""

    @abstractmethod
    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        """The given digests that are stored and not condemned (a writer may rely on them)."""

    @abstractmethod
    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        """Store blobs durably; existing digests are left as they are; condemned marks of
        these digests are removed in the same transaction."""

    @abstractmethod
    def get_blob(self, digest: bytes) -> BlobRow | None: ...

    def get_blobs(self, digests: Sequence[bytes]) -> dict[bytes, BlobRow]:
        """The rows of those digests that exist (backends answer in one round trip where
        they can: reading many small blobs one query each is what costs)."""
        return {d: row for d in digests if (row := self.get_blob(d)) is not None}

    @abstractmethod
    def iter_blob_digests(self) -> Iterator[bytes]: ...

    @abstractmethod
    def iter_blob_info(self) -> Iterator[BlobInfo]:
        """Every inline blob row, condemned or not, without loading payloads."""

    @abstractmethod
    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        """For each (digest, old data, new data), replace the row's data if it is still
        ``old`` (compare-and-set: a repacked blob moves only if nobody changed it); returns
        how many moved. The codec is left as it is."""


class LogRows(Protocol):
    """Conversation and journal logs: append-only message rows with a running hash."""

    @abstractmethod
    def log_info(self, log: str) -> LogInfo | None: ...

    @abstractmethod
    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        """The log's own rows with ``start <= idx < stop``, in order."""

    @abstractmethod
    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]: ...

    @abstractmethod
    def append_log(self, append: LogAppend) -> None:
        """Append to a log (creating it when ``append.new`` is set) if its tip is still
        ``append.start``; else raise ConflictError and write nothing. Durable on return: the
        durable-execution journal records each step's result this way, between checkpoints."""

    @abstractmethod
    def log_sizes(self) -> dict[str, tuple[int, int]]:
        """Log id -> (own message rows, bytes stored for them)."""

    @abstractmethod
    def delete_logs(self, logs: Sequence[str]) -> None:
        """Delete whole logs (their info and message rows); unknown ids are ignored."""


class CheckpointRecords(Protocol):
    """Checkpoint rows and the atomic commit that adds one."""

    @abstractmethod
    def commit(self, commit: Commit) -> None:
        """Apply a commit atomically or raise ConflictError and apply nothing. Its blobs are
        revived like :meth:`BlobRows.put_blobs`'; ``commit.gc_epoch`` is checked in the
        transaction. Ends this thread's write (:meth:`WriterRegistry.end`) on success."""

    @abstractmethod
    def get_checkpoint(self, ident: str) -> CheckpointRow | None: ...

    @abstractmethod
    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        """A session's checkpoints, newest first (ids sort by time)."""

    @abstractmethod
    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        """Ids starting with ``prefix`` (for abbreviated ids), at most a few."""

    @abstractmethod
    def sessions(self) -> list[str]: ...

    @abstractmethod
    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        """Every checkpoint row of every session (also sessions without a head yet)."""

    def check_id(self, what: str, name: str) -> None:
        """UsageError if this store cannot hold ``name`` as a checkpoint or log id (an import
        checks every id before its first write). Any id a bundle may carry, by default."""
        return None


class Refs(Protocol):
    """Branch heads (compare-and-set) and labels.

    Each head and label row carries an optional ``auth`` string (a sequence number and a
    MAC, :mod:`stashpoint.stores.refauth`) written and returned with it; the backend stores it
    on the same row and never interprets it. ``None``: a row written before refs carried one,
    or by a backend without :attr:`ref_auth`."""

    ref_auth: bool = False
    """Whether this backend stores the ``auth`` string of head and label rows."""

    @abstractmethod
    def branches(self, session: str) -> dict[str, str]:
        """Branch name -> head checkpoint id."""

    def get_head(self, session: str, branch: str) -> str | None:
        return self.branches(session).get(branch)

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        """Branch name -> (head checkpoint id, its ``auth`` string or None)."""
        return {b: (c, None) for b, c in self.branches(session).items()}

    def head_row(self, session: str, branch: str) -> tuple[str, str | None] | None:
        """One branch's (head checkpoint id, ``auth``), or None if it has no head."""
        return self.head_rows(session).get(branch)

    @abstractmethod
    def set_head(
        self,
        session: str,
        branch: str,
        new: str,
        expected: str | None,
        *,
        fence: Fence | None = None,
        auth: str | None = None,
    ) -> None:
        """Compare-and-set a branch head; ConflictError when it is not ``expected``."""

    @abstractmethod
    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None: ...

    @abstractmethod
    def labels(self, session: str) -> dict[str, str]:
        """Checkpoint id -> current label."""

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        """Checkpoint id -> (label, its ``auth`` string or None)."""
        return {c: (label, None) for c, label in self.labels(session).items()}


class Leases(Protocol):
    """One worker owns a session at a time; its fencing token guards its writes."""

    @abstractmethod
    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        """Grant ``owner`` the session's lease for ``ttl`` seconds, with a new fencing token.

        Free or expired: granted with the previous token + 1 (a taken-over worker's writes are
        refused from then on). Held by ``owner`` itself: extended, same token. Held by another
        owner and not expired: :class:`~stashpoint.errors.LeaseHeld`. Expiry is judged by
        the store's clock where it has one (PostgreSQL, Redis), so workers' clocks may differ.
        """

    @abstractmethod
    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        """Extend the lease to ``ttl`` seconds from now if ``fence`` still holds it."""

    @abstractmethod
    def release_lease(self, fence: Fence) -> None:
        """Give the lease up (if ``fence`` still holds it); its token is not reused."""

    @abstractmethod
    def lease_info(self, session: str) -> LeaseInfo | None:
        """The session's lease (also an expired one, with a negative ``expires_in``)."""


class Collection(Protocol):
    """Garbage collection: condemned blobs, the GC epoch, writers in flight."""

    atomic_unlink: bool
    """Whether :meth:`sweep_blobs` can run ``unlink`` inside its transaction (needed for
    blobs kept outside the database, such as a local chunk directory)."""

    writers: WriterRegistry
    """Threads of this process between a blob check and their commit."""

    @abstractmethod
    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        """Mark blobs condemned at ``at`` (seconds since the epoch; an existing mark keeps its
        time) and, in the same transaction, set ``gc_epoch`` to ``epoch`` when given."""

    @abstractmethod
    def condemned(self) -> dict[bytes, float]:
        """Every condemned digest -> when it was condemned."""

    @abstractmethod
    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        """The given digests that are condemned."""

    @abstractmethod
    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        """Remove condemned marks; returns the digests that had one."""

    @abstractmethod
    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        """Delete condemned blobs, in one transaction: claim the marks of those digests that
        are still condemned at or before ``before``, delete their rows, call ``unlink`` with
        the claimed digests (for blobs kept outside the database) and commit. A writer
        reviving a digest concurrently either wins (no claim) or stores it anew after.
        Returns the claimed digests."""

    def vacuum(self) -> None:
        """Give freed space back to the operating system, where the backend keeps it."""
        return None  # most backends have nothing to do

    @abstractmethod
    def read_gc_epoch(self, max_age: float = EPOCH_MAX_AGE) -> str:
        """``gc_epoch``, read at most ``max_age`` seconds ago."""

    @abstractmethod
    def note_gc_epoch(self, value: str | None) -> None:
        """Record an epoch just seen (``None``: forget it; the next read asks the store)."""


class Retention(Protocol):
    """Pruned marks beside the records (the records stay; GC frees what only they reference)."""

    @abstractmethod
    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        """Mark checkpoints pruned by retention; returns the ids newly marked.

        Skips, atomically, ids that are a branch head of the session right now or carry a
        label (set after the retention plan was made), ids of other sessions and unknown ids.
        Refused (:class:`LeaseHeld`) while another worker holds a live lease on the session.
        The record stays (the hash chain still verifies); GC then
        treats what only pruned records reference as garbage.
        """

    @abstractmethod
    def pruned(self, session: str) -> dict[str, str]:
        """Pruned checkpoint id -> when it was pruned (ISO 8601 UTC)."""


class Lifecycle(Protocol):
    """What the store is, how durable its commits are, and closing it."""

    url: str
    durability: str
    """What a committed checkpoint survives, in words (``stashpoint show`` prints it)."""
    defers_commits: bool
    """Whether :attr:`Commit.durable` = False makes commits cheaper here (SQLite, PostgreSQL)."""

    def flush(self) -> None:
        """Make every commit returned so far durable (after commits with ``durable=False``)."""
        return None  # only backends that defer commits act

    @abstractmethod
    def close(self) -> None: ...


class Capability(enum.Enum):
    """What a backend offers beyond the core records (the conformance suite runs these tiers)."""

    LEASES = "leases"
    COLLECTION = "collection"
    RETENTION = "retention"


class MetadataStore(
    MetaKV, BlobRows, LogRows, CheckpointRecords, Refs, Leases, Collection, Retention, Lifecycle
):
    """Rows for checkpoints, heads, labels, message logs and small (inline) blobs: every
    capability at once, for code that needs the whole store (the engine, bundles, copies).
    Backends subclass it and call ``super().__init__()``."""

    url: str
    durability: str = "unknown"
    defers_commits: bool = False
    atomic_unlink: bool = True
    capabilities: frozenset[Capability] = frozenset(Capability)
    """The optional capabilities this backend really implements (all, for the built-in ones)."""
    format_v1: bool | None = None
    """Whether the backend's own layout version (a SQL schema, a file store's layout) is the
    one of store format 1 (:mod:`.formats`); None: the backend has none of its own."""

    def __init__(self) -> None:
        self.writers = WriterRegistry()
        self._epoch_cache: tuple[str, float] | None = None

    def read_gc_epoch(self, max_age: float = EPOCH_MAX_AGE) -> str:
        """``gc_epoch``, read at most ``max_age`` seconds ago (a store round trip saved per
        checkpoint). Safe because GC deletes a condemned blob only after its grace period
        (minutes) or when it holds the store alone, and a condemnation made through this
        object forgets the cached value at once (:meth:`note_gc_epoch`)."""
        cached = self._epoch_cache
        now = time.monotonic()
        if cached is not None and now - cached[1] < max_age:
            return cached[0]
        value = self.get_meta(GC_EPOCH_KEY) or "0"
        self._epoch_cache = (value, now)
        return value

    def note_gc_epoch(self, value: str | None) -> None:
        self._epoch_cache = None if value is None else (value, time.monotonic())

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
