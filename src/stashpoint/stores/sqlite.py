"""SQLite metadata store: the embedded default (WAL mode, one file, 0600).

Why one transaction per checkpoint with ``BEGIN IMMEDIATE``: the write lock is taken before the
head is read, so the compare-and-set and the inserts cannot interleave with another process, and
with ``synchronous=FULL`` (the default durability) the commit is one WAL fsync - the floor that
the benchmarks measure us against.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._fsutil import mkdir_private
from ..errors import (
    ConflictError,
    IntegrityError,
    SchemaVersionError,
    StashpointError,
    StoreError,
)
from ._sql import TABLES, TABLES_V2, TABLES_V3, TABLES_V4, SqlStore, _log_info
from .base import BlobRow, Commit, GcEpochChanged, LogAppend, LogInfo, MessageRow

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: SQLite's own locking only
    fcntl = None  # type: ignore[assignment]

__all__ = ["SqliteStore"]

SCHEMA_VERSION = 5
V1_SCHEMA = 3
"""The schema of format 1 (:mod:`.formats`): a store at it opens read-only until upgraded."""
WAL_GROW_AFTER = 3
"""Checkpoints a connection commits before it pre-sizes the WAL: a CLI run that commits once
or twice never pays for it (~6 ms for 4 MiB), an agent loop pays once, at its third."""
WAL_GROW_MAX = 64 << 20
_OPEN_WAIT = 30.0  # seconds, as the busy timeout of every other statement
TABLES_V5 = """
CREATE TABLE logs_v5(
    num INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, session TEXT NOT NULL, parent TEXT,
    parent_len BIGINT NOT NULL);
INSERT INTO logs_v5(id, session, parent, parent_len)
    SELECT id, session, parent, parent_len FROM logs ORDER BY id;
DROP TABLE logs;
ALTER TABLE logs_v5 RENAME TO logs;
CREATE TABLE messages_v5(
    pos INTEGER PRIMARY KEY, log TEXT NOT NULL, idx BIGINT NOT NULL, chain BLOB NOT NULL,
    data BLOB NOT NULL, num INTEGER NOT NULL, CHECK (pos = (num << 32) + idx));
INSERT INTO messages_v5(pos, log, idx, chain, data, num)
    SELECT (l.num << 32) + m.idx, m.log, m.idx, m.chain, m.data, l.num
    FROM messages m JOIN logs l ON l.id = m.log ORDER BY 1;
DROP TABLE messages;
ALTER TABLE messages_v5 RENAME TO messages
"""
"""Schema version 5 (SQLite only): a message row's key is its log's number and its index in
one integer, ``pos = num << 32 | idx``, the table's rowid. Version 4 keyed messages by
``(log, idx)``, which SQLite keeps as an index beside the rowid table: every message written
a page of each. Now the log's messages are one range of the table itself, appended at its end
(a log's number is its row's rowid in ``logs``). The ``log`` and ``idx`` columns stay, as
they were, for anyone reading the file, and ``num`` repeats the log's number (a byte or two):
a row must carry both, so an older stashpoint still running when a newer one migrated the
file cannot insert a row by ``(log, idx)`` alone, which SQLite would number after the last
row, inside another log's range. A message whose log row was missing (unreadable before too:
nothing found its log) is not carried over."""

_LOG_SELECT = (
    "SELECT id, session, parent, parent_len, (SELECT MAX(pos) - (l.num << 32) + 1 "
    "FROM messages WHERE pos >= l.num << 32 AND pos < (l.num + 1) << 32) FROM logs l"
)
_READ_MESSAGES = (
    "SELECT idx, chain, data FROM messages, (SELECT num FROM logs WHERE id=?) l "
    "WHERE pos >= (l.num << 32) + ? AND pos < (l.num << 32) + ? ORDER BY pos"
)
_LOG_TIP = (
    "SELECT COALESCE((SELECT MAX(pos) - (l.num << 32) + 1 FROM messages "
    "WHERE pos >= l.num << 32 AND pos < (l.num + 1) << 32), l.parent_len), l.num FROM logs l "
    "WHERE l.id=?"
)
_NEW_LOG = "INSERT INTO logs(id, session, parent, parent_len) VALUES (?, ?, ?, ?)"
_LOG_NUM = "SELECT num, parent_len FROM logs WHERE id=?"
_INSERT_MESSAGES = [
    "INSERT INTO messages(pos, log, idx, chain, data, num) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?, ?)"] * n)
    for n in range(1, 9)
]
"""One statement for up to 8 messages (a checkpoint of a conversation adds a few): the rows
of one log, keyed by its number (which the writer knows: see ``SqliteStore._log_num``). No
read of ``logs`` in it: joining the rows to their log made SQLite run a subquery per
statement, ~25k CPU instructions of a ~65k statement."""

MIGRATIONS: list[str] = [  # index = version - 1
    TABLES.format(t="", blob="BLOB"),
    TABLES_V2.format(t="", blob="BLOB"),
    TABLES_V3.format(t="", blob="BLOB"),
    TABLES_V4.format(t="", blob="BLOB"),
    TABLES_V5,
]

# A checkpoint that moves an existing head: the compare-and-set carries the lease check in its
# own condition (one statement, not a read of the lease row and then the update); when it
# changes no row, the lease is read again to say which of the two refused it.
_MOVE_UNLEASED = (
    "UPDATE heads SET checkpoint=?, auth=? WHERE session=? AND branch=? AND checkpoint=? "
    "AND NOT EXISTS (SELECT 1 FROM leases WHERE session=? AND expires>?)"
)
_MOVE_FENCED = (
    "UPDATE heads SET checkpoint=?, auth=? WHERE session=? AND branch=? AND checkpoint=? "
    "AND EXISTS (SELECT 1 FROM leases WHERE session=? AND token=?)"
)
_INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints(id, session, branch, parent, body, digest) VALUES (?, ?, ?, ?, ?, ?)"
)
_INSERT_CHECKPOINT_AFTER = (
    "INSERT INTO checkpoints(id, session, branch, parent, body, digest) "
    "SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM logs l WHERE l.id = ? "
    "AND (l.parent_len = ? OR EXISTS (SELECT 1 FROM messages WHERE pos = (l.num << 32) + ? - 1)))"
)
"""The record of a checkpoint that appended to a log, inserted only if the row before its
first message exists (or that is the log's first own row): with the message key, which
refuses a row written twice, the tip's compare-and-set without reading the tip. (In the
messages INSERT itself, a read of ``messages`` would make SQLite stage the rows in a
temporary table first: ~30k CPU instructions.)"""
_INSERT_CHECKPOINT_AFTER_ROW = (
    "INSERT INTO checkpoints(id, session, branch, parent, body, digest) "
    "SELECT ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM messages WHERE pos = ? AND log = ?)"
)
"""The same check where the row before is one of the log's own (the usual append), by its
key: it exists and belongs to this log. That also proves the log's number the rows were
keyed by (a number remembered from an earlier transaction) is this log's."""
_LOG_NUMS_MAX = 1024
"""Log numbers remembered per store object (each log's number never changes)."""


def _blob(data: bytes) -> bytearray:
    """A BLOB parameter as Python's sqlite3 binds it without its adapter protocol: for a
    ``bytes`` value it looks up an adapter and a ``__conform__`` method first (an
    AttributeError built and dropped, ~1-3k CPU instructions a value); a ``bytearray`` is
    bound as it is. Stored the same: a BLOB of the same bytes."""
    return bytearray(data)


_ROWS_PER_INSERT = 100  # 400 parameters: under the 999 of SQLite before 3.32


@functools.lru_cache(maxsize=8)
def _insert_blobs_sql(rows: int) -> str:
    return (
        "INSERT INTO blobs(digest, codec, size, data) VALUES "
        + ", ".join(["(?, ?, ?, ?)"] * rows)
        + " ON CONFLICT (digest) DO NOTHING"
    )


_BLOB_COPY_MAX = 64 << 10
"""Larger BLOB parameters are bound as ``bytes``: copying them would cost more than the
adapter protocol's lookups it saves (see :func:`_blob`)."""


class SqliteStore(SqlStore):
    defers_commits = True
    bytewise_keys = True

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        super().__init__()
        self.path = Path(path)
        self._synchronous = synchronous.upper()
        self._sync_now = self._synchronous
        self._deferred_sync: str | None = None
        """The level of the deferred commit running now (set by ``commit`` for ``_tx``)."""
        # Absolute: "sqlite:///" + a relative path reads back as a path under / (the URL is
        # printed in hints and error messages that must work from any directory).
        self.url = f"sqlite://{os.path.abspath(self.path)}"  # absolute, ``..`` folded
        self.durability = (
            "SQLite WAL: one fsync per durable commit (synchronous=FULL); deferred ones at "
            "synchronous=NORMAL until a flush fsyncs the WAL"
            if self._synchronous in ("FULL", "EXTRA")
            else f"SQLite WAL, synchronous={synchronous}: a power loss may drop recent ones"
        )
        self._lock = threading.RLock()
        self._writers = _WriterQueue(f"{self.path}-writers")
        self._wal_target = 0
        self._commits = 0
        self._log_nums: dict[str, tuple[int, int]] = {}
        """Log id -> (number, parent_len) of logs this object appended to (see _log_num)."""
        self._new_log: tuple[str, int, int] | None = None
        """A log created by the commit running now: remembered once that commit is in."""
        try:
            if not self.path.exists():
                mkdir_private(self.path.parent)  # a store's directories: 0700, like its files
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            try:
                self._connect(exclusive=_no_room_for_shm(self.path))
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) not in _NO_SHARED_MEMORY:
                    raise
                self._connect(exclusive=True)  # the disk filled up since we looked
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._migrate()
            self._wal_target = self._wal_size_at_reset()
        except sqlite3.Error as exc:
            raise self._failed(exc, f"cannot open SQLite store {self.path}", full=True) from exc

    def _connect(self, *, exclusive: bool) -> None:
        """Open the connection and make sure the database is in WAL mode.

        ``exclusive`` (a full disk): keep the WAL index in this process's memory instead of
        the shared ``-shm`` file, holding the database's lock until the store closes. Why:
        SQLite sizes a new ``-shm`` file to 32 KiB with real writes, so on a full disk no
        command could open the store at all, not even ``verify``, ``log`` or ``gc``, which
        frees space. Only then, when no other process has the store open (one that did would
        have the file sized already), so the lock shuts no one out but later openers, who
        wait."""
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        try:
            if exclusive:
                db.execute("PRAGMA locking_mode=EXCLUSIVE")  # before the first read: no -shm
            self._db = db
            self._wal_mode()
        except BaseException:
            db.close()
            raise
        if exclusive:
            warnings.warn(
                f"the disk holding {self.path} is full: the store is open for this process "
                "alone until it ends (others wait); free space (`stashpoint gc`)",
                stacklevel=4,
            )

    def _failed(self, exc: sqlite3.Error, what: str, *, full: bool = False) -> StashpointError:
        """The library's error for a driver error, decided here for every statement.

        Why: SQLite reports a damaged file (corrupt bytes in its pages: "database disk image is
        malformed", or a header that is no longer SQLite's) as a plain ``DatabaseError``; as a
        StoreError every command exited 1, as if the backend were merely unavailable. Stored
        data that no longer reads back is an integrity failure (exit 2), like a bad digest.
        ``full`` adds the full-disk hint to errors of writes and opens."""
        if _damaged(exc):
            return IntegrityError(
                f"SQLite store {self.path} is damaged: {exc}; restore the file from a backup "
                "(`sqlite3 FILE .recover` may salvage what is left)"
            )
        return StoreError(f"{what}: {exc}{_full(self.path) if full else ''}")

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"store {self.path} has schema version {version}; this stashpoint knows "
                f"up to {SCHEMA_VERSION}: upgrade stashpoint"
            )
        # A store written by format 1 (schema 3, or older: brought to 3 as its own version
        # did) is read as it is: schema 4 is part of ``stashpoint upgrade``
        # (:mod:`.migrate`), never a side effect of opening it. Schema 4 -> 5 is within
        # format 2 (the message rows' layout) and is migrated on open.
        self.format_v1 = 0 < version <= V1_SCHEMA
        self.ref_auth = not self.format_v1
        target = V1_SCHEMA if self.format_v1 else SCHEMA_VERSION
        if version >= target:
            return

        def do(db: sqlite3.Connection) -> None:
            current = db.execute("PRAGMA user_version").fetchone()[0]
            if current >= target:
                return  # another process migrated it meanwhile
            for v in range(current, target):
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        db.execute(stmt)
            db.execute(f"PRAGMA user_version={target}")

        self._tx(do)

    def _wal_mode(self) -> None:
        """Switch a new database to WAL, which only its first opener has to do.

        Converting the journal needs the database to itself, and SQLite answers a conflict
        with "database is locked" at once, without its busy handler: processes opening a new
        store together failed (reproduced: 3 of 30 tries with 16 threads). WAL is a property
        of the file, so the mode is read first and the switch retried with a backoff, until
        this connection or another made it."""
        deadline = time.monotonic() + _OPEN_WAIT
        delay = 0.001
        while True:
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                self._db.execute("PRAGMA journal_mode=WAL")
                return  # a file system without WAL keeps its mode, as SQLite decides
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _wal_size_at_reset(self) -> int:
        """The size the WAL file reaches before an automatic checkpoint lets SQLite write it
        from the start again (0: nothing to pre-size, e.g. automatic checkpoints are off)."""
        if self._synchronous not in ("FULL", "EXTRA"):
            return 0  # no fsync per commit: a growing file costs next to nothing
        pages = int(self._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        return min(32 + max(pages, 0) * (24 + page), WAL_GROW_MAX) if pages > 0 else 0

    def _grow_wal(self) -> None:
        """Give the WAL file its full size in written zeros, once, as PostgreSQL zero-fills its
        WAL segments. Why: while the WAL file still grows, each commit's fsync must also
        commit the file's new size and blocks to the file system's journal: measured here,
        a 3-page commit cost 0.33-0.40 ms against 0.19-0.25 ms once the file had its size,
        for the first ~300 commits of every process (SQLite deletes the WAL when the last
        connection closes). ``fallocate`` does not do it: its blocks are unwritten extents,
        and writing into one is again a journalled change.

        Called holding the write lock (``BEGIN IMMEDIATE``, nothing written yet): no writer
        can append frames meanwhile, and only bytes past the file's end are written. SQLite
        reads frames from the start and stops at the first whose salt and checksum do not
        match, so zeros past the last frame are what a reused WAL holds anyway: old frames.
        Best effort: on any error (a full disk) the file is cut back to its old size."""
        target, self._wal_target = self._wal_target, 0  # once per connection, come what may
        try:
            fd = os.open(f"{self.path}-wal", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            size = os.fstat(fd).st_size
            if size >= target:
                return
            try:
                zeros = bytes(1 << 20)
                at = size
                while at < target:
                    at += os.pwrite(fd, memoryview(zeros)[: target - at], at)
                os.fsync(fd)  # fdatasync is not on every platform (macOS)
            except OSError:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
        finally:
            os.close(fd)

    def _digest_params(self, digests: list[bytes]) -> Sequence[Any]:
        return [bytearray(d) for d in digests]  # see _blob

    def _insert_blob_rows(self, cur: Any, blobs: Sequence[BlobRow]) -> None:
        """Up to ``_ROWS_PER_INSERT`` rows per statement: one statement per row (what
        ``executemany`` runs) costs a bind, a step and a reset each, ~40 % more CPU for the
        tens of thousands of pointer rows of a first snapshot."""
        big, n = _BLOB_COPY_MAX, _ROWS_PER_INSERT
        for i in range(0, len(blobs), n):
            part = blobs[i : i + n]
            args = [
                v
                for d, codec, size, data in part
                for v in (bytearray(d), codec, size, data if len(data) > big else bytearray(data))
            ]
            cur.execute(_insert_blobs_sql(len(part)), args)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise self._failed(exc, "SQLite read failed") from exc

    def _tx(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(db, *args)`` inside BEGIN IMMEDIATE ... COMMIT, in this process's turn, at
        the store's synchronous level: only a deferred checkpoint's own commit (``commit``)
        runs below it, never the write after it (a journal entry, an intent, a head)."""
        with self._lock:
            turn = self._writers.enter()  # not a generator context manager: once per commit
            try:
                db = self._db
                want = self._deferred_sync or self._synchronous
                try:
                    if want != self._sync_now:
                        db.execute(f"PRAGMA synchronous={want}")
                        self._sync_now = want
                    db.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise self._failed(exc, "SQLite write failed") from exc
                if self._wal_target and self._commits >= WAL_GROW_AFTER:
                    self._grow_wal()
                try:
                    result = fn(db, *args)
                    db.execute("COMMIT")
                    return result
                except BaseException as exc:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                    if isinstance(exc, sqlite3.IntegrityError):
                        raise ConflictError(f"another writer got there first: {exc}") from exc
                    if isinstance(exc, sqlite3.Error):
                        raise self._failed(exc, "SQLite write failed", full=True) from exc
                    raise
            finally:
                self._writers.leave(turn)

    def _apply_commit(self, cur: Any, c: Commit) -> None:
        """A checkpoint that moves an existing head (what an agent loop writes): the head's
        compare-and-set with the lease check folded in, then the inserts; four statements
        for a state checkpoint. Anything else takes the general path.

        The log's tip is not read back here: the head compare-and-set proves that the head
        this checkpoint extends is current, and that head's conversation ends at
        ``append.start``, so the log holds at least that many messages; one more written
        since (by another branch sharing the log) is refused by the message key as a
        conflict, which the session retries on a log of its own."""
        if not c.move_head or c.expected_head is None:
            super()._apply_commit(cur, c)
            return
        row, fence = c.row, c.fence
        if c.gc_epoch is not None:
            try:
                self._check_gc_epoch(cur, c.gc_epoch, row.id)
            except GcEpochChanged:
                self._check_fence(cur, fence, row.session)  # a lease refusal comes first
                raise
        if fence is None:
            args: tuple[Any, ...] = (row.session, time.time())
            move = _MOVE_UNLEASED
        else:
            args, move = (fence.session, fence.token), _MOVE_FENCED
        res = cur.execute(
            move, (row.id, c.head_auth, row.session, row.branch, c.expected_head, *args)
        )
        if res.rowcount != 1:
            self._check_fence(cur, fence, row.session)  # raises if the lease refused it
            raise ConflictError(
                f"branch {row.branch!r} of session {row.session!r} moved; "
                "another writer checkpointed first"
            )
        a = c.append
        if a is None:
            if c.blobs:
                self._insert_blobs(cur, c.blobs)
            cur.execute(_INSERT_CHECKPOINT, (*row[:4], _blob(row.body), row.digest))
            return
        try:
            self._append_with_record(cur, c, a)
        except BaseException:
            self._log_nums.pop(a.log, None)  # learnt again by the retry, if any
            raise

    def _append_with_record(self, cur: Any, c: Commit, a: LogAppend) -> None:
        """The messages, the blobs, then the record, inserted only where the log ends at
        ``a.start`` (see ``_INSERT_CHECKPOINT_AFTER``)."""
        row = c.row
        num, parent_len, known = self._log_num(cur, a)
        self._insert_messages(cur, a, num)
        if c.blobs:
            self._insert_blobs(cur, c.blobs)
        record = (*row[:4], _blob(row.body), row.digest)
        if a.start > parent_len:  # the row before is the log's own: checked by its key
            before = (num << 32) + a.start - 1
            ok = cur.execute(_INSERT_CHECKPOINT_AFTER_ROW, (*record, before, a.log)).rowcount == 1
        elif a.new is not None and a.start == parent_len:  # the log's first rows, made here
            ok = cur.execute(_INSERT_CHECKPOINT, record).rowcount == 1
        else:
            if known:  # the number was remembered: read it again, this check does not prove it
                num2 = self._log_num(cur, a, fresh=True)[0]
                if num2 != num:
                    raise ConflictError(f"log {a.log} was renumbered")
            tip = (*record, a.log, a.start, a.start)
            ok = cur.execute(_INSERT_CHECKPOINT_AFTER, tip).rowcount == 1
        if not ok:
            raise ConflictError(f"log {a.log} does not end where this checkpoint appends")

    def _log_num(self, cur: Any, a: LogAppend, fresh: bool = False) -> tuple[int, int, bool]:
        """(number, parent_len, remembered) of the log ``a`` appends to, creating it first
        when ``a`` says so. A log's number (its row's rowid) is what its messages are keyed
        by; it is remembered between checkpoints: the record's insert checks that the row
        before the new ones is this log's, which it could not be under another number."""
        if a.new is not None:
            res = cur.execute(_NEW_LOG, (a.log, a.new.session, a.new.parent, a.new.parent_len))
            num = int(res.lastrowid)
            self._new_log = (a.log, num, a.new.parent_len)
            return num, a.new.parent_len, False
        if not fresh:
            got = self._log_nums.get(a.log)
            if got is not None:
                return got[0], got[1], True
        found = cur.execute(_LOG_NUM, (a.log,)).fetchone()
        if found is None:
            raise ConflictError(f"log {a.log} does not exist")
        entry = (int(found[0]), int(found[1]))
        if len(self._log_nums) >= _LOG_NUMS_MAX:
            self._log_nums.clear()
        self._log_nums[a.log] = entry
        return entry[0], entry[1], False

    def _insert_messages(self, cur: Any, a: LogAppend, num: int) -> None:
        """The rows of ``a`` in log number ``num`` (the caller checks the tip)."""
        rows = a.messages
        base = num << 32
        log = a.log
        for at in range(0, len(rows), len(_INSERT_MESSAGES)):
            batch = rows[at : at + len(_INSERT_MESSAGES)]
            args: list[Any] = []
            idx = a.start + at
            for ch, data in batch:
                args += (base + idx, log, idx, _blob(ch), _blob(data), num)
                idx += 1
            cur.execute(_INSERT_MESSAGES[len(batch) - 1], args)

    def _append(self, cur: Any, a: LogAppend) -> None:
        """Create the log if new, check its tip (compare-and-set), insert the entries."""
        if a.fence is not None or a.session is not None:
            self._check_fence(cur, a.fence, a.fence.session if a.fence else str(a.session))
        if a.new is not None:
            cur.execute(_NEW_LOG, (a.log, a.new.session, a.new.parent, a.new.parent_len))
        got = cur.execute(_LOG_TIP, (a.log,)).fetchone()
        if got is None or got[0] != a.start:
            raise ConflictError(f"log {a.log} grew under us; another writer appended first")
        self._insert_messages(cur, a, int(got[1]))

    # A format-1 store (schema 3, read-only until upgraded) keeps its messages keyed by
    # (log, idx): it is read with the layout-neutral queries of SqlStore.
    def log_info(self, log: str) -> LogInfo | None:
        if self.format_v1:
            return super().log_info(log)
        rows = self._read(_LOG_SELECT + " WHERE id=?", (log,))
        return _log_info(rows[0])[1] if rows else None

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        if self.format_v1:
            yield from super().iter_logs()
            return
        for row in self._read(_LOG_SELECT + " ORDER BY num"):
            yield _log_info(row)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        if self.format_v1:
            return super().read_messages(log, start, stop)
        rows = self._read(_READ_MESSAGES, (log, start, stop))
        return [MessageRow(int(i), bytes(c), bytes(d)) for i, c, d in rows]

    def delete_logs(self, logs: Sequence[str]) -> None:
        def do(cur: Any) -> None:
            for log in logs:
                cur.execute(
                    "DELETE FROM messages WHERE pos >= (SELECT num FROM logs WHERE id=?1) << 32 "
                    "AND pos < ((SELECT num FROM logs WHERE id=?1) + 1) << 32",
                    (log,),
                )
                cur.execute("DELETE FROM logs WHERE id=?", (log,))

        if logs:
            for log in logs:
                self._log_nums.pop(log, None)
            self._tx(do)

    def commit(self, commit: Commit) -> None:
        # A deferred commit runs at synchronous=NORMAL: in WAL mode SQLite then skips the
        # commit's fsync but keeps the log ordered, so a crash loses only a suffix of commits.
        deferred = not commit.durable and self._synchronous in ("FULL", "EXTRA")
        with self._lock:
            self._commits += 1
            self._deferred_sync = "NORMAL" if deferred else None
            self._new_log = None
            try:
                super().commit(commit)
                if self._new_log is not None:  # committed: its number is now for good
                    log, num, parent_len = self._new_log
                    if len(self._log_nums) >= _LOG_NUMS_MAX:
                        self._log_nums.clear()
                    self._log_nums[log] = (num, parent_len)
            finally:
                self._deferred_sync = None
                self._new_log = None

    def flush(self) -> None:
        """fsync the write-ahead log: every transaction committed so far, deferred or not, is
        in it or already checkpointed into the (fsynced) database file."""
        with self._lock:
            try:
                fd = os.open(f"{self.path}-wal", os.O_RDONLY)
            except FileNotFoundError:
                return  # no WAL: everything was checkpointed into the database, durably
            except OSError as exc:
                raise StoreError(f"cannot flush SQLite store {self.path}: {exc}") from exc
            try:
                os.fsync(fd)  # a failed fsync fails the flush: never retried into success
            except OSError as exc:
                raise StoreError(f"cannot flush SQLite store {self.path}: {exc}") from exc
            finally:
                os.close(fd)

    def vacuum(self) -> None:
        """Rewrite the database without its free pages and truncate the WAL (GC deletes rows;
        SQLite reuses their pages but keeps the file size until this runs)."""
        with self._lock:
            try:
                self._db.execute("VACUUM")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._wal_target = self._wal_size_at_reset()  # the WAL is empty again
            except sqlite3.Error as exc:
                raise self._failed(exc, "SQLite vacuum failed") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._writers.close()


_held = threading.local()
"""The writer-queue files this thread is in the front of (a second store object on the same
database, used from inside the first one's transaction, must not wait for itself)."""


class _WriterQueue:
    """Processes writing one database wait for their turn in the kernel (an ``flock`` on a
    file beside it) instead of in SQLite's busy handler.

    Why: SQLite answers a busy write lock by sleeping 1, 2, 5, 10 … up to 100 ms between
    tries, so a commit that needed the lock for 0.3 ms often slept 25-100 ms after it was
    free: with 8 processes writing, p99 was 80 ms at a p50 of 0.6 ms, and a process could be
    passed over again and again. A blocked ``flock`` is woken the moment its holder lets go.

    Only a queue in front of SQLite's own lock, which still decides: where the file cannot be
    made or locked (a read-only directory, a file system without locks) writers go straight
    to SQLite, as before. A forked child closes its inherited descriptor at once
    (:func:`_after_fork`): it shares the parent's lock, so the child would walk past a parent
    holding the turn, and would keep that turn held if the parent died holding it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._off = fcntl is None
        _queues.add(self)

    def enter(self) -> int | None:
        """Wait for this process's turn; returns what :meth:`leave` takes (None: no queue
        was waited in: off, or this thread is in its front already)."""
        held: set[str] | None = getattr(_held, "paths", None)
        if held is None:
            held = _held.paths = set()
        if self._off or self.path in held:
            return None
        fd = self._wait()
        if fd is not None:
            held.add(self.path)
        return fd

    def leave(self, fd: int | None) -> None:
        if fd is None:
            return
        _held.paths.discard(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:  # pragma: no cover - an unlock does not fail on a valid fd
            self.close()

    @contextmanager
    def turn(self) -> Iterator[None]:
        fd = self.enter()
        try:
            yield
        finally:
            self.leave(fd)

    def _wait(self) -> int | None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            self.close()
            self._off = True  # SQLite's busy handler from now on
            return None
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # in a forked child: its copy only; the parent's lock stays


_queues: weakref.WeakSet[_WriterQueue] = weakref.WeakSet()


def _after_fork() -> None:
    _held.paths = set()  # a turn the parent's thread was in is not the child's
    for queue in list(_queues):
        queue.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_NO_SHARED_MEMORY = (4618, 4874, 5386)
"""SQLITE_IOERR_SHMOPEN, _SHMSIZE, _SHMMAP: the ``-shm`` file cannot be made, sized or mapped
(a full disk): the store opens with its WAL index in private memory (``_connect``)."""
_SHM_SIZE = 32 << 10
"""What SQLite writes into a new ``-shm`` file before it can read the WAL (its first region)."""


def _no_room_for_shm(path: Path) -> bool:
    """Whether the ``-shm`` file would have to grow on a disk without room for it.

    Looked at before opening, not learnt from the failure: SQLite fills the new file page by
    page until the disk is full, so a failed try would itself take the last free bytes (the
    ones ``gc`` needs to write the transaction that frees space)."""
    import shutil

    try:
        have = os.stat(f"{path}-shm").st_size
    except OSError:
        have = 0
    if have >= _SHM_SIZE:
        return False  # sized already (another process may have it open right now)
    try:
        return shutil.disk_usage(path.parent).free < _SHM_SIZE - have + (64 << 10)
    except OSError:
        return False


_CORRUPT, _NOTADB = 11, 26  # SQLITE_CORRUPT, SQLITE_NOTADB (primary result codes)


def _damaged(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the database file itself damaged (not busy, full or read-only)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF in (_CORRUPT, _NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def _full(path: Path) -> str:
    """A hint for SQLite's generic I/O errors when the real cause is a full disk."""
    import shutil

    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return ""
    return " (the disk holding it is full: free space, then retry)" if free < (1 << 20) else ""
