"""Converting a backend's rows from store format 1 to 2 (:mod:`.formats`), crash-safely.

What changes: every head and label row gets its ``auth`` string (its sequence number, 1, and
in a keyed store its MAC), a keyed store gets its markers, and the format key is written. How
each backend makes that safe against a ``kill -9`` at any instant:

- SQLite and PostgreSQL: one transaction, schema change included (both run DDL inside a
  transaction), so the store is all v1 or all v2.
- Redis and the file store: one idempotent step per ref (a compare-and-set that leaves a ref
  moved meanwhile alone), the markers after them and the format key last. Until that last
  write the store opens as v1 (a ref already carrying an ``auth`` is read and checked like
  any other); running the upgrade again keeps what was done and finishes the rest. The file
  store writes its format key and layout version in one atomic batch.

The caller (:mod:`stashpoint.upgrade`) decides each ref's ``auth`` (:class:`Plan`); this
module only knows where the rows live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import metakeys
from ..errors import ConflictError, StoreError
from . import formats
from . import postgres as postgres_schema
from . import sqlite as sqlite_schema
from .base import MetadataStore

__all__ = ["Plan", "Ref", "convert", "refs_of"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Ref:
    kind: str  # "head" or "label"
    session: str
    name: str  # branch or label
    target: str  # checkpoint id
    auth: str | None


@dataclass
class Plan:
    """What the upgrade writes: ``sign(ref)`` is a ref's new ``auth`` (None: keep the one it
    has), ``meta`` the keys written after the refs and before the format key."""

    sign: Callable[[Ref], str | None]
    meta: list[tuple[str, str]] = field(default_factory=list)


def refs_of(backend: MetadataStore) -> list[Ref]:
    """Every head and label of a v1 backend, with the ``auth`` it has (an interrupted upgrade
    of a Redis or file store leaves some)."""
    reader = formats.FormatV1Store(backend)
    out: list[Ref] = []
    for session in backend.sessions():
        for branch, (target, auth) in reader.head_rows(session).items():
            out.append(Ref("head", session, branch, target, auth))
        for ident, (label, auth) in reader.label_rows(session).items():
            out.append(Ref("label", session, label, ident, auth))
    return out


def convert(backend: MetadataStore, plan: Plan, progress: Progress | None = None) -> int:
    """Bring ``backend`` to format 2 by ``plan``; the number of refs given an ``auth``."""
    from .sqlite import SqliteStore

    if isinstance(backend, SqliteStore):
        return _convert_sql(backend, plan, progress, postgres=False)
    if type(backend).__name__ == "PostgresStore":  # not imported: psycopg is an extra
        return _convert_sql(backend, plan, progress, postgres=True)
    return _convert_by_steps(backend, plan, progress)


# -- SQL: one transaction -------------------------------------------------------------------


def _convert_sql(store: Any, plan: Plan, progress: Progress | None, *, postgres: bool) -> int:
    def do(cur: Any) -> int:
        if postgres:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (postgres_schema._LOCK_KEY,))
            cur.execute("SELECT version FROM sp_version")
            version = int(cur.fetchone()[0])
        else:
            version = int(cur.execute("PRAGMA user_version").fetchone()[0])
        if version < 3:
            raise StoreError(f"store {store.url} has schema {version}, not format 1's (3)")
        # Format 1 is schema 3; a schema-4 store (written between the two formats) needs
        # only the later steps. Every step runs in this transaction, with the refs below.
        if postgres:
            for v in range(version, postgres_schema.SCHEMA_VERSION):
                cur.execute(postgres_schema.MIGRATIONS[v])
            cur.execute("UPDATE sp_version SET version=%s", (postgres_schema.SCHEMA_VERSION,))
        else:
            for v in range(version, sqlite_schema.SCHEMA_VERSION):
                for stmt in sqlite_schema.MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
            cur.execute(f"PRAGMA user_version={sqlite_schema.SCHEMA_VERSION}")
        q = store.sql
        heads = cur.execute(q("SELECT session, branch, checkpoint, auth FROM {t}heads")).fetchall()
        labels = cur.execute(q("SELECT session, label, checkpoint, auth FROM {t}labels")).fetchall()
        refs = [Ref("head", str(s), str(b), str(c), _opt(a)) for s, b, c, a in heads]
        refs += [Ref("label", str(s), str(lab), str(c), _opt(a)) for s, lab, c, a in labels]
        signed = 0
        for i, ref in enumerate(refs):
            auth = plan.sign(ref)
            if auth is not None:
                if ref.kind == "head":
                    cur.execute(
                        q("UPDATE {t}heads SET auth=? WHERE session=? AND branch=?"),
                        (auth, ref.session, ref.name),
                    )
                else:
                    cur.execute(
                        q("UPDATE {t}labels SET auth=? WHERE checkpoint=?"), (auth, ref.target)
                    )
                signed += 1
            if progress is not None:
                progress(i + 1, len(refs))
        for key, value in [*plan.meta, (metakeys.FORMAT, str(formats.CURRENT))]:
            cur.execute(
                q(
                    "INSERT INTO {t}meta(key, value) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value=excluded.value"
                ),
                (key, value),
            )
        return signed

    return int(store._tx(do))


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


# -- Redis, file store, memory: idempotent steps, the format key last -----------------------


def _convert_by_steps(backend: MetadataStore, plan: Plan, progress: Progress | None) -> int:
    refs = refs_of(backend)
    signed = 0
    for i, ref in enumerate(refs):
        auth = plan.sign(ref)
        if auth is not None:
            try:
                if ref.kind == "head":
                    # Compare-and-set on the head it has: a ref moved meanwhile is left alone
                    # (moved by a v1 program, it is signed by the next run).
                    backend.set_head(ref.session, ref.name, ref.target, ref.target, auth=auth)
                else:
                    backend.set_label(ref.target, ref.session, ref.name, auth)
            except ConflictError as exc:
                raise ConflictError(
                    f"{exc}; the store is being written by another program: stop it, then run "
                    "the upgrade again (what it did so far is kept)"
                ) from exc
            signed += 1
        if progress is not None:
            progress(i + 1, len(refs))
    for key, value in plan.meta:
        backend.set_meta(key, value)
    from .files import FileStore

    if isinstance(backend, FileStore):
        _finish_file_store(backend)
    else:
        backend.set_meta(metakeys.FORMAT, str(formats.CURRENT))
    return signed


def _finish_file_store(store: Any) -> None:
    """The format key and layout version 2 in one atomic write of ``meta.json``: a program
    that wrote layout 1 refuses the store from then on, never before."""
    from ._filedir import _pretty
    from .files import LAYOUT_VERSION

    with store._locked():
        meta = store._read_json("meta.json", {})
        meta[metakeys.FORMAT] = str(formats.CURRENT)
        meta["layout_version"] = str(LAYOUT_VERSION)
        store._apply({"meta.json": _pretty(meta)})
