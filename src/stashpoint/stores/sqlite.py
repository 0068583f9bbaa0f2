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
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConflictError, SchemaVersionError, StoreError
from .base import BlobRow, CheckpointRow, Commit, LogInfo, MessageRow, MetadataStore

__all__ = ["SqliteStore"]

SCHEMA_VERSION = 1
MIGRATIONS: list[str] = [
    # version 1
    """
    CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS blobs(
        digest BLOB PRIMARY KEY, codec INTEGER NOT NULL, size INTEGER NOT NULL,
        data BLOB NOT NULL) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS logs(
        id TEXT PRIMARY KEY, session TEXT NOT NULL, parent TEXT,
        parent_len INTEGER NOT NULL, length INTEGER NOT NULL) WITHOUT ROWID;
    -- logs.length is the length at creation, the live tip is MAX(messages.idx) + 1
    CREATE TABLE IF NOT EXISTS messages(
        log TEXT NOT NULL, idx INTEGER NOT NULL, chain BLOB NOT NULL, data BLOB NOT NULL,
        PRIMARY KEY(log, idx)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS checkpoints(
        id TEXT PRIMARY KEY, session TEXT NOT NULL, branch TEXT NOT NULL, parent TEXT,
        body BLOB NOT NULL, digest TEXT NOT NULL) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS checkpoints_by_session ON checkpoints(session, id);
    CREATE TABLE IF NOT EXISTS heads(
        session TEXT NOT NULL, branch TEXT NOT NULL, checkpoint TEXT NOT NULL,
        PRIMARY KEY(session, branch)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS labels(
        checkpoint TEXT PRIMARY KEY, session TEXT NOT NULL, label TEXT NOT NULL) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS labels_by_session ON labels(session);
    """,
]


class SqliteStore(MetadataStore):
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
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"store {self.path} has schema version {version}; this stashpoint knows "
                f"up to {SCHEMA_VERSION}: upgrade stashpoint"
            )
        if version == SCHEMA_VERSION:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for v in range(version, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        db.execute(stmt)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    # -- helpers --------------------------------------------------------------------------
    def _read(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite read failed: {exc}") from exc

    def _write(self, fn: Any, *args: Any) -> None:
        """Run ``fn(db, *args)`` inside BEGIN IMMEDIATE ... COMMIT."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite write failed: {exc}") from exc
            try:
                fn(db, *args)
                db.execute("COMMIT")
            except BaseException as exc:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"SQLite write failed: {exc}") from exc
                raise

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str | None) -> None:
        def do(db: sqlite3.Connection) -> None:
            if value is None:
                db.execute("DELETE FROM meta WHERE key=?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

        self._write(do)

    # -- blobs ----------------------------------------------------------------------------
    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        found: set[bytes] = set()
        for i in range(0, len(wanted), 500):
            batch = wanted[i : i + 500]
            marks = ",".join("?" * len(batch))
            rows = self._read(f"SELECT digest FROM blobs WHERE digest IN ({marks})", batch)
            found.update(bytes(r[0]) for r in rows)
        return found

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        if blobs:
            self._write(_insert_blobs, blobs)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        rows = self._read("SELECT digest, codec, size, data FROM blobs WHERE digest=?", (digest,))
        if not rows:
            return None
        d, codec, size, data = rows[0]
        return BlobRow(bytes(d), int(codec), int(size), bytes(data))

    def iter_blob_digests(self) -> Iterator[bytes]:
        for (d,) in self._read("SELECT digest FROM blobs"):
            yield bytes(d)

    # -- logs -----------------------------------------------------------------------------
    def log_info(self, log: str) -> LogInfo | None:
        rows = self._read(
            "SELECT session, parent, parent_len, "
            "(SELECT MAX(idx) + 1 FROM messages WHERE log=logs.id) FROM logs WHERE id=?",
            (log,),
        )
        if not rows:
            return None
        session, parent, parent_len, tip = rows[0]
        return LogInfo(session, parent, parent_len, parent_len if tip is None else tip)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        rows = self._read(
            "SELECT idx, chain, data FROM messages WHERE log=? AND idx>=? AND idx<? ORDER BY idx",
            (log, start, stop),
        )
        return [MessageRow(int(i), bytes(c), bytes(d)) for i, c, d in rows]

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        rows = self._read(
            "SELECT id, session, parent, parent_len, "
            "(SELECT MAX(idx) + 1 FROM messages WHERE log=logs.id) FROM logs"
        )
        for ident, session, parent, parent_len, tip in rows:
            yield (
                str(ident),
                LogInfo(session, parent, parent_len, parent_len if tip is None else tip),
            )

    # -- checkpoints ----------------------------------------------------------------------
    def commit(self, commit: Commit) -> None:
        self._write(_apply_commit, commit)

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        rows = self._read(
            "SELECT id, session, branch, parent, body, digest FROM checkpoints WHERE id=?",
            (ident,),
        )
        return _row(rows[0]) if rows else None

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        sql = "SELECT id, session, branch, parent, body, digest FROM checkpoints WHERE session=?"
        args: list[object] = [session]
        if before is not None:
            sql += " AND id<?"
            args.append(before)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_row(r) for r in self._read(sql, args)]

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        upper = prefix + "\U0010ffff"
        if session is None:
            rows = self._read(
                "SELECT id FROM checkpoints WHERE id>=? AND id<? LIMIT 5", (prefix, upper)
            )
        else:
            rows = self._read(
                "SELECT id FROM checkpoints WHERE session=? AND id>=? AND id<? LIMIT 5",
                (session, prefix, upper),
            )
        return [str(r[0]) for r in rows]

    def sessions(self) -> list[str]:
        rows = self._read("SELECT DISTINCT session FROM heads ORDER BY session")
        return [str(r[0]) for r in rows]

    # -- heads and labels -----------------------------------------------------------------
    def branches(self, session: str) -> dict[str, str]:
        rows = self._read("SELECT branch, checkpoint FROM heads WHERE session=?", (session,))
        return {str(b): str(c) for b, c in rows}

    def get_head(self, session: str, branch: str) -> str | None:
        rows = self._read(
            "SELECT checkpoint FROM heads WHERE session=? AND branch=?", (session, branch)
        )
        return str(rows[0][0]) if rows else None

    def set_head(self, session: str, branch: str, new: str, expected: str | None) -> None:
        self._write(_cas_head, session, branch, new, expected)

    def set_label(self, ident: str, session: str, label: str | None) -> None:
        def do(db: sqlite3.Connection) -> None:
            if label is None:
                db.execute("DELETE FROM labels WHERE checkpoint=?", (ident,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO labels(checkpoint, session, label) VALUES (?,?,?)",
                    (ident, session, label),
                )

        self._write(do)

    def labels(self, session: str) -> dict[str, str]:
        rows = self._read("SELECT checkpoint, label FROM labels WHERE session=?", (session,))
        return {str(c): str(label) for c, label in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _row(r: Any) -> CheckpointRow:
    i, s, b, p, body, digest = r
    return CheckpointRow(
        str(i), str(s), str(b), None if p is None else str(p), bytes(body), str(digest)
    )


def _insert_blobs(db: sqlite3.Connection, blobs: Sequence[BlobRow]) -> None:
    db.executemany("INSERT OR IGNORE INTO blobs(digest, codec, size, data) VALUES (?,?,?,?)", blobs)


def _cas_head(
    db: sqlite3.Connection, session: str, branch: str, new: str, expected: str | None
) -> None:
    row = db.execute(
        "SELECT checkpoint FROM heads WHERE session=? AND branch=?", (session, branch)
    ).fetchone()
    current = row[0] if row else None
    if current != expected:
        raise ConflictError(
            f"branch {branch!r} of session {session!r} moved to {current} "
            f"(expected {expected}); another writer got there first"
        )
    db.execute(
        "INSERT OR REPLACE INTO heads(session, branch, checkpoint) VALUES (?,?,?)",
        (session, branch, new),
    )


def _apply_commit(db: sqlite3.Connection, c: Commit) -> None:
    row = c.row
    if c.move_head:
        # The compare-and-set is the UPDATE's WHERE clause: one statement, no extra read.
        if c.expected_head is None:
            cur = db.execute(
                "INSERT OR IGNORE INTO heads(session, branch, checkpoint) VALUES (?,?,?)",
                (row.session, row.branch, row.id),
            )
        else:
            cur = db.execute(
                "UPDATE heads SET checkpoint=? WHERE session=? AND branch=? AND checkpoint=?",
                (row.id, row.session, row.branch, c.expected_head),
            )
        if cur.rowcount != 1:
            raise ConflictError(
                f"branch {row.branch!r} of session {row.session!r} moved; "
                "another writer checkpointed first"
            )
    if c.append is not None:
        a = c.append
        if a.new is not None:
            db.execute(
                "INSERT INTO logs(id, session, parent, parent_len, length) VALUES (?,?,?,?,?)",
                (a.log, a.new.session, a.new.parent, a.new.parent_len, a.new.length),
            )
        # The log's tip is its last message row (no counter to update: one page fewer to write
        # per checkpoint); appending anywhere but at the tip is a conflict.
        (tip,) = db.execute("SELECT MAX(idx) + 1 FROM messages WHERE log=?", (a.log,)).fetchone()
        if tip is None:
            row_ = db.execute("SELECT parent_len FROM logs WHERE id=?", (a.log,)).fetchone()
            tip = row_[0] if row_ else None
        if tip != a.start:
            raise ConflictError(f"conversation log {a.log} grew under us; retry")
        db.executemany(
            "INSERT INTO messages(log, idx, chain, data) VALUES (?,?,?,?)",
            [(a.log, a.start + i, ch, data) for i, (ch, data) in enumerate(a.messages)],
        )
    if c.blobs:
        _insert_blobs(db, c.blobs)
    db.execute(
        "INSERT INTO checkpoints(id, session, branch, parent, body, digest) VALUES (?,?,?,?,?,?)",
        row,
    )
