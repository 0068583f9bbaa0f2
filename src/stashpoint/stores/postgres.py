"""PostgreSQL metadata store (psycopg 3): one store shared by many workers on many machines.

Same rows and the same compare-and-set as the SQLite store. The head moves with an ``UPDATE …
WHERE checkpoint = expected`` (READ COMMITTED re-checks the condition after waiting for a
concurrent writer's row lock), and a conversation log grows only at its tip because
``(log, idx)`` is a primary key: a second writer appending at the same index gets a unique
violation, which is reported as a conflict and retried by the session.

Server-side prepared statements are disabled (``prepare_threshold=None``) so the store works
behind PgBouncer in transaction mode. Blobs live in the database (``BYTEA``): a store shared
across machines has no shared local directory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..errors import ConflictError, SchemaVersionError, StoreError, UsageError
from .base import BlobRow, CheckpointRow, Commit, LogInfo, MessageRow, MetadataStore

__all__ = ["PostgresStore"]

SCHEMA_VERSION = 1
_LOCK_KEY = 0x5354_4153_4850_4F49  # "STASHPOI": serialises concurrent migrations
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS sp_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS sp_blobs(
        digest BYTEA PRIMARY KEY, codec INTEGER NOT NULL, size BIGINT NOT NULL,
        data BYTEA NOT NULL);
    CREATE TABLE IF NOT EXISTS sp_logs(
        id TEXT PRIMARY KEY, session TEXT NOT NULL, parent TEXT, parent_len BIGINT NOT NULL);
    CREATE TABLE IF NOT EXISTS sp_messages(
        log TEXT NOT NULL, idx BIGINT NOT NULL, chain BYTEA NOT NULL, data BYTEA NOT NULL,
        PRIMARY KEY (log, idx));
    CREATE TABLE IF NOT EXISTS sp_checkpoints(
        id TEXT PRIMARY KEY, session TEXT NOT NULL, branch TEXT NOT NULL, parent TEXT,
        body BYTEA NOT NULL, digest TEXT NOT NULL);
    CREATE INDEX IF NOT EXISTS sp_checkpoints_by_session ON sp_checkpoints(session, id);
    CREATE TABLE IF NOT EXISTS sp_heads(
        session TEXT NOT NULL, branch TEXT NOT NULL, checkpoint TEXT NOT NULL,
        PRIMARY KEY (session, branch));
    CREATE TABLE IF NOT EXISTS sp_labels(
        checkpoint TEXT PRIMARY KEY, session TEXT NOT NULL, label TEXT NOT NULL);
    """,
]


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UsageError(
            "the PostgreSQL store needs psycopg: pip install 'stashpoint[postgres]'"
        ) from exc
    return psycopg


class PostgresStore(MetadataStore):
    def __init__(self, url: str) -> None:
        psycopg = _driver()
        self.url = url
        self.durability = "PostgreSQL commit (as synchronous_commit is set on the server)"
        self._errors = psycopg.errors
        self._lock = threading.RLock()
        try:
            self._db = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {exc}") from exc
        self._migrate()

    def _migrate(self) -> None:
        def do(cur: Any) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute("CREATE TABLE IF NOT EXISTS sp_version(version INTEGER NOT NULL)")
            cur.execute("SELECT version FROM sp_version")
            row = cur.fetchone()
            version = row[0] if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"PostgreSQL store has schema version {version}; this stashpoint knows up "
                    f"to {SCHEMA_VERSION}: upgrade stashpoint"
                )
            for v in range(version, SCHEMA_VERSION):
                cur.execute(MIGRATIONS[v])
            if version == 0:
                cur.execute("INSERT INTO sp_version(version) VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                cur.execute("UPDATE sp_version SET version=%s", (SCHEMA_VERSION,))

        self._tx(do)

    # -- helpers --------------------------------------------------------------------------
    def _tx(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            try:
                with self._db.transaction(), self._db.cursor() as cur:
                    return fn(cur, *args)
            except self._errors.UniqueViolation as exc:
                raise ConflictError(f"another writer got there first: {exc}") from exc
            except self._errors.Error as exc:
                raise StoreError(f"PostgreSQL failed: {exc}") from exc

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        def do(cur: Any) -> list[Any]:
            cur.execute(sql, args)
            return list(cur.fetchall())

        return self._tx(do)  # type: ignore[no-any-return]

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM sp_meta WHERE key=%s", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str | None) -> None:
        def do(cur: Any) -> None:
            if value is None:
                cur.execute("DELETE FROM sp_meta WHERE key=%s", (key,))
            else:
                cur.execute(
                    "INSERT INTO sp_meta(key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value=EXCLUDED.value",
                    (key, value),
                )

        self._tx(do)

    # -- blobs ----------------------------------------------------------------------------
    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        if not wanted:
            return set()
        rows = self._read("SELECT digest FROM sp_blobs WHERE digest = ANY(%s)", (wanted,))
        return {bytes(r[0]) for r in rows}

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        if blobs:
            self._tx(_insert_blobs, blobs)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        rows = self._read(
            "SELECT digest, codec, size, data FROM sp_blobs WHERE digest=%s", (digest,)
        )
        if not rows:
            return None
        d, codec, size, data = rows[0]
        return BlobRow(bytes(d), int(codec), int(size), bytes(data))

    def iter_blob_digests(self) -> Iterator[bytes]:
        for (d,) in self._read("SELECT digest FROM sp_blobs"):
            yield bytes(d)

    # -- logs -----------------------------------------------------------------------------
    _LOG_SQL = (
        "SELECT id, session, parent, parent_len, "
        "(SELECT MAX(idx) + 1 FROM sp_messages m WHERE m.log = l.id) FROM sp_logs l"
    )

    def log_info(self, log: str) -> LogInfo | None:
        rows = self._read(self._LOG_SQL + " WHERE id=%s", (log,))
        return _log_info(rows[0])[1] if rows else None

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        rows = self._read(
            "SELECT idx, chain, data FROM sp_messages WHERE log=%s AND idx>=%s AND idx<%s "
            "ORDER BY idx",
            (log, start, stop),
        )
        return [MessageRow(int(i), bytes(c), bytes(d)) for i, c, d in rows]

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        for row in self._read(self._LOG_SQL):
            yield _log_info(row)

    # -- checkpoints ----------------------------------------------------------------------
    def commit(self, commit: Commit) -> None:
        self._tx(_apply_commit, commit)

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        rows = self._read(
            "SELECT id, session, branch, parent, body, digest FROM sp_checkpoints WHERE id=%s",
            (ident,),
        )
        return _row(rows[0]) if rows else None

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        sql = (
            "SELECT id, session, branch, parent, body, digest FROM sp_checkpoints WHERE session=%s"
        )
        args: list[Any] = [session]
        if before is not None:
            sql += " AND id<%s"
            args.append(before)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT %s"
            args.append(limit)
        return [_row(r) for r in self._read(sql, args)]

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        if session is None:
            rows = self._read(
                "SELECT id FROM sp_checkpoints WHERE id LIKE %s ORDER BY id LIMIT 5", (pattern,)
            )
        else:
            rows = self._read(
                "SELECT id FROM sp_checkpoints WHERE session=%s AND id LIKE %s ORDER BY id LIMIT 5",
                (session, pattern),
            )
        return [str(r[0]) for r in rows]

    def sessions(self) -> list[str]:
        return [str(r[0]) for r in self._read("SELECT DISTINCT session FROM sp_heads ORDER BY 1")]

    # -- heads and labels -----------------------------------------------------------------
    def branches(self, session: str) -> dict[str, str]:
        rows = self._read("SELECT branch, checkpoint FROM sp_heads WHERE session=%s", (session,))
        return {str(b): str(c) for b, c in rows}

    def get_head(self, session: str, branch: str) -> str | None:
        rows = self._read(
            "SELECT checkpoint FROM sp_heads WHERE session=%s AND branch=%s", (session, branch)
        )
        return str(rows[0][0]) if rows else None

    def set_head(self, session: str, branch: str, new: str, expected: str | None) -> None:
        def do(cur: Any) -> None:
            if not _move_head(cur, session, branch, new, expected):
                raise ConflictError(
                    f"branch {branch!r} of session {session!r} moved (expected {expected}); "
                    "another writer got there first"
                )

        self._tx(do)

    def set_label(self, ident: str, session: str, label: str | None) -> None:
        def do(cur: Any) -> None:
            if label is None:
                cur.execute("DELETE FROM sp_labels WHERE checkpoint=%s", (ident,))
            else:
                cur.execute(
                    "INSERT INTO sp_labels(checkpoint, session, label) VALUES (%s, %s, %s) "
                    "ON CONFLICT (checkpoint) DO UPDATE SET label=EXCLUDED.label",
                    (ident, session, label),
                )

        self._tx(do)

    def labels(self, session: str) -> dict[str, str]:
        rows = self._read("SELECT checkpoint, label FROM sp_labels WHERE session=%s", (session,))
        return {str(c): str(label) for c, label in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _row(r: Any) -> CheckpointRow:
    i, s, b, p, body, digest = r
    return CheckpointRow(
        str(i), str(s), str(b), None if p is None else str(p), bytes(body), str(digest)
    )


def _log_info(r: Any) -> tuple[str, LogInfo]:
    ident, session, parent, parent_len, tip = r
    length = int(parent_len) if tip is None else int(tip)
    return str(ident), LogInfo(str(session), parent, int(parent_len), length)


def _insert_blobs(cur: Any, blobs: Sequence[BlobRow]) -> None:
    cur.executemany(
        "INSERT INTO sp_blobs(digest, codec, size, data) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (digest) DO NOTHING",
        [tuple(b) for b in blobs],
    )


def _move_head(cur: Any, session: str, branch: str, new: str, expected: str | None) -> bool:
    if expected is None:
        cur.execute(
            "INSERT INTO sp_heads(session, branch, checkpoint) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (session, branch, new),
        )
    else:
        cur.execute(
            "UPDATE sp_heads SET checkpoint=%s WHERE session=%s AND branch=%s AND checkpoint=%s",
            (new, session, branch, expected),
        )
    return bool(cur.rowcount == 1)


def _apply_commit(cur: Any, c: Commit) -> None:
    row = c.row
    if c.move_head and not _move_head(cur, row.session, row.branch, row.id, c.expected_head):
        raise ConflictError(
            f"branch {row.branch!r} of session {row.session!r} moved; "
            "another writer checkpointed first"
        )
    if c.append is not None:
        a = c.append
        if a.new is not None:
            cur.execute(
                "INSERT INTO sp_logs(id, session, parent, parent_len) VALUES (%s, %s, %s, %s)",
                (a.log, a.new.session, a.new.parent, a.new.parent_len),
            )
        cur.execute(
            "SELECT COALESCE((SELECT MAX(idx) + 1 FROM sp_messages WHERE log=%s), "
            "(SELECT parent_len FROM sp_logs WHERE id=%s))",
            (a.log, a.log),
        )
        (tip,) = cur.fetchone()
        if tip != a.start:
            raise ConflictError(f"conversation log {a.log} grew under us; retry")
        cur.executemany(
            "INSERT INTO sp_messages(log, idx, chain, data) VALUES (%s, %s, %s, %s)",
            [(a.log, a.start + i, ch, data) for i, (ch, data) in enumerate(a.messages)],
        )
    if c.blobs:
        _insert_blobs(cur, c.blobs)
    cur.execute(
        "INSERT INTO sp_checkpoints(id, session, branch, parent, body, digest) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        tuple(row),
    )
