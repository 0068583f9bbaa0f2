"""SQLite metadata store: the embedded default (WAL mode, one file, 0600).

Why one transaction per checkpoint with ``BEGIN IMMEDIATE``: the write lock is taken before the
head is read, so the compare-and-set and the inserts cannot interleave with another process, and
with ``synchronous=FULL`` (the default durability) the commit is one WAL fsync - the floor that
SPEC §4 measures us against.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._fsutil import mkdir_private
from ..errors import ConflictError, SchemaVersionError, StoreError
from ._sql import TABLES, TABLES_V2, TABLES_V3, SqlStore
from .base import Commit

__all__ = ["SqliteStore"]

SCHEMA_VERSION = 3
MIGRATIONS: list[str] = [  # index = version - 1
    TABLES.format(t="", blob="BLOB"),
    TABLES_V2.format(t="", blob="BLOB"),
    TABLES_V3.format(t="", blob="BLOB"),
]


class SqliteStore(SqlStore):
    defers_commits = True

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._synchronous = synchronous.upper()
        self._sync_now = self._synchronous
        self.url = f"sqlite:///{self.path}"
        self.durability = (
            "SQLite WAL: one fsync per durable commit (synchronous=FULL); deferred ones at "
            "synchronous=NORMAL until a flush fsyncs the WAL"
            if self._synchronous in ("FULL", "EXTRA")
            else f"SQLite WAL, synchronous={synchronous}: a power loss may drop recent ones"
        )
        self._lock = threading.RLock()
        try:
            if not self.path.exists():
                mkdir_private(self.path.parent)  # a store's directories: 0700, like its files
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self._db = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open SQLite store {self.path}: {exc}{_full(self.path)}"
            ) from exc

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"store {self.path} has schema version {version}; this stashpoint knows "
                f"up to {SCHEMA_VERSION}: upgrade stashpoint"
            )
        if version == SCHEMA_VERSION:
            return

        def do(db: sqlite3.Connection) -> None:
            current = db.execute("PRAGMA user_version").fetchone()[0]
            for v in range(current, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        db.execute(stmt)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

        self._tx(do)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite read failed: {exc}") from exc

    def _tx(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(db, *args)`` inside BEGIN IMMEDIATE ... COMMIT."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite write failed: {exc}") from exc
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
                    raise StoreError(f"SQLite write failed: {exc}{_full(self.path)}") from exc
                raise

    def commit(self, commit: Commit) -> None:
        # A deferred commit runs at synchronous=NORMAL: in WAL mode SQLite then skips the
        # commit's fsync but keeps the log ordered, so a crash loses only a suffix of commits.
        want = self._synchronous
        if not commit.durable and want in ("FULL", "EXTRA"):
            want = "NORMAL"
        with self._lock:
            if want != self._sync_now:
                try:
                    self._db.execute(f"PRAGMA synchronous={want}")
                except sqlite3.Error as exc:
                    raise StoreError(f"SQLite write failed: {exc}") from exc
                self._sync_now = want
            super().commit(commit)

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
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite vacuum failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _full(path: Path) -> str:
    """A hint for SQLite's generic I/O errors when the real cause is a full disk."""
    import shutil

    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return ""
    return " (the disk holding it is full: free space, then retry)" if free < (1 << 20) else ""
