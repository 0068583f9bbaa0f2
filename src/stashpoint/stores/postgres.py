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
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConflictError, SchemaVersionError, StoreError, UsageError
from ._sql import TABLES, TABLES_V2, SqlStore

__all__ = ["PostgresStore"]

SCHEMA_VERSION = 2
_LOCK_KEY = 0x5354_4153_4850_4F49  # "STASHPOI": serialises concurrent migrations
MIGRATIONS: list[str] = [  # index = version - 1
    TABLES.format(t="sp_", blob="BYTEA"),
    TABLES_V2.format(t="sp_", blob="BYTEA"),
]


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UsageError(
            "the PostgreSQL store needs psycopg: pip install 'stashpoint[postgres]'"
        ) from exc
    return psycopg


class PostgresStore(SqlStore):
    param = "%s"
    prefix = "sp_"
    share = " FOR SHARE"  # a commit's epoch check waits for a GC condemning blobs

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

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        # LIKE, not a range: the server's collation may not sort "~" after letters.
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        text = "SELECT id FROM {t}checkpoints WHERE id LIKE ?"
        args: list[Any] = [pattern]
        if session is not None:
            text += " AND session=?"
            args.append(session)
        rows = self._q(text + " ORDER BY id LIMIT 5", args)
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
