"""PostgreSQL metadata store (psycopg 3): one store shared by many workers on many machines.

Same rows and the same compare-and-set as the SQLite store. The head moves with an ``UPDATE …
WHERE checkpoint = expected`` (READ COMMITTED re-checks the condition after waiting for a
concurrent writer's row lock), and a conversation log grows only at its tip because
``(log, idx)`` is a primary key: a second writer appending at the same index gets a unique
violation, which is reported as a conflict and retried by the session.

A checkpoint is one round trip: ``SELECT sp_commit(…)`` runs the lease fence, the epoch fence,
the head compare-and-set, the log append and every insert as one server-side function in one
implicit transaction (a conflict is a custom SQLSTATE). Eight workers each paying ~10 round
trips per checkpoint were what capped throughput, not the server's work.

The hot path (a checkpoint's ``sp_commit``, a journal's ``sp_append``) runs as a named prepared
statement per connection: parsing and planning the call each time cost ~15 % of the server's
CPU per checkpoint. Nothing relies on it: behind a transaction pooler (PgBouncer before 1.21
prepares nothing across transactions) the first "prepared statement does not exist" turns it off
for the store and the call runs unprepared, which is safe because an autocommit statement that
failed changed nothing. ``?prepare=false`` in the URL turns it off from the start; every other
statement is unprepared (``prepare_threshold=None``). Connections come
from a pool (``psycopg_pool``; size with ``?pool_max=N`` in the URL, default 4) so threads (the
async API's workers, a web server) do not queue behind one connection. Blobs live in the
database (``BYTEA``): a store shared across machines has no shared local directory.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..errors import (
    ConflictError,
    GcEpochChanged,
    LeaseHeld,
    LeaseLost,
    SchemaVersionError,
    StoreError,
    UsageError,
)
from ._sql import TABLES, TABLES_V2, TABLES_V3, TABLES_V4, SqlStore, _digest
from .base import Commit, LogAppend

__all__ = ["PostgresStore"]

SCHEMA_VERSION = 5
V1_SCHEMA = 3
"""The schema of format 1 (:mod:`.formats`): a store at it opens read-only until upgraded."""
_LOCK_KEY = 0x5354_4153_4850_4F49  # "STASHPOI": serialises concurrent migrations

_COMMIT_TAIL = """\
    IF cardinality(p_digests) > 0 THEN
        IF EXISTS (SELECT 1 FROM sp_condemned) THEN
            DELETE FROM sp_condemned WHERE digest = ANY(p_digests);
        END IF;
        INSERT INTO sp_blobs(digest, codec, size, data)
            SELECT * FROM unnest(p_digests, p_codecs, p_sizes, p_blobs)
            ON CONFLICT (digest) DO NOTHING;
    END IF;
    INSERT INTO sp_checkpoints(id, session, branch, parent, body, digest)
        VALUES (p_id, p_session, p_branch, p_parent, p_body, p_digest);
    RETURN (SELECT value FROM sp_meta WHERE key = 'gc_epoch');
END $$
"""
"""The end of every version of ``sp_commit``: the checkpoint's new blobs (rescued from a GC
that condemned them), its record, and the GC epoch the writer must compare."""

FUNCTIONS = (
    """
CREATE OR REPLACE FUNCTION sp_check_lease(p_session TEXT, p_fence BIGINT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    v_token BIGINT;
    v_owner TEXT;
    v_left DOUBLE PRECISION;
BEGIN
    IF p_fence IS NOT NULL THEN
        SELECT token INTO v_token FROM sp_leases WHERE session = p_session FOR SHARE;
        IF v_token IS DISTINCT FROM p_fence THEN
            RAISE EXCEPTION 'the lease on session % was taken over by another worker '
                '(our token %, now %)', p_session, p_fence, v_token
                USING ERRCODE = 'SP004';
        END IF;
    ELSE
        SELECT owner, expires - extract(epoch FROM clock_timestamp())
            INTO v_owner, v_left FROM sp_leases WHERE session = p_session FOR SHARE;
        IF v_left > 0 THEN
            RAISE EXCEPTION 'session % is leased by % for another % s',
                p_session, v_owner, round(v_left::numeric, 1) USING ERRCODE = 'SP005';
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION sp_append(
    p_log TEXT, p_new BOOLEAN, p_session TEXT, p_parent TEXT, p_parent_len BIGINT,
    p_start BIGINT, p_chains BYTEA[], p_datas BYTEA[], p_fence_session TEXT, p_fence BIGINT
) RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    v_tip BIGINT;
BEGIN
    IF p_fence_session IS NOT NULL THEN  -- NULL: checked by the caller (sp_commit)
        PERFORM sp_check_lease(p_fence_session, p_fence);
    END IF;
    IF p_new THEN
        INSERT INTO sp_logs(id, session, parent, parent_len)
            VALUES (p_log, p_session, p_parent, p_parent_len);
    END IF;
    SELECT COALESCE((SELECT MAX(idx) + 1 FROM sp_messages WHERE log = p_log),
                    (SELECT parent_len FROM sp_logs WHERE id = p_log)) INTO v_tip;
    IF v_tip IS DISTINCT FROM p_start THEN
        RAISE EXCEPTION 'log % grew under us', p_log USING ERRCODE = 'SP002';
    END IF;
    INSERT INTO sp_messages(log, idx, chain, data)
        SELECT p_log, p_start + m.n - 1, m.c, m.d
        FROM unnest(p_chains, p_datas) WITH ORDINALITY AS m(c, d, n);
END $$;

CREATE OR REPLACE FUNCTION sp_commit(
    p_id TEXT, p_session TEXT, p_branch TEXT, p_parent TEXT, p_body BYTEA, p_digest TEXT,
    p_move_head BOOLEAN, p_expected TEXT, p_gc_epoch TEXT, p_fence_session TEXT,
    p_fence BIGINT, p_log TEXT, p_log_new BOOLEAN, p_log_session TEXT, p_log_parent TEXT,
    p_log_parent_len BIGINT, p_log_start BIGINT, p_chains BYTEA[], p_datas BYTEA[],
    p_digests BYTEA[], p_codecs INTEGER[], p_sizes BIGINT[], p_blobs BYTEA[], p_head_auth TEXT
) RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_epoch TEXT;
    v_rows INTEGER;
BEGIN
    PERFORM sp_check_lease(COALESCE(p_fence_session, p_session), p_fence);
    IF p_gc_epoch IS NOT NULL THEN
        SELECT value INTO v_epoch FROM sp_meta WHERE key = 'gc_epoch' FOR SHARE;
        IF COALESCE(v_epoch, '0') <> p_gc_epoch THEN
            RAISE EXCEPTION 'gc epoch changed' USING ERRCODE = 'SP003';
        END IF;
    END IF;
    IF p_move_head THEN
        IF p_expected IS NULL THEN
            INSERT INTO sp_heads(session, branch, checkpoint, auth)
                VALUES (p_session, p_branch, p_id, p_head_auth) ON CONFLICT DO NOTHING;
        ELSE
            UPDATE sp_heads SET checkpoint = p_id, auth = p_head_auth
                WHERE session = p_session AND branch = p_branch AND checkpoint = p_expected;
        END IF;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> 1 THEN
            RAISE EXCEPTION 'branch % of session % moved', p_branch, p_session
                USING ERRCODE = 'SP001';
        END IF;
    END IF;
    IF p_log IS NOT NULL THEN
        PERFORM sp_append(p_log, p_log_new, p_log_session, p_log_parent, p_log_parent_len,
                          p_log_start, p_chains, p_datas, NULL, NULL);
    END IF;
"""
    + _COMMIT_TAIL
)
"""One round trip per checkpoint (and per journal append); the same checks as SqlStore's."""

COMMIT_V5 = (
    """
CREATE OR REPLACE FUNCTION sp_commit(
    p_id TEXT, p_session TEXT, p_branch TEXT, p_parent TEXT, p_body BYTEA, p_digest TEXT,
    p_move_head BOOLEAN, p_expected TEXT, p_gc_epoch TEXT, p_fence_session TEXT,
    p_fence BIGINT, p_log TEXT, p_log_new BOOLEAN, p_log_session TEXT, p_log_parent TEXT,
    p_log_parent_len BIGINT, p_log_start BIGINT, p_chains BYTEA[], p_datas BYTEA[],
    p_digests BYTEA[], p_codecs INTEGER[], p_sizes BIGINT[], p_blobs BYTEA[], p_head_auth TEXT
) RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    v_epoch TEXT;
    v_rows INTEGER;
BEGIN
    IF NOT p_move_head OR p_expected IS NULL THEN
        PERFORM sp_check_lease(COALESCE(p_fence_session, p_session), p_fence);
    END IF;
    IF p_gc_epoch IS NOT NULL THEN
        SELECT value INTO v_epoch FROM sp_meta WHERE key = 'gc_epoch' FOR SHARE;
        IF COALESCE(v_epoch, '0') <> p_gc_epoch THEN
            RAISE EXCEPTION 'gc epoch changed' USING ERRCODE = 'SP003';
        END IF;
    END IF;
    IF p_move_head THEN
        IF p_expected IS NULL THEN
            INSERT INTO sp_heads(session, branch, checkpoint, auth)
                VALUES (p_session, p_branch, p_id, p_head_auth) ON CONFLICT DO NOTHING;
        ELSE
            -- The lease check rides in the compare-and-set (the lease row locked FOR SHARE,
            -- as sp_check_lease locks it): one statement, not a function call and an update.
            UPDATE sp_heads SET checkpoint = p_id, auth = p_head_auth
                WHERE session = p_session AND branch = p_branch AND checkpoint = p_expected
                AND COALESCE((SELECT CASE WHEN p_fence IS NULL
                                     THEN l.expires <= extract(epoch FROM clock_timestamp())
                                     ELSE l.token = p_fence END
                              FROM sp_leases l
                              WHERE l.session = COALESCE(p_fence_session, p_session)
                              FOR SHARE), p_fence IS NULL);
        END IF;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> 1 THEN
            IF p_expected IS NOT NULL THEN  -- the lease, or the head: say which
                PERFORM sp_check_lease(COALESCE(p_fence_session, p_session), p_fence);
            END IF;
            RAISE EXCEPTION 'branch % of session % moved', p_branch, p_session
                USING ERRCODE = 'SP001';
        END IF;
    END IF;
    IF p_log IS NOT NULL THEN
        IF p_move_head AND p_expected IS NOT NULL THEN
            -- The tip's compare-and-set without reading the tip: a message written at
            -- p_log_start since (another branch on the same log) is refused by the (log, idx)
            -- key; a start past the end, by the row before it being missing.
            IF p_log_new THEN
                INSERT INTO sp_logs(id, session, parent, parent_len)
                    VALUES (p_log, p_log_session, p_log_parent, p_log_parent_len);
            ELSIF NOT EXISTS (SELECT 1 FROM sp_messages
                              WHERE log = p_log AND idx = p_log_start - 1)
                  AND p_log_start IS DISTINCT FROM
                      (SELECT parent_len FROM sp_logs WHERE id = p_log) THEN
                RAISE EXCEPTION 'log % does not end at %', p_log, p_log_start
                    USING ERRCODE = 'SP002';
            END IF;
            INSERT INTO sp_messages(log, idx, chain, data)
                SELECT p_log, p_log_start + m.n - 1, m.c, m.d
                FROM unnest(p_chains, p_datas) WITH ORDINALITY AS m(c, d, n);
        ELSE
            PERFORM sp_append(p_log, p_log_new, p_log_session, p_log_parent,
                              p_log_parent_len, p_log_start, p_chains, p_datas, NULL, NULL);
        END IF;
    END IF;
"""
    + _COMMIT_TAIL
)
"""Schema version 5: ``sp_commit`` of a checkpoint that moves an existing head (an agent's
every checkpoint) runs the lease check inside the head's compare-and-set and appends its
messages in place, checking the row before them instead of reading the log's tip (a MAX):
measured in a server-side loop, ~25 % less server CPU per call."""


_DROP_V3_COMMIT = (
    "DROP FUNCTION IF EXISTS sp_commit(TEXT, TEXT, TEXT, TEXT, BYTEA, TEXT, BOOLEAN, TEXT, "
    "TEXT, TEXT, BIGINT, TEXT, BOOLEAN, TEXT, TEXT, BIGINT, BIGINT, BYTEA[], BYTEA[], BYTEA[], "
    "INTEGER[], BIGINT[], BYTEA[])"
)

MIGRATIONS: list[str] = [  # index = version - 1
    TABLES.format(t="sp_", blob="BYTEA"),
    TABLES_V2.format(t="sp_", blob="BYTEA"),
    TABLES_V3.format(t="sp_", blob="BYTEA"),
    TABLES_V4.format(t="sp_", blob="BYTEA").replace("ADD COLUMN", "ADD COLUMN IF NOT EXISTS")
    + ";"
    + _DROP_V3_COMMIT
    + ";"
    + FUNCTIONS,
    COMMIT_V5,
]
"""The functions are (re)created by the newest migration: version 4 gave ``sp_commit`` the
head's ``auth`` argument (dropping version 3's, whose signature differs)."""

# The two statements on the hot path (a checkpoint, a journal append) are sent straight
# through libpq (``PGconn.exec_params``, the GIL released while it waits) with their parameters
# already in PostgreSQL's binary format: psycopg's adaptation layer cost more client CPU than
# everything else in a commit (0.08 of 0.11 ms in a tight loop, more with cold caches), and
# 8 writers on 2 cores are bound by CPU. Unnamed statements only, so PgBouncer is fine.
_TEXT, _BYTEA, _BOOL, _INT4, _INT8 = 25, 17, 16, 23, 20
_BYTEA_ARRAY, _INT4_ARRAY, _INT8_ARRAY = 1001, 1007, 1016
_COMMIT_TYPES = (
    *(_TEXT, _TEXT, _TEXT, _TEXT, _BYTEA, _TEXT, _BOOL, _TEXT, _TEXT, _TEXT, _INT8),
    *(_TEXT, _BOOL, _TEXT, _TEXT, _INT8, _INT8, _BYTEA_ARRAY, _BYTEA_ARRAY),
    *(_BYTEA_ARRAY, _INT4_ARRAY, _INT8_ARRAY, _BYTEA_ARRAY, _TEXT),
)
_APPEND_TYPES = (_TEXT, _BOOL, _TEXT, _TEXT, _INT8, _INT8, _BYTEA_ARRAY, _BYTEA_ARRAY, _TEXT, _INT8)


def _placeholders(n: int) -> str:
    return ", ".join(f"${i}" for i in range(1, n + 1))


_COMMIT = f"SELECT sp_commit({_placeholders(len(_COMMIT_TYPES))})".encode()
_COMMIT_DEFERRED = (  # the same implicit transaction, committed without waiting for its flush
    _COMMIT + b", set_config('synchronous_commit', 'off', true)"
)
_APPEND = f"SELECT sp_append({_placeholders(len(_APPEND_TYPES))})".encode()
# A store-level value, read and set once per LangGraph put_writes (the saver's pending writes):
# through libpq as well, each one autocommit statement.
_GET_META = b"SELECT value FROM sp_meta WHERE key = $1"
_SET_META = (
    b"INSERT INTO sp_meta(key, value) VALUES ($1, $2) "
    b"ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING NULL::text"
)
_DELETE_META = b"DELETE FROM sp_meta WHERE key = $1 RETURNING NULL::text"
_KEY_TYPES, _KEY_VALUE_TYPES, _SWAP_TYPES = (_TEXT,), (_TEXT, _TEXT), (_TEXT, _TEXT, _TEXT)
# The swaps of swap_meta: a row comes back when it was done (its value compared as bytes, as
# text under the deterministic collations PostgreSQL compares with, and key is the primary key)
_ADD_META = (
    b"INSERT INTO sp_meta(key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING ''"
)
_SWAP_META = b"UPDATE sp_meta SET value = $3 WHERE key = $1 AND value = $2 RETURNING ''"
_DROP_META = b"DELETE FROM sp_meta WHERE key = $1 AND value = $2 RETURNING ''"

_ELEMENT = {_BYTEA_ARRAY: _BYTEA, _INT4_ARRAY: _INT4, _INT8_ARRAY: _INT8}
_I32, _I64 = struct.Struct("!i"), struct.Struct("!q")


def _binary(value: Any, oid: int, encoding: str) -> bytes | None:
    """One parameter in PostgreSQL's binary wire format (None: SQL NULL)."""
    if value is None:
        return None
    if oid == _TEXT:
        return str(value).encode(encoding)
    if oid == _BYTEA:
        return bytes(value)
    if oid == _BOOL:
        return b"\x01" if value else b"\x00"
    if oid == _INT8:
        return _I64.pack(value)
    if oid == _INT4:
        return _I32.pack(value)
    element = _ELEMENT[oid]  # a one-dimensional array without NULLs
    parts = [struct.pack("!iiiii", 1, 0, element, len(value), 1)]
    for item in value:
        data = _binary(item, element, encoding)
        assert data is not None
        parts.append(_I32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


_OUR_PARAMS = ("pool_max", "prepare")
CONNECT_TIMEOUT = 5
"""Seconds a connection attempt may take (libpq's ``connect_timeout``) unless the URL or
``$PGCONNECT_TIMEOUT`` says otherwise: a host that drops packets fails the open, not hangs."""
_RETRY = ("40P01", "40001")
"""Deadlock and serialization failure: the server rolled the transaction back, nothing was
written, and the same write may well succeed again (the session retries conflicts)."""
_NOT_PREPARED = ("26000", "0A000")
"""SQLSTATEs of a prepared statement the server does not have (a pooler moved us to another
server connection, ``DISCARD ALL``) or can no longer run as planned ("cached plan must not
change result type" after a migration): the statement did not run."""


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UsageError(
            "the PostgreSQL store needs psycopg: pip install 'stashpoint[postgres]'"
        ) from exc
    return psycopg


class PostgresStore(SqlStore):
    defers_commits = True
    param = "%s"
    prefix = "sp_"
    share = " FOR SHARE"  # a commit's epoch check waits for a GC condemning blobs

    lock = " FOR UPDATE"
    session_lock = "SELECT pg_advisory_xact_lock(21328, hashtext(?))"  # 21328: "SP"

    def __init__(self, url: str) -> None:
        super().__init__()
        psycopg = _driver()
        self.url = url
        conninfo, options = _split_url(url)
        self.durability = (
            "PostgreSQL WAL: durable commits as the server's synchronous_commit says; deferred "
            "ones with synchronous_commit=off until a flush commits synchronously"
        )
        self._errors = psycopg.errors
        self._psycopg = psycopg
        self._lock = threading.RLock()
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise UsageError(
                "the PostgreSQL store needs psycopg_pool: pip install 'stashpoint[postgres]'"
            ) from exc
        self._prepare = options.get("prepare", "true").lower() not in ("false", "0", "no", "off")
        self._names: dict[bytes, bytes] = {}
        self._prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
        try:
            size = int(options.get("pool_max", "4"))
        except ValueError:
            raise UsageError("pool_max in a PostgreSQL store URL must be a number") from None
        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
        if not _has_connect_timeout(psycopg, conninfo):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT
        self._probe(conninfo, kwargs)
        try:
            self._pool = ConnectionPool(
                conninfo,
                min_size=1,
                max_size=max(1, size),
                kwargs=kwargs,
                open=True,
                timeout=30.0,
            )
            self._pool.wait(timeout=30.0)
        except (psycopg.Error, Exception) as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {exc}") from exc
        self._migrate()

    def _probe(self, conninfo: str, kwargs: dict[str, Any]) -> None:
        """Connect once, directly, before the pool does: fail at once with the server's reason.

        Why: the pool retries a failed connection in the background with a growing backoff,
        logging each failure, until its wait times out. A missing database or a closed port
        cost 30 s and five logged errors before the one that said so; a direct connection
        fails at once (bounded by ``connect_timeout``, default CONNECT_TIMEOUT s), as the
        Redis store's ping does. Costs one extra connection per open that succeeds."""
        try:
            self._psycopg.connect(conninfo, **kwargs).close()
        except self._errors.Error as exc:
            reason = " ".join(str(exc).split())  # libpq's hint lines: one line
            raise StoreError(f"cannot connect to PostgreSQL: {reason}") from exc

    def _getconn(self) -> Any:
        try:
            return self._pool.getconn()
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg_pool"):  # timeout, closed pool
                raise StoreError(f"no PostgreSQL connection: {exc}") from exc
            raise

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled connection. Not ``pool.connection()``: its ``with conn`` only commits or
        rolls back, a no-op on these autocommit connections; ``putconn`` still discards a
        broken one and rolls back one left in a transaction."""
        conn = self._getconn()
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION under a lock, unless a plain read shows it there
        already: an application role with only read/write rights on the tables (no CREATE
        on the schema) opens an up-to-date store, and an open takes no lock."""
        try:
            rows = self._read("SELECT version FROM sp_version")
        except StoreError:
            rows = []  # no table yet (or no right to read it: the locked path says which)
        if rows and rows[0][0] == SCHEMA_VERSION:
            return
        if rows and rows[0][0] == V1_SCHEMA:
            self._read_as_v1()
            return

        def do(cur: Any) -> int:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            cur.execute("CREATE TABLE IF NOT EXISTS sp_version(version INTEGER NOT NULL)")
            cur.execute("SELECT version FROM sp_version")
            row = cur.fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"PostgreSQL store has schema version {version}; this stashpoint knows up "
                    f"to {SCHEMA_VERSION}: upgrade stashpoint"
                )
            # Format 1 (schema 3, or older: brought to 3 as its own version did) is read as it
            # is: schema 4 is part of `stashpoint upgrade` (.migrate), never of an open.
            # Schema 4 -> 5 is within format 2 (sp_commit's body) and is migrated here.
            target = V1_SCHEMA if 0 < version <= V1_SCHEMA else SCHEMA_VERSION
            for v in range(version, target):
                cur.execute(MIGRATIONS[v])
            if version == 0:
                cur.execute("INSERT INTO sp_version(version) VALUES (%s)", (target,))
            elif version < target:
                cur.execute("UPDATE sp_version SET version=%s", (target,))
            return max(version, target)

        if self._tx(do) < SCHEMA_VERSION:
            self._read_as_v1()

    def _read_as_v1(self) -> None:
        self.format_v1 = True
        self.ref_auth = False

    def _tx(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
                return fn(cur, *args)
        except self._errors.Error as exc:
            raise self._mapped(exc) from exc

    def _mapped(self, exc: Exception) -> Exception:
        state = getattr(exc, "sqlstate", None)
        text = str(exc).split("\n", 1)[0]
        if isinstance(exc, self._errors.UniqueViolation):
            return ConflictError(f"another writer got there first: {text}")
        if state in _RETRY:
            return ConflictError(f"{text}; PostgreSQL undid this write: try again")
        if state in ("SP001", "SP002"):
            return ConflictError(f"{text}; another writer checkpointed first")
        if state == "SP003":
            return GcEpochChanged(
                "a garbage collection began after this checkpoint checked which blobs exist; "
                "snapshot again"
            )
        if state == "SP004":
            return LeaseLost(f"{text}; this worker's write was refused")
        if state == "SP005":
            return LeaseHeld(f"{text}; stashpoint refuses writes from anyone else meanwhile")
        return StoreError(f"PostgreSQL failed: {text}")

    def _call(self, sql: str, args: Sequence[Any]) -> Any:
        """One statement in autocommit mode: one round trip, one implicit transaction."""
        try:
            with self._conn() as conn:
                row = conn.execute(sql, args).fetchone()
        except self._errors.Error as exc:
            raise self._mapped(exc) from exc
        return None if row is None else row[0]

    def _libpq_call(self, sql: bytes, types: Sequence[int], args: Sequence[Any]) -> str | None:
        """One hot-path statement through libpq with binary parameters: its one text value
        (None: SQL NULL, or no row)."""
        pq = self._psycopg.pq
        conn = self._getconn()  # not the _conn() context manager: ~5 us per checkpoint
        try:
            with conn.lock:
                encoding = conn.info.encoding
                values = [_binary(v, t, encoding) for v, t in zip(args, types, strict=True)]
                formats = [1] * len(values)
                res = None
                if self._prepare:
                    res = self._prepared_call(conn, sql, types, values, formats)
                if res is None:
                    res = conn.pgconn.exec_params(sql, values, types, formats, 0)
                if res.status != pq.ExecStatus.TUPLES_OK:
                    failed = self._errors.error_from_result(res, encoding=encoding)
                    raise self._mapped(failed) from failed
                value = res.get_value(0, 0) if res.ntuples else None
        except self._errors.Error as exc:  # the connection died while it idled in the pool
            raise self._mapped(exc) from exc
        finally:
            self._pool.putconn(conn)  # a broken connection is discarded and replaced
        return None if value is None else bytes(value).decode(encoding)

    def _prepared_call(
        self, conn: Any, sql: bytes, types: Sequence[int], values: list[Any], formats: list[int]
    ) -> Any:
        """The call as this connection's prepared statement, or None: run it unprepared.

        The name hashes the URL with the SQL: behind a pooler, a server connection may hold
        another store's statement of the same text, resolved under its search_path."""
        pq = self._psycopg.pq
        name = self._names.get(sql)
        if name is None:
            tag = hashlib.blake2b(self.url.encode() + b"\0" + sql, digest_size=8).hexdigest()
            name = self._names[sql] = f"stashpoint_{tag}".encode()
        with self._lock:  # one set per connection, the map shared by threads
            have = self._prepared.get(conn)
            if have is None:
                have = self._prepared[conn] = set()
        if name not in have:
            made = conn.pgconn.prepare(name, sql, types)
            if made.status != pq.ExecStatus.COMMAND_OK:
                if _sqlstate(made) == "42P05":  # a pooler's server connection has it already
                    self._prepare = False  # and the next may not: never again
                return None  # anything else (a broken connection) fails the plain call too
            have.add(name)
        res = conn.pgconn.exec_prepared(name, values, formats, 0)
        if res.status != pq.ExecStatus.TUPLES_OK and _sqlstate(res) in _NOT_PREPARED:
            self._prepare = False
            return None
        return res

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            with self._conn() as conn:
                return list(conn.execute(sql, args).fetchall())
        except self._errors.Error as exc:
            raise self._mapped(exc) from exc

    def _clock(self, cur: Any) -> float:
        (now,) = cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        return float(now)

    def commit(self, commit: Commit) -> None:
        c = commit
        r = c.row
        a = c.append
        fence = c.fence
        blobs = sorted(c.blobs, key=_digest)  # in one order for every writer: no deadlock
        epoch = self._libpq_call(
            _COMMIT if c.durable else _COMMIT_DEFERRED,
            _COMMIT_TYPES,
            (
                r.id,
                r.session,
                r.branch,
                r.parent,
                r.body,
                r.digest,
                c.move_head,
                c.expected_head,
                c.gc_epoch,
                None if fence is None else fence.session,
                None if fence is None else fence.token,
                *_append_args(a),
                [b.digest for b in blobs],
                [int(b.codec) for b in blobs],
                [b.size for b in blobs],
                [b.data for b in blobs],
                c.head_auth,
            ),
        )
        self.note_gc_epoch(str(epoch) if epoch is not None else "0")
        self.writers.end()

    def flush(self) -> None:
        """One synchronous commit that writes a commit record: PostgreSQL flushes its WAL up to
        that record, which covers every transaction committed before it, deferred or not."""
        self._call("SELECT pg_current_xact_id()::text", ())

    def append_log(self, append: LogAppend) -> None:
        fence = append.fence
        self._libpq_call(
            _APPEND,
            _APPEND_TYPES,
            (
                *_append_args(append),
                append.session if fence is None else fence.session,
                None if fence is None else fence.token,
            ),
        )

    def get_meta(self, key: str) -> str | None:
        return self._libpq_call(_GET_META, _KEY_TYPES, (key,))

    def set_meta(self, key: str, value: str | None) -> None:
        """One autocommit statement (its own implicit transaction), not BEGIN, the statement
        and COMMIT: the same single durable write in one round trip instead of three. Through
        libpq, prepared, as a commit does: for a row this small the round trips and psycopg's
        layer cost more CPU, client and server, than the row."""
        if value is None:
            self._libpq_call(_DELETE_META, _KEY_TYPES, (key,))
        else:
            self._libpq_call(_SET_META, _KEY_VALUE_TYPES, (key, value))

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        """One autocommit statement, as :meth:`set_meta`: the LangGraph saver swaps its
        pending writes at every ``put_writes`` (three per turn of a two-node graph), with no
        read before it unless another saver's swap got there first."""
        if expected is None and value is None:
            return self.get_meta(key) is None
        if expected is None:
            done = self._libpq_call(_ADD_META, _KEY_VALUE_TYPES, (key, value))
        elif value is None:
            done = self._libpq_call(_DROP_META, _KEY_VALUE_TYPES, (key, expected))
        else:
            done = self._libpq_call(_SWAP_META, _SWAP_TYPES, (key, expected, value))
        return done is not None

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
        self._pool.close()


def _sqlstate(res: Any) -> str | None:
    from psycopg.pq import DiagnosticField

    state = res.error_field(DiagnosticField.SQLSTATE)
    return None if state is None else bytes(state).decode()


def _append_args(a: LogAppend | None) -> tuple[Any, ...]:
    if a is None:
        return (None, False, None, None, None, None, [], [])
    new = a.new
    return (
        a.log,
        new is not None,
        None if new is None else new.session,
        None if new is None else new.parent,
        None if new is None else new.parent_len,
        a.start,
        [ch for ch, _ in a.messages],
        [data for _, data in a.messages],
    )


def _has_connect_timeout(psycopg: Any, conninfo: str) -> bool:
    """Whether the URL or the environment sets libpq's ``connect_timeout`` already."""
    from .. import config

    if config.value(config.PG_CONNECT_TIMEOUT):
        return True
    try:
        return "connect_timeout" in psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return False  # a malformed URL: the connection says so


def _split_url(url: str) -> tuple[str, dict[str, str]]:
    """The libpq URL without stashpoint's own query parameters, and those parameters."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OUR_PARAMS}
    rest = [(k, v) for k, v in query if k not in _OUR_PARAMS]
    # quote, not quote_plus: libpq decodes %20 but takes "+" literally ("-c a=1 -c b=2")
    return urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), ours
