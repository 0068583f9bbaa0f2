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

from ..errors import ConflictError, SchemaVersionError, StoreError
from ._sql import TABLES, TABLES_V2, TABLES_V3, SqlStore

__all__ = ["SqliteStore"]

SCHEMA_VERSION = 3
MIGRATIONS: list[str] = [  # index = version - 1
    TABLES.format(t="", blob="BLOB"),
    TABLES_V2.format(t="", blob="BLOB"),
    TABLES_V3.format(t="", blob="BLOB"),
]


class SqliteStore(SqlStore):
    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.durability = (
            "fsync every checkpoint (SQLite WAL, synchronous=FULL)"
            if synchronous.upper() in ("FULL", "EXTRA")
            else f"SQLite WAL, synchronous={synchronous}: a power loss may drop recent ones"
        )
        self._lock = threading.RLock()
        try:
            if not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self._db = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc

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
                    raise StoreError(f"SQLite write failed: {exc}") from exc
                raise

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
