"""What the SQL backends share: statements, the atomic commit, and row mapping.

SQLite and PostgreSQL run the same SQL (both understand ``INSERT … ON CONFLICT``); a backend
only says how to connect, how to run a transaction and how to map its driver's errors, plus its
parameter marker and table prefix. Statements are written with ``?`` and ``{t}`` and rendered
once per backend.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ConflictError, LeaseHeld, PrunedError
from .base import (
    GC_EPOCH_KEY,
    BlobInfo,
    BlobRow,
    CheckpointRow,
    Commit,
    Fence,
    GcEpochChanged,
    LeaseInfo,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
    grant_lease,
    lease_held,
    lease_lost,
)

__all__ = ["TABLES", "TABLES_V2", "TABLES_V3", "TABLES_V4", "SqlStore"]

TABLES = """
CREATE TABLE IF NOT EXISTS {t}meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS {t}blobs(
    digest {blob} PRIMARY KEY, codec INTEGER NOT NULL, size BIGINT NOT NULL,
    data {blob} NOT NULL);
CREATE TABLE IF NOT EXISTS {t}logs(
    id TEXT PRIMARY KEY, session TEXT NOT NULL, parent TEXT, parent_len BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS {t}messages(
    log TEXT NOT NULL, idx BIGINT NOT NULL, chain {blob} NOT NULL, data {blob} NOT NULL,
    PRIMARY KEY (log, idx));
CREATE TABLE IF NOT EXISTS {t}checkpoints(
    id TEXT PRIMARY KEY, session TEXT NOT NULL, branch TEXT NOT NULL, parent TEXT,
    body {blob} NOT NULL, digest TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS {t}checkpoints_by_session ON {t}checkpoints(session, id);
CREATE TABLE IF NOT EXISTS {t}heads(
    session TEXT NOT NULL, branch TEXT NOT NULL, checkpoint TEXT NOT NULL,
    PRIMARY KEY (session, branch));
CREATE TABLE IF NOT EXISTS {t}labels(
    checkpoint TEXT PRIMARY KEY, session TEXT NOT NULL, label TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS {t}labels_by_session ON {t}labels(session)
"""
"""Schema version 1. A log's tip is not stored: it is its last message row (MAX(idx) + 1),
so appending writes no counter row (one page fewer per checkpoint)."""

TABLES_V2 = """
CREATE TABLE IF NOT EXISTS {t}pruned(
    checkpoint TEXT PRIMARY KEY, session TEXT NOT NULL, at TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS {t}pruned_by_session ON {t}pruned(session);
CREATE TABLE IF NOT EXISTS {t}condemned(digest {blob} PRIMARY KEY, at DOUBLE PRECISION NOT NULL);
INSERT INTO {t}meta(key, value) VALUES ('gc_epoch', '0') ON CONFLICT (key) DO NOTHING
"""
"""Schema version 2: retention marks beside the records (the records themselves must stay
byte-identical for the hash chain) and GC's condemned blobs. The ``gc_epoch`` row exists from
the start so that a commit's epoch check always has a row to lock."""

TABLES_V3 = """
CREATE TABLE IF NOT EXISTS {t}leases(
    session TEXT PRIMARY KEY, owner TEXT NOT NULL, token BIGINT NOT NULL,
    expires DOUBLE PRECISION NOT NULL)
"""
"""Schema version 3: session leases. A released or expired lease keeps its row, so tokens only
ever grow and a fenced-off worker can never be confused with a later holder."""

TABLES_V4 = """
ALTER TABLE {t}heads ADD COLUMN auth TEXT;
ALTER TABLE {t}labels ADD COLUMN auth TEXT
"""
"""Schema version 4: each head and label row carries its sequence number and MAC (``auth``,
:mod:`stashpoint.stores.refauth`) on the same row, so a checkpoint writes no extra row. NULL:
written before version 4 (a legacy, unauthenticated ref)."""

_BATCH = 500

_CP_COLUMNS = "id, session, branch, parent, body, digest"
_LOG_SELECT = (
    "SELECT id, session, parent, parent_len, "
    "(SELECT MAX(idx) + 1 FROM {t}messages m WHERE m.log = l.id) FROM {t}logs l"
)


class SqlStore(MetadataStore):
    """Every MetadataStore operation in SQL; subclasses supply the connection."""

    param = "?"
    prefix = ""
    format_v1: bool | None = False  # a subclass that opened a schema-3 store says so

    def sql(self, text: str) -> str:
        return text.replace("{t}", self.prefix).replace("?", self.param)

    @abstractmethod
    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """Rows of one read-only statement (already rendered)."""

    @abstractmethod
    def _tx(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(cursor, *args)`` in one write transaction; unique violations -> conflict."""

    def _q(self, text: str, args: Sequence[Any] = ()) -> list[Any]:
        return self._read(self.sql(text), args)

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._q("SELECT value FROM {t}meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str | None) -> None:
        if value is None:
            self._tx(self._exec, "DELETE FROM {t}meta WHERE key=?", (key,))
        else:
            self._tx(
                self._exec,
                "INSERT INTO {t}meta(key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                (key, value),
            )

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        if expected is None and value is None:
            return self.get_meta(key) is None
        if expected is None:
            text = "INSERT INTO {t}meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
            args: tuple[str, ...] = (key, str(value))
        elif value is None:
            text, args = "DELETE FROM {t}meta WHERE key=? AND value=?", (key, expected)
        else:
            text = "UPDATE {t}meta SET value=? WHERE key=? AND value=?"
            args = (value, key, expected)
        return bool(self._tx(self._count, text, args) == 1)

    def _exec(self, cur: Any, text: str, args: Sequence[Any]) -> None:
        cur.execute(self.sql(text), args)

    def _count(self, cur: Any, text: str, args: Sequence[Any]) -> int:
        """Rows the statement changed."""
        return int(cur.execute(self.sql(text), args).rowcount)

    # -- blobs ----------------------------------------------------------------------------
    def _digest_params(self, digests: list[bytes]) -> Sequence[Any]:
        """Digests as query parameters (a driver may bind another type faster)."""
        return digests

    def _insert_blob_rows(self, cur: Any, blobs: Sequence[BlobRow]) -> None:
        """Insert rows (digest order), leaving a digest stored already as it is."""
        cur.executemany(
            self.sql(
                "INSERT INTO {t}blobs(digest, codec, size, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (digest) DO NOTHING"
            ),
            [tuple(b) for b in blobs],
        )

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        found: set[bytes] = set()
        for i in range(0, len(wanted), 500):
            batch = self._digest_params(wanted[i : i + 500])
            marks = ",".join("?" * len(batch))
            rows = self._q(
                f"SELECT digest FROM {{t}}blobs b WHERE digest IN ({marks}) AND NOT EXISTS "
                "(SELECT 1 FROM {t}condemned c WHERE c.digest = b.digest)",
                batch,
            )
            found.update(bytes(r[0]) for r in rows)
        return found

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        if blobs:
            self._tx(self._insert_blobs, blobs)

    def _insert_blobs(self, cur: Any, blobs: Sequence[BlobRow]) -> None:
        """Insert blobs and revive them: marks go first, so a GC claiming the same marks
        either waits for us (and finds none) or has deleted the row we then insert.

        In digest order: two writers storing the same new blobs in different orders would
        each wait for a row the other inserted (PostgreSQL: a deadlock, one write lost)."""
        blobs = sorted(blobs, key=_digest)
        if cur.execute(self.sql("SELECT 1 FROM {t}condemned LIMIT 1")).fetchone():
            cur.executemany(
                self.sql("DELETE FROM {t}condemned WHERE digest=?"),
                [(d,) for d in self._digest_params([b.digest for b in blobs])],
            )
        self._insert_blob_rows(cur, blobs)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        rows = self._q("SELECT digest, codec, size, data FROM {t}blobs WHERE digest=?", (digest,))
        if not rows:
            return None
        d, codec, size, data = rows[0]
        return BlobRow(bytes(d), int(codec), int(size), bytes(data))

    def get_blobs(self, digests: Sequence[bytes]) -> dict[bytes, BlobRow]:
        out: dict[bytes, BlobRow] = {}
        wanted = list(dict.fromkeys(digests))
        for i in range(0, len(wanted), _BATCH):
            batch = wanted[i : i + _BATCH]
            marks = ",".join("?" * len(batch))
            rows = self._q(
                f"SELECT digest, codec, size, data FROM {{t}}blobs WHERE digest IN ({marks})", batch
            )
            for d, codec, size, data in rows:
                out[bytes(d)] = BlobRow(bytes(d), int(codec), int(size), bytes(data))
        return out

    def iter_blob_digests(self) -> Iterator[bytes]:
        for (d,) in self._q("SELECT digest FROM {t}blobs"):
            yield bytes(d)

    # -- logs -----------------------------------------------------------------------------
    def log_info(self, log: str) -> LogInfo | None:
        rows = self._q(_LOG_SELECT + " WHERE id=?", (log,))
        return _log_info(rows[0])[1] if rows else None

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        rows = self._q(
            "SELECT idx, chain, data FROM {t}messages WHERE log=? AND idx>=? AND idx<? "
            "ORDER BY idx",
            (log, start, stop),
        )
        return [MessageRow(int(i), bytes(c), bytes(d)) for i, c, d in rows]

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        for row in self._q(_LOG_SELECT):
            yield _log_info(row)

    def append_log(self, append: LogAppend) -> None:
        self._tx(self._append, append)

    def _append(self, cur: Any, a: LogAppend) -> None:
        """Create the log if new, check its tip (compare-and-set), insert the entries."""
        if a.fence is not None or a.session is not None:
            self._check_fence(cur, a.fence, a.fence.session if a.fence else str(a.session))
        if a.new is not None:
            cur.execute(
                self.sql(
                    "INSERT INTO {t}logs(id, session, parent, parent_len) VALUES (?, ?, ?, ?)"
                ),
                (a.log, a.new.session, a.new.parent, a.new.parent_len),
            )
        (tip,) = cur.execute(
            self.sql(
                "SELECT COALESCE((SELECT MAX(idx) + 1 FROM {t}messages WHERE log=?), "
                "(SELECT parent_len FROM {t}logs WHERE id=?))"
            ),
            (a.log, a.log),
        ).fetchone()
        if tip != a.start:
            raise ConflictError(f"log {a.log} grew under us; another writer appended first")
        cur.executemany(
            self.sql("INSERT INTO {t}messages(log, idx, chain, data) VALUES (?, ?, ?, ?)"),
            [(a.log, a.start + i, ch, data) for i, (ch, data) in enumerate(a.messages)],
        )

    # -- checkpoints ----------------------------------------------------------------------
    share = ""
    """Row-lock clause for reading ``gc_epoch`` in a commit (PostgreSQL: `` FOR SHARE``)."""

    def commit(self, commit: Commit) -> None:
        self._tx(self._apply_commit, commit)
        self.writers.end()

    def _apply_commit(self, cur: Any, c: Commit) -> None:
        """Epoch fence, head compare-and-set, log-tip check and every insert, in the caller's
        transaction."""
        row = c.row
        self._check_fence(cur, c.fence, row.session)
        if c.gc_epoch is not None:
            self._check_gc_epoch(cur, c.gc_epoch, row.id)
        if c.move_head and not self._move_head(
            cur, row.session, row.branch, row.id, c.expected_head, c.head_auth
        ):
            raise ConflictError(
                f"branch {row.branch!r} of session {row.session!r} moved; "
                "another writer checkpointed first"
            )
        if c.append is not None:
            self._append(cur, replace(c.append, fence=None) if c.fence else c.append)
        if c.blobs:
            self._insert_blobs(cur, c.blobs)
        cur.execute(
            self.sql(f"INSERT INTO {{t}}checkpoints({_CP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"),
            tuple(row),
        )

    def _check_gc_epoch(self, cur: Any, epoch: str, ident: str) -> None:
        got = cur.execute(
            self.sql("SELECT value FROM {t}meta WHERE key=?" + self.share), (GC_EPOCH_KEY,)
        ).fetchone()
        if (str(got[0]) if got else "0") != epoch:
            raise GcEpochChanged(
                f"a garbage collection began after checkpoint {ident} checked which blobs "
                "exist; snapshot again"
            )

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        rows = self._q(f"SELECT {_CP_COLUMNS} FROM {{t}}checkpoints WHERE id=?", (ident,))
        return _checkpoint_row(rows[0]) if rows else None

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        text = f"SELECT {_CP_COLUMNS} FROM {{t}}checkpoints WHERE session=?"
        args: list[Any] = [session]
        if before is not None:
            text += " AND id<?"
            args.append(before)
        text += " ORDER BY id DESC"
        if limit is not None:
            text += " LIMIT ?"
            args.append(limit)
        return [_checkpoint_row(r) for r in self._q(text, args)]

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        # Ids are [0-9A-Z]: every id with this prefix sorts between it and prefix + "~".
        hi = prefix + "~"
        if session is None:
            rows = self._q(
                "SELECT id FROM {t}checkpoints WHERE id>=? AND id<? ORDER BY id LIMIT 5",
                (prefix, hi),
            )
        else:
            rows = self._q(
                "SELECT id FROM {t}checkpoints WHERE session=? AND id>=? AND id<? "
                "ORDER BY id LIMIT 5",
                (session, prefix, hi),
            )
        return [str(r[0]) for r in rows]

    def sessions(self) -> list[str]:
        return [str(r[0]) for r in self._q("SELECT DISTINCT session FROM {t}heads ORDER BY 1")]

    # -- heads and labels -----------------------------------------------------------------
    def branches(self, session: str) -> dict[str, str]:
        rows = self._q("SELECT branch, checkpoint FROM {t}heads WHERE session=?", (session,))
        return {str(b): str(c) for b, c in rows}

    def get_head(self, session: str, branch: str) -> str | None:
        rows = self._q(
            "SELECT checkpoint FROM {t}heads WHERE session=? AND branch=?", (session, branch)
        )
        return str(rows[0][0]) if rows else None

    ref_auth = True

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        rows = self._q("SELECT branch, checkpoint, auth FROM {t}heads WHERE session=?", (session,))
        return {str(b): (str(c), None if a is None else str(a)) for b, c, a in rows}

    def head_row(self, session: str, branch: str) -> tuple[str, str | None] | None:
        rows = self._q(
            "SELECT checkpoint, auth FROM {t}heads WHERE session=? AND branch=?", (session, branch)
        )
        if not rows:
            return None
        return str(rows[0][0]), None if rows[0][1] is None else str(rows[0][1])

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
        def do(cur: Any) -> None:
            self._check_fence(cur, fence, session)
            self._hold_session(cur, session)
            got = cur.execute(
                self.sql("SELECT at FROM {t}pruned WHERE checkpoint=?"), (new,)
            ).fetchone()
            if got is not None:  # checked by the engine before, but retention may run between
                raise PrunedError(new, str(got[0]))
            if not self._move_head(cur, session, branch, new, expected, auth):
                raise ConflictError(
                    f"branch {branch!r} of session {session!r} moved (expected {expected}); "
                    "another writer got there first"
                )

        self._tx(do)

    def _move_head(
        self,
        cur: Any,
        session: str,
        branch: str,
        new: str,
        expected: str | None,
        auth: str | None = None,
    ) -> bool:
        """The compare-and-set is the statement's own condition: no read-then-write race."""
        if expected is None:
            res = cur.execute(
                self.sql(
                    "INSERT INTO {t}heads(session, branch, checkpoint, auth) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT DO NOTHING"
                ),
                (session, branch, new, auth),
            )
        else:
            res = cur.execute(
                self.sql(
                    "UPDATE {t}heads SET checkpoint=?, auth=? "
                    "WHERE session=? AND branch=? AND checkpoint=?"
                ),
                (new, auth, session, branch, expected),
            )
        return bool(res.rowcount == 1)

    # -- leases ---------------------------------------------------------------------------
    lock = ""
    """Row-lock clause for reading a lease before changing it (PostgreSQL: `` FOR UPDATE``)."""

    def _clock(self, cur: Any) -> float:
        """Seconds since the epoch by the store's clock (SQLite: this machine's)."""
        return time.time()

    def _check_fence(self, cur: Any, fence: Fence | None, session: str) -> None:
        """In the write's own transaction; the shared row lock makes a takeover wait for it.

        Without a fence, the write is refused while another worker holds a live lease on the
        session: a lease means one writer, also against a stray ``stashpoint snap``."""
        got = cur.execute(
            self.sql("SELECT owner, token, expires FROM {t}leases WHERE session=?" + self.share),
            (session if fence is None else fence.session,),
        ).fetchone()
        if fence is not None:
            if got is None or int(got[1]) != fence.token:
                raise lease_lost(fence, None if got is None else int(got[1]))
        elif got is not None:
            left = float(got[2]) - self._clock(cur)
            if left > 0:
                raise lease_held(session, str(got[0]), left)

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        def do(cur: Any) -> LeaseInfo:
            now = self._clock(cur)
            got = cur.execute(
                self.sql("SELECT owner, token, expires FROM {t}leases WHERE session=?" + self.lock),
                (session,),
            ).fetchone()
            current = None if got is None else (str(got[0]), int(got[1]), float(got[2]))
            owner_, token, expires = grant_lease(session, current, owner, ttl, now)
            res = cur.execute(
                self.sql(
                    "INSERT INTO {t}leases(session, owner, token, expires) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (session) DO UPDATE SET owner=excluded.owner, "
                    "token=excluded.token, expires=excluded.expires "
                    "WHERE {t}leases.token = ?"
                ),
                (session, owner_, token, expires, -1 if current is None else current[1]),
            )
            if res.rowcount != 1:  # another worker inserted the first row meanwhile
                raise LeaseHeld(f"session {session!r} was just leased by another worker")
            return LeaseInfo(session, owner_, token, ttl)

        return self._tx(do)  # type: ignore[no-any-return]

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        def do(cur: Any) -> bool:
            now = self._clock(cur)
            res = cur.execute(
                self.sql(
                    "UPDATE {t}leases SET expires=? WHERE session=? AND token=? AND expires <> 0"
                ),  # 0: released; a late renewal must not revive it
                (now + ttl, fence.session, fence.token),
            )
            return bool(res.rowcount == 1)

        return self._tx(do)  # type: ignore[no-any-return]

    def release_lease(self, fence: Fence) -> None:
        def do(cur: Any) -> None:
            cur.execute(
                self.sql("UPDATE {t}leases SET expires=0 WHERE session=? AND token=?"),
                (fence.session, fence.token),
            )

        self._tx(do)

    def lease_info(self, session: str) -> LeaseInfo | None:
        def do(cur: Any) -> LeaseInfo | None:
            now = self._clock(cur)
            got = cur.execute(
                self.sql("SELECT owner, token, expires FROM {t}leases WHERE session=?"),
                (session,),
            ).fetchone()
            if got is None:
                return None
            return LeaseInfo(session, str(got[0]), int(got[1]), float(got[2]) - now)

        return self._tx(do)  # type: ignore[no-any-return]

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        if label is None:
            self._tx(self._exec, "DELETE FROM {t}labels WHERE checkpoint=?", (ident,))
            return

        def do(cur: Any) -> None:
            self._hold_session(cur, session)  # a prune's label check sees this label or none
            cur.execute(
                self.sql(
                    "INSERT INTO {t}labels(checkpoint, session, label, auth) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (checkpoint) "
                    "DO UPDATE SET label=excluded.label, auth=excluded.auth"
                ),
                (ident, session, label, auth),
            )

        self._tx(do)

    def labels(self, session: str) -> dict[str, str]:
        rows = self._q("SELECT checkpoint, label FROM {t}labels WHERE session=?", (session,))
        return {str(c): str(label) for c, label in rows}

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        rows = self._q("SELECT checkpoint, label, auth FROM {t}labels WHERE session=?", (session,))
        return {str(c): (str(lab), None if a is None else str(a)) for c, lab, a in rows}

    # -- maintenance ----------------------------------------------------------------------
    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        for r in self._q(f"SELECT {_CP_COLUMNS} FROM {{t}}checkpoints ORDER BY id"):
            yield _checkpoint_row(r)

    bytewise_keys = False
    """Whether text keys sort by code point (SQLite's BINARY collation): then a prefix is a
    range of the primary key, read through its index. PostgreSQL's collation may not be."""

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        where = "substr(key, 1, ?) = ?"
        args: list[Any] = [len(prefix), prefix]
        if self.bytewise_keys and prefix:  # an index range, not a scan of every key
            where = "key >= ? AND key < ? AND " + where
            args = [prefix, prefix + "\U0010ffff", *args]
        rows = self._q(f"SELECT key, value FROM {{t}}meta WHERE {where} ORDER BY key", args)
        for k, v in rows:
            yield str(k), str(v)

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        rows = self._q(
            "SELECT digest, codec, size, length(data), "
            "CASE WHEN codec IN (2, 3) THEN data END FROM {t}blobs"
        )
        for d, codec, size, stored, ref in rows:
            yield BlobInfo(
                bytes(d), int(codec), int(size), int(stored), None if ref is None else bytes(ref)
            )

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        rows = self._q(
            "SELECT log, COUNT(*), SUM(length(data) + length(chain)) FROM {t}messages GROUP BY log"
        )
        return {str(log): (int(n), int(b or 0)) for log, n, b in rows}

    session_lock = ""
    """A statement that serialises, per session, head moves to existing checkpoints with
    retention's marks (``?``: the session). SQLite needs none: its write transactions run
    one at a time. PostgreSQL's READ COMMITTED would otherwise let a head move commit
    between :meth:`mark_pruned`'s check of the heads and its insert (a pruned head, whose
    contents GC then frees), or between :meth:`set_head`'s check of the marks and its move."""

    def _hold_session(self, cur: Any, session: str) -> None:
        if self.session_lock:
            cur.execute(self.sql(self.session_lock), (session,))

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        def do(cur: Any) -> list[str]:
            self._check_fence(cur, None, session)  # a leased session is its holder's to change
            self._hold_session(cur, session)
            done = []
            stmt = self.sql(
                "INSERT INTO {t}pruned(checkpoint, session, at) SELECT ?, ?, ? "
                "WHERE EXISTS (SELECT 1 FROM {t}checkpoints WHERE id=? AND session=?) "
                "AND NOT EXISTS (SELECT 1 FROM {t}heads WHERE session=? AND checkpoint=?) "
                "AND NOT EXISTS (SELECT 1 FROM {t}labels WHERE checkpoint=?) "
                "ON CONFLICT (checkpoint) DO NOTHING"
            )
            for ident in ids:
                args = (ident, session, at, ident, session, session, ident, ident)
                res = cur.execute(stmt, args)
                if res.rowcount == 1:
                    done.append(ident)
            return done

        return self._tx(do)  # type: ignore[no-any-return]

    def pruned(self, session: str) -> dict[str, str]:
        rows = self._q("SELECT checkpoint, at FROM {t}pruned WHERE session=?", (session,))
        return {str(c): str(a) for c, a in rows}

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        def do(cur: Any) -> None:
            cur.executemany(
                self.sql(
                    "INSERT INTO {t}condemned(digest, at) VALUES (?, ?) "
                    "ON CONFLICT (digest) DO NOTHING"
                ),
                [(d, at) for d in digests],
            )
            if epoch is not None:
                cur.execute(
                    self.sql(
                        "INSERT INTO {t}meta(key, value) VALUES (?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET value=excluded.value"
                    ),
                    (GC_EPOCH_KEY, epoch),
                )

        self._tx(do)

    def condemned(self) -> dict[bytes, float]:
        return {bytes(d): float(a) for d, a in self._q("SELECT digest, at FROM {t}condemned")}

    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        found: set[bytes] = set()
        for i in range(0, len(wanted), _BATCH):
            batch = wanted[i : i + _BATCH]
            marks = ",".join("?" * len(batch))
            rows = self._q(f"SELECT digest FROM {{t}}condemned WHERE digest IN ({marks})", batch)
            found.update(bytes(r[0]) for r in rows)
        return found

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        def do(cur: Any) -> set[bytes]:
            out: set[bytes] = set()
            for i in range(0, len(digests), _BATCH):
                batch = list(digests[i : i + _BATCH])
                marks = ",".join("?" * len(batch))
                rows = cur.execute(
                    self.sql(
                        f"DELETE FROM {{t}}condemned WHERE digest IN ({marks}) RETURNING digest"
                    ),
                    batch,
                ).fetchall()
                out.update(bytes(r[0]) for r in rows)
            return out

        return self._tx(do) if digests else set()

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        def do(cur: Any) -> list[bytes]:
            claimed: list[bytes] = []
            for i in range(0, len(digests), _BATCH):
                batch = list(digests[i : i + _BATCH])
                marks = ",".join("?" * len(batch))
                rows = cur.execute(
                    self.sql(
                        f"DELETE FROM {{t}}condemned WHERE at <= ? AND digest IN ({marks}) "
                        "RETURNING digest"
                    ),
                    [before, *batch],
                ).fetchall()
                got = [bytes(r[0]) for r in rows]
                if got:
                    marks = ",".join("?" * len(got))
                    cur.execute(self.sql(f"DELETE FROM {{t}}blobs WHERE digest IN ({marks})"), got)
                claimed += got
            if unlink is not None and claimed:
                unlink(claimed)  # inside the transaction: a reviver waits for our commit
            return claimed

        return self._tx(do) if digests else []

    def delete_logs(self, logs: Sequence[str]) -> None:
        def do(cur: Any) -> None:
            for log in logs:
                cur.execute(self.sql("DELETE FROM {t}messages WHERE log=?"), (log,))
                cur.execute(self.sql("DELETE FROM {t}logs WHERE id=?"), (log,))

        if logs:
            self._tx(do)

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        def do(cur: Any) -> int:
            moved = 0
            stmt = self.sql("UPDATE {t}blobs SET data=? WHERE digest=? AND data=?")
            for digest, old, new in changes:
                moved += cur.execute(stmt, (new, digest, old)).rowcount
            return moved

        return self._tx(do) if changes else 0


def _digest(blob: BlobRow) -> bytes:
    return blob.digest


def _checkpoint_row(r: Any) -> CheckpointRow:
    i, s, b, p, body, digest = r
    parent = None if p is None else str(p)
    return CheckpointRow(str(i), str(s), str(b), parent, bytes(body), str(digest))


def _log_info(r: Any) -> tuple[str, LogInfo]:
    ident, session, parent, parent_len, tip = r
    length = int(parent_len) if tip is None else int(tip)
    return str(ident), LogInfo(str(session), parent, int(parent_len), length)
