"""The Store facade: opens backends from URLs and reads verified records out of them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .blobs.backend import BlobBackend
from .blobs.local import LocalBlobStore
from .blobs.objects import Blobs
from .durability import DURABILITY_META, Durability, GroupCommit, resolve
from .errors import IntegrityError, NotFoundError, StoreError, UsageError
from .integrity import ChainHasher
from .model import Checkpoint
from .stores.base import CheckpointRow, MetadataStore
from .stores.registry import get_backend, ignore_store_dir
from .urls import DEFAULT_DIR, parse_store_url

if TYPE_CHECKING:
    from .crypto import Cipher
    from .lease import Lease
    from .session import Session

__all__ = ["DEFAULT_DIR", "Store", "ignore_store_dir", "open_store"]

ENCRYPTION_META = "encryption"
"""Store meta key marking an encrypted store: cipher, KDF and key id (never the key)."""


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
        blob_store: BlobBackend | None = None,
        encryption_key: bytes | None = None,
        durability: Durability | str | None = None,
    ) -> None:
        self.url = meta.url
        try:
            self.durability = resolve(durability, meta.get_meta(DURABILITY_META))
            """Default level of this store's sessions (:mod:`stashpoint.durability`)."""
        except BaseException:
            meta.close()
            raise
        if blob_store is None and blob_dir is not None:
            blob_store = LocalBlobStore(blob_dir)  # its shared lock first: see _check_encryption
        try:
            self.cipher = _check_encryption(meta, encryption_key, blob_store)
        except BaseException:
            meta.close()  # refused: do not leak the backend's connection
            if isinstance(blob_store, LocalBlobStore):
                blob_store.close()
            raise
        """AES-GCM cipher when the store is encrypted (:mod:`stashpoint.crypto`), else None."""
        if self.cipher is not None:
            from .stores.encrypted import EncryptedLogs

            meta = EncryptedLogs(meta, self.cipher)
            key = key if key is not None else self.cipher.mac_key
        self.meta = meta
        self.group = GroupCommit(meta)
        """Flushes deferred commits on their levels' schedules; shared by this store's sessions."""
        self.wrote = False
        self.upkeep_on_close = True
        """Run automatic upkeep, when due, as this object closes (agent hooks hand it to a
        process of its own instead: :mod:`stashpoint.cli.hooks`)."""
        """Whether a session committed through this object (then closing checks upkeep)."""
        self.closed = False
        self.home = home
        """Local directory of the store (for caches and link files), if it has one."""
        self.own_paths: tuple[Path, ...] = (home,) if home is not None else ()
        """Files and directories of the store itself: never part of a workspace snapshot
        (a workspace may hold its store; restoring an old copy over it would wipe it)."""
        self.blobs = Blobs(meta, blob_store, cipher=self.cipher)
        self.hasher = ChainHasher(key, self.cipher)
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

    def lease(
        self,
        session: str,
        *,
        ttl: float = 30.0,
        owner: str | None = None,
        wait: float = 0.0,
    ) -> Lease:
        """Own ``session`` across workers (renewed in the background); pass it to
        :meth:`session` as ``lease=``. See :mod:`stashpoint.lease`."""
        from .lease import acquire

        return acquire(self.meta, session, ttl=ttl, owner=owner, wait=wait)

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
            named = sorted(i for i, label in self.meta.labels(session).items() if label == ref)
            if named:
                return named[-1]  # the newest, should a store hold one label twice
        if len(ref) >= 4:
            found = self.meta.find_ids(ref.upper(), session)
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise UsageError(f"checkpoint prefix {ref!r} is ambiguous: {', '.join(found)}")
        raise NotFoundError(f"no checkpoint matches {ref!r}")

    def flush(self) -> None:
        """Make every checkpoint committed so far durable (see :mod:`stashpoint.durability`)."""
        self.group.flush()

    def committed(self, durability: Durability) -> None:
        """A session committed a checkpoint through this object: schedule its flush, and
        check on the store's upkeep when this object closes (:mod:`stashpoint.upkeep`)."""
        self.wrote = True
        self.group.committed(durability)

    def set_durability(self, level: Durability | str) -> Durability:
        """Record ``level`` as this store's default, for every later open (and use it now)."""
        self.durability = Durability.parse(level)
        self.meta.set_meta(DURABILITY_META, str(self.durability))
        return self.durability

    def durability_report(self, level: Durability | None = None) -> dict[str, Any]:
        """What ``show`` prints: the level, and what the backend makes of it."""
        level = level or self.durability
        out = level.to_dict()
        out["backend"] = self.meta.durability
        if level.deferred and not self.meta.defers_commits:
            out["note"] = "this backend does not defer commits: each is as durable as it says"
        return out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.group.close()  # deferred checkpoints become durable before the store closes
            if self.wrote and self.upkeep_on_close:
                from .upkeep import run_if_due

                run_if_due(self)  # retention and the size budget, once a period
            # Stat caches wait for quiet before they are written: a closed store's directory
            # is at rest (a copy, a backup or a bundle test sees all of it).
            from .workspace.statcache import flush_saves

            flush_saves(10.0)
        finally:
            self.meta.close()
            self.blobs.close()  # release the blob directory's lock: a GC may hold it alone now

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_encryption(
    meta: MetadataStore, key: bytes | None, blobs: BlobBackend | None = None
) -> Cipher | None:
    """The store's cipher: refuses a missing or wrong key for an encrypted store, and marks a
    new (empty) store encrypted when a key is given. An existing plaintext store is not
    encrypted in place: its old rows would stay plaintext, which an encrypted store refuses.

    A local store is marked only while no other process has it open: one that opened it
    empty without a key would go on writing plaintext into the now encrypted store."""
    from .crypto import KEY_ENV, KEY_FILE_ENV, Cipher
    from .errors import EncryptionKeyError

    raw = meta.get_meta(ENCRYPTION_META)
    if raw is None:
        if key is None:
            return None
        cipher = Cipher(key)
        empty = not meta.sessions() and all(False for _ in meta.iter_logs())
        if not empty or any(True for _ in meta.iter_blob_digests()):
            raise EncryptionKeyError(
                f"store {meta.url} is not encrypted and already holds data; open it without a "
                f"key (unset {KEY_ENV} / {KEY_FILE_ENV}), or export bundles and import them "
                "into a new store opened with the key"
            )
        info = {"cipher": "AES-256-GCM", "kdf": "HKDF-SHA256", "key_id": cipher.key_id}
        local = isinstance(blobs, LocalBlobStore)  # S3: never exclusive, and not local
        exclusive = blobs.exclusive() if local and blobs else contextlib.nullcontext(True)
        with exclusive as alone:
            if not alone:
                raise EncryptionKeyError(
                    f"store {meta.url} is empty and open in another process without a key: "
                    "it would write plaintext into it once encrypted; close that one, then "
                    "open the store with the key again"
                )
            meta.set_meta(ENCRYPTION_META, json.dumps(info, sort_keys=True))
        return cipher
    try:
        expected = str(json.loads(raw)["key_id"])
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"store {meta.url} has a malformed encryption marker") from None
    if key is None:
        raise EncryptionKeyError(
            f"store {meta.url} is encrypted (key id {expected}): set {KEY_ENV} (64 hex digits) "
            f"or {KEY_FILE_ENV}, or pass encryption_key="
        )
    cipher = Cipher(key)
    if cipher.key_id != expected:
        raise EncryptionKeyError(
            f"wrong key for store {meta.url}: it is encrypted under key id {expected}, "
            f"the key given has id {cipher.key_id}"
        )
    return cipher


def open_store(
    url: str | os.PathLike[str] | None = None,
    *,
    key: bytes | None = None,
    blobs: str | None = None,
    mirror: str | os.PathLike[str] | None = None,
    encryption_key: bytes | None = None,
    durability: Durability | str | None = None,
) -> Store:
    """Open a store by URL or path; default ``./.stashpoint`` (SQLite + local blobs).

    ``durability`` (or ``?durability=`` in the URL, or ``$STASHPOINT_DURABILITY``): ``fsync``
    (default), ``group[:N][,Tms]`` or ``exit``; sessions may choose their own
    (:mod:`stashpoint.durability`).

    With ``mirror`` (another store URL), every checkpoint is also written there and reads fall
    back to it; see :mod:`stashpoint.mirror`.

    Accepted: a directory path, ``sqlite:///path/to/dir`` (or ``…/file.db``), ``memory://``,
    ``postgresql://user@host/db`` (``pip install 'stashpoint[postgres]'``),
    ``redis://host:6379/0?prefix=sp:`` (``pip install 'stashpoint[redis]'``),
    ``file:///path/to/dir`` (every checkpoint a readable JSON document).

    ``blobs="s3://bucket/prefix"`` (or ``?blobs=s3://bucket/prefix`` in the URL; ``pip install
    'stashpoint[s3]'``) keeps chunks of large files and packs in an S3-compatible bucket. The
    store remembers it, so later opens need not repeat it.

    ``key`` makes the hash chain keyed (HMAC); ``encryption_key`` (32 bytes; default
    ``$STASHPOINT_KEY`` or ``$STASHPOINT_KEY_FILE``) encrypts a new store at rest and is
    required to open an encrypted one (``pip install 'stashpoint[encryption]'``). Encryption
    also keys the chain, with a MAC key derived from the encryption key unless ``key`` is given.
    ``encryption_key=b""`` opens without one, whatever the environment says.
    """
    if encryption_key is None:
        from .crypto import key_from_env

        encryption_key = key_from_env()
    elif encryption_key == b"":
        encryption_key = None
    if mirror is not None:
        from .mirror import mirrored

        try:
            primary = open_store(
                url, key=key, blobs=blobs, encryption_key=encryption_key, durability=durability
            )
        except StoreError as exc:
            raise StoreError(
                f"{exc}; to read from the mirror alone, open it as the store ({os.fspath(mirror)})"
            ) from exc
        return mirrored(
            primary,
            os.fspath(mirror),
            lambda u: open_store(u, key=key, encryption_key=encryption_key),
        )
    parsed = parse_store_url(url, blobs=blobs)
    level = Durability.parse(durability) if durability is not None else None
    if parsed.durability is not None:
        in_url = Durability.parse(parsed.durability)
        if level is not None and level != in_url:
            raise UsageError(
                f"two durability levels given: {parsed.durability!r} in the URL and {level}"
            )
        level = in_url
    backend = get_backend(parsed.scheme)
    if parsed.blobs is not None and backend.blobs is not True:
        raise UsageError(str(backend.blobs))
    opened = backend.open(parsed)
    try:
        # Whether asked for or recorded in the store by an earlier open: the same rule for all.
        s3 = _blob_store(opened.meta, parsed.blobs) if backend.blobs is True else None
    except BaseException:
        opened.meta.close()
        raise
    store = Store(
        opened.meta,
        blob_dir=opened.blob_dir,
        home=opened.home,
        blob_store=s3,
        key=key,
        encryption_key=encryption_key,
        durability=level,
    )
    store.own_paths += opened.own_paths
    return store


_BLOBS_KEY = "blobs_url"


def _blob_store(meta: MetadataStore, blobs: str | None) -> BlobBackend | None:
    """The S3 blob store a store was created with (recorded in its meta), or None.

    Recorded so that every later open finds its blobs; refused for a store that already has
    checkpoints with their blobs elsewhere (they would be unreachable from here).
    """
    recorded = meta.get_meta(_BLOBS_KEY)
    if blobs is None and recorded is None:
        return None
    if blobs is not None and not blobs.startswith("s3://"):
        raise UsageError(f"unsupported blob location {blobs!r}: expected s3://BUCKET/PREFIX")
    if blobs is not None and recorded is not None and blobs.rstrip("/") != recorded:
        raise UsageError(f"this store keeps its blobs in {recorded}, not in {blobs}")
    from .blobs.s3 import S3BlobStore

    s3 = S3BlobStore(recorded or str(blobs))
    if recorded is None and meta.sessions():
        raise UsageError(
            "this store already has checkpoints whose blobs are kept elsewhere; S3 blobs "
            "can be chosen only when a store is created (copy it: stashpoint copy)"
        )
    store_id = meta.get_meta("store_id")
    if store_id is None:  # the id Store() would give it, given now to claim the prefix
        store_id = uuid.uuid4().hex
        meta.set_meta("store_id", store_id)
    s3.claim(store_id)
    if recorded is None:
        meta.set_meta(_BLOBS_KEY, s3.url.rstrip("/"))
    return s3


def config_hash(config: Any) -> str | None:
    if config is None:
        return None
    import msgspec

    from .serde import to_tree

    data = msgspec.json.encode(to_tree(config), order="sorted")
    return hashlib.sha256(data).hexdigest()
