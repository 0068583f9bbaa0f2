"""Opening a store from a URL or path: the backend its scheme names, its blobs, a mirror, and
the automatic upkeep a store runs when it closes.

This is what :func:`stashpoint.open` is. It sits above the engine (it wires in the mirror and
retention, which are operations on a store), so the :class:`~stashpoint.Store` facade below it
stays a plain holder of a backend and its rules.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import metakeys
from ._store import Store, claim_meta
from .blobs.backend import BlobBackend
from .durability import Durability
from .errors import StoreError, UsageError
from .stores.base import MetadataStore
from .stores.formats import CURRENT as CURRENT_FORMAT
from .stores.registry import get_backend
from .urls import parse_store_url

if TYPE_CHECKING:
    from .upgrade import UpgradeReport

__all__ = ["open_store", "upgrade_store"]


def open_store(
    url: str | os.PathLike[str] | None = None,
    *,
    key: bytes | None = None,
    blobs: str | None = None,
    mirror: str | os.PathLike[str] | None = None,
    encryption_key: bytes | None = None,
    durability: Durability | str | None = None,
    accept_rollback: bool | None = None,
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

    ``key`` (32 bytes; default ``$STASHPOINT_INTEGRITY_KEY`` or
    ``$STASHPOINT_INTEGRITY_KEY_FILE``; ``b""`` for none) makes the hash chain keyed (HMAC):
    the store records the key's id, and refuses to open without it or with another key.
    ``encryption_key`` (32 bytes; default
    ``$STASHPOINT_KEY`` or ``$STASHPOINT_KEY_FILE``) encrypts a new store at rest and is
    required to open an encrypted one (``pip install 'stashpoint[encryption]'``). Encryption
    also keys the chain, with a MAC key derived from the encryption key unless ``key`` is given.
    ``encryption_key=b""`` opens without one, whatever the environment says.

    A persistent store is checked against this user's rollback witness
    (:mod:`stashpoint.witness`): a branch older than the newest state seen before is
    :class:`~stashpoint.errors.RollbackError`, unless ``accept_rollback`` (default
    ``$STASHPOINT_ACCEPT_ROLLBACK``) says the rollback was intended.
    """
    if key is None:
        from .crypto import integrity_key_from_env

        key = integrity_key_from_env()
    elif key == b"":
        key = None
    if encryption_key is None:
        from .crypto import key_from_env

        encryption_key = key_from_env()
    elif encryption_key == b"":
        encryption_key = None
    if mirror is not None:
        from .mirror import mirrored
        from .witness import accept_from_env

        try:
            primary = open_store(
                url,
                key=key,
                blobs=blobs,
                encryption_key=encryption_key,
                durability=durability,
                accept_rollback=accept_rollback,
            )
        except StoreError as exc:
            raise StoreError(
                f"{exc}; to read from the mirror alone, open it as the store ({os.fspath(mirror)})"
            ) from exc
        return mirrored(
            primary,
            os.fspath(mirror),
            lambda u: open_store(u, key=key, encryption_key=encryption_key),
            accept_rollback=accept_from_env() if accept_rollback is None else accept_rollback,
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
    store.upkeep = _upkeep
    # A store in an older format has no numbered refs to witness, and no record of being
    # keyed: a wrong key would be remembered with it. Witnessed from its upgrade on.
    if parsed.scheme != "memory" and store.format == CURRENT_FORMAT:
        try:
            _attach_witness(store, accept_rollback)
        except BaseException:
            store.upkeep_on_close = False
            store.close()
            raise
    return store


def upgrade_store(
    url: str | os.PathLike[str] | None = None,
    *,
    key: bytes | None = None,
    encryption_key: bytes | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> UpgradeReport:
    """Convert the store at ``url`` from an older format to the current one (what
    ``stashpoint upgrade`` does; see :mod:`stashpoint.upgrade`), then open it again and read
    every head and label back through the authenticated ref layer.

    Keys as for :func:`open_store`: a keyed store's refs are signed with the key given here.
    A store in the current format is left as it is."""
    from .upgrade import check_upgraded, upgrade

    with open_store(url, key=key, encryption_key=encryption_key) as store:
        report = upgrade(store, dry_run=dry_run, progress=progress)
    if not dry_run and report.format_before < report.format_after:
        with open_store(store.url, key=key, encryption_key=encryption_key) as again:
            check_upgraded(again)
            report.format_after = again.format
    return report


def _attach_witness(store: Store, accept: bool | None) -> None:
    from .witness import Witness, accept_from_env, witness_dir

    directory = witness_dir()
    if directory is None:
        return
    witness = Witness(
        store.id,
        store.refs.signer.key,
        directory,
        accept=accept_from_env() if accept is None else accept,
    )
    store.witness = witness
    store.refs.observer = witness


def _upkeep(store: Store) -> None:
    from .upkeep import run_if_due  # retention and GC: only a store that wrote pays the import

    run_if_due(store)


_BLOBS_KEY = metakeys.BLOBS_URL


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
    store_id = meta.get_meta(metakeys.STORE_ID)
    if store_id is None:  # the id Store() would give it, given now to claim the prefix
        store_id = claim_meta(meta, metakeys.STORE_ID, uuid.uuid4().hex)
    s3.claim(store_id)
    if recorded is None:
        meta.set_meta(_BLOBS_KEY, s3.url.rstrip("/"))
    return s3
