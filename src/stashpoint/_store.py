"""The Store facade: opens backends from URLs and reads verified records out of them."""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._fsutil import sweep_temp_files
from .blobs.local import LocalBlobStore
from .blobs.objects import Blobs
from .errors import IntegrityError, NotFoundError, StoreError, UsageError
from .integrity import ChainHasher
from .model import Checkpoint
from .stores.base import CheckpointRow, MetadataStore

if TYPE_CHECKING:
    from .session import Session

__all__ = ["DEFAULT_DIR", "Store", "open_store"]

DEFAULT_DIR = ".stashpoint"
_DB_NAME = "store.db"


@dataclass(frozen=True)
class Problem:
    """One thing ``verify`` found wrong."""

    message: str
    checkpoint: str | None = None
    session: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "session": self.session, "message": self.message}


class Store:
    """Metadata rows + blobs + the integrity rules that bind them."""

    def __init__(
        self,
        meta: MetadataStore,
        *,
        blob_dir: Path | None = None,
        home: Path | None = None,
        key: bytes | None = None,
    ) -> None:
        self.meta = meta
        self.url = meta.url
        self.home = home
        """Local directory of the store (for caches and link files), if it has one."""
        self.blobs = Blobs(meta, LocalBlobStore(blob_dir) if blob_dir is not None else None)
        self.hasher = ChainHasher(key)
        store_id = meta.get_meta("store_id")
        if store_id is None:
            store_id = uuid.uuid4().hex
            meta.set_meta("store_id", store_id)
        self.id = store_id

    # -- sessions -------------------------------------------------------------------------
    def session(self, name: str = "main", **kwargs: Any) -> Session:
        """Open (or start) a session; see :class:`stashpoint.Session` for the options."""
        from .session import Session

        return Session(self, name, **kwargs)

    def sessions(self) -> list[str]:
        return self.meta.sessions()

    @property
    def gc_epoch(self) -> str:
        return self.meta.get_meta("gc_epoch") or "0"

    @property
    def cache_dir(self) -> Path | None:
        return self.home / "cache" if self.home is not None else None

    # -- verified reads -------------------------------------------------------------------
    def open_row(self, row: CheckpointRow) -> Checkpoint:
        cp = self.hasher.open(row.id, row.body, row.digest)
        if (cp.session, cp.branch, cp.parent) != (row.session, row.branch, row.parent):
            raise IntegrityError(
                f"checkpoint {row.id} is corrupt: its index columns disagree with its record",
                checkpoint=row.id,
            )
        return cp

    def get(self, ident: str, *, check_parent: bool = True) -> Checkpoint:
        """A verified checkpoint; with ``check_parent`` also its link in the hash chain."""
        row = self.meta.get_checkpoint(ident)
        if row is None:
            raise NotFoundError(f"no checkpoint {ident}")
        try:
            cp = self.open_row(row)
            if check_parent and cp.parent is not None:
                prow = self.meta.get_checkpoint(cp.parent)
                if prow is None:
                    raise IntegrityError(
                        f"checkpoint {ident} is broken: its parent {cp.parent} is missing",
                        checkpoint=ident,
                    )
                if prow.digest != cp.parent_digest:
                    raise IntegrityError(
                        f"checkpoint {ident} is broken: its parent {cp.parent} was altered",
                        checkpoint=ident,
                    )
        except IntegrityError as exc:
            raise self.with_last_good(exc, row) from None
        return cp

    def with_last_good(self, exc: IntegrityError, row: CheckpointRow) -> IntegrityError:
        """Name the newest intact ancestor in an integrity error, so callers can offer it."""
        if exc.last_good is None:
            exc.last_good = self.last_good(row)
            if exc.last_good:
                exc.args = (
                    f"{exc.args[0]}; the newest intact ancestor is {exc.last_good} "
                    f"(stashpoint rewind {exc.last_good})",
                )
        return exc

    def last_good(self, row: CheckpointRow) -> str | None:
        """Newest ancestor of a damaged record that still verifies (walking index columns)."""
        seen = 0
        parent = row.parent
        while parent is not None and seen < 10_000:
            prow = self.meta.get_checkpoint(parent)
            if prow is None:
                break  # the chain is cut: fall back to the newest record that verifies
            try:
                self.open_row(prow)
                return prow.id
            except IntegrityError:
                parent = prow.parent
                seen += 1
        for other in self.meta.list_checkpoints(row.session, before=row.id, limit=1000):
            if other.branch != row.branch:
                continue
            try:
                self.open_row(other)
                return other.id
            except IntegrityError:
                continue
        return None

    def resolve(self, ref: str, session: str | None = None) -> str:
        """Full id from an id, a unique id prefix or a label."""
        ref = ref.strip()
        if not ref:
            raise UsageError("empty checkpoint reference")
        if len(ref) == 26 and self.meta.get_checkpoint(ref.upper()) is not None:
            return ref.upper()
        if session is not None:
            for ident, label in self.meta.labels(session).items():
                if label == ref:
                    return ident
        if len(ref) >= 4:
            found = self.meta.find_ids(ref.upper(), session)
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise UsageError(f"checkpoint prefix {ref!r} is ambiguous: {', '.join(found)}")
        raise NotFoundError(f"no checkpoint matches {ref!r}")

    def close(self) -> None:
        self.meta.close()
        self.blobs.close()  # release the blob directory's lock: a GC may hold it alone now

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(url: str | os.PathLike[str] | None = None, *, key: bytes | None = None) -> Store:
    """Open a store by URL or path; default ``./.stashpoint`` (SQLite + local blobs).

    Accepted: a directory path, ``sqlite:///path/to/dir`` (or ``…/file.db``), ``memory://``,
    ``postgresql://user@host/db`` (``pip install 'stashpoint[postgres]'``),
    ``redis://host:6379/0?prefix=sp:`` (``pip install 'stashpoint[redis]'``).
    """
    text = os.fspath(url) if url is not None else DEFAULT_DIR
    if text.startswith("memory://"):
        from .stores.memory import MemoryStore

        return Store(MemoryStore(), key=key)
    if text.startswith(("postgresql://", "postgres://")):
        from .stores.postgres import PostgresStore

        return Store(PostgresStore(text), key=key)  # blobs in the database: shared by all
    if text.startswith(("redis://", "rediss://", "unix://")):
        from .stores.redis import RedisStore

        return Store(RedisStore(text), key=key)
    if text.startswith("sqlite://"):
        text = text[len("sqlite://") :] or DEFAULT_DIR  # sqlite:///abs/path -> /abs/path
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise UsageError(
            f"unsupported store URL scheme {scheme!r}: this build knows sqlite:// (default, "
            "or a plain path), postgresql://, redis:// and memory://"
        )
    path = Path(text).expanduser()
    from .stores.sqlite import SqliteStore

    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        db, home = path, path.parent / (path.name + ".d")
    else:
        db, home = path / _DB_NAME, path
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Cheap places only; `verify` sweeps the whole blob directory.
        sweep_temp_files(home, recursive=False)
        sweep_temp_files(home / "cache", recursive=False)
        sweep_temp_files(home / "blobs" / "packs", recursive=False)
    except OSError as exc:
        raise StoreError(f"cannot open store directory {home}: {exc.strerror}") from exc
    return Store(SqliteStore(db), blob_dir=home / "blobs", home=home.resolve(), key=key)


def config_hash(config: Any) -> str | None:
    if config is None:
        return None
    import msgspec

    from .serde import to_tree

    data = msgspec.json.encode(to_tree(config), order="sorted")
    return hashlib.sha256(data).hexdigest()
