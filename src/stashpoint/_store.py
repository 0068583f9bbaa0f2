"""The Store facade: a backend, its blobs and the integrity rules that bind them; verified
records read out of it. Opening one from a URL is :mod:`stashpoint.opening`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from . import metakeys
from .blobs.backend import BlobBackend
from .blobs.local import LocalBlobStore
from .blobs.objects import Blobs
from .durability import DURABILITY_META, Durability, GroupCommit, resolve
from .errors import IntegrityError, NotFoundError, PrunedError, UsageError
from .integrity import ChainHasher
from .model import Checkpoint, utc_now_iso
from .stores import formats
from .stores.base import CheckpointRow, Fence, LogInfo, MessageRow, MetadataStore, MetaKV
from .stores.refauth import AuthenticatedRefs, RefSigner
from .stores.registry import ignore_store_dir
from .urls import DEFAULT_DIR

if TYPE_CHECKING:
    from .crypto import Cipher
    from .lease import Lease
    from .session import Session
    from .witness import Witness

__all__ = ["DEFAULT_DIR", "Store", "check_not_pruned", "claim_meta", "ignore_store_dir"]

ENCRYPTION_META = metakeys.ENCRYPTION
"""Store meta key marking an encrypted store: cipher, KDF and key id (never the key)."""


class Problem(NamedTuple):
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
            key = key if key is not None else self.cipher.mac_key
        try:
            self.format = formats.detect(meta)
            """The store's format version (:mod:`.stores.formats`); an older one is read as
            it is and written only after ``stashpoint upgrade``."""
            self.backend = meta
            """The backend itself, below every wrapper (an upgrade converts its rows)."""
            if self.format < formats.CURRENT:
                meta = formats.FormatV1Store(meta)
            store_id = meta.get_meta(metakeys.STORE_ID)
            if store_id is None:
                store_id = uuid.uuid4().hex
                if self.format == formats.CURRENT:  # else: named by its upgrade
                    store_id = claim_meta(meta, metakeys.STORE_ID, store_id)
            self.id = store_id
            self.refs = AuthenticatedRefs(meta, RefSigner(key, store_id))
            """The ref layer, right above the backend: heads and labels signed and verified
            (:mod:`.stores.refauth`)."""
            _check_integrity_key(
                self.refs,
                key,
                explicit=key is not None and self.cipher is None,
                record=self.format == formats.CURRENT,
            )
            if key is not None and self.format == formats.CURRENT:
                from .crypto import integrity_key_id

                self.refs.authenticate(integrity_key_id(key))
        except BaseException:
            meta.close()
            raise
        meta = self.refs
        if self.cipher is not None:
            from .stores.encrypted import EncryptedLogs

            meta = EncryptedLogs(meta, self.cipher)
        self.meta: MetadataStore = meta
        self.group = GroupCommit(meta)
        """Flushes deferred commits on their levels' schedules; shared by this store's sessions."""
        self.wrote = False
        self.upkeep_on_close = True
        self.upkeep: Callable[[Store], None] | None = None
        """What a close runs after writes (automatic retention): :func:`~stashpoint.open`
        installs it; the facade does not know the operations layer it lives in."""
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
        if self.format < formats.CURRENT:
            self.blobs.read_only = formats.upgrade_hint(self.url)
        self.witness: Witness | None = None
        """The rollback witness (:mod:`stashpoint.witness`), set by :func:`stashpoint.open`."""
        self.hasher = ChainHasher(key, self.cipher)
        from .workspace.statcache import CacheSeal

        self.cache_seal = CacheSeal(key, self.cipher)
        """Protects workspace stat caches (MAC'd when keyed, encrypted when encrypted)."""

    # -- sessions -------------------------------------------------------------------------
    def session(self, name: str = "main", **kwargs: Any) -> Session:
        """Open (or start) a session; see :class:`stashpoint.Session` for the options."""
        from .session import Session

        return Session(self, name, **kwargs)

    def sessions(self) -> list[str]:
        return self.meta.sessions()

    def head_id(self, session: str, branch: str) -> str | None:
        """The id of a branch's head as stored now (None: no checkpoint yet), in one read
        that decodes nothing: a session object caches its head, and this tells a caller
        whether another writer has moved it since."""
        return self.meta.get_head(session, branch)

    def branches(self, session: str) -> dict[str, str]:
        """Branch -> head id of a session, as stored now (one read: for a caller that
        tells whether another writer moved a head since it looked)."""
        return self.meta.branches(session)

    def start_branch(
        self, session: str, branch: str, at: str, *, fence: Fence | None = None
    ) -> None:
        """Start ``branch`` of ``session`` at checkpoint ``at`` (its head, nothing copied).

        The store checks what it checks for every head a session moves: the branch must not
        exist yet (:class:`ConflictError`), ``at`` must not be pruned, and the write carries
        ``fence`` (a session's lease token) or, without one, is refused while another worker
        holds a live lease on the session (:class:`LeaseHeld`)."""
        self.meta.set_head(session, branch, at, None, fence=fence)

    def record_ids(self, session: str) -> list[str]:
        """Ids of every record of a session, newest first (an index read: nothing decoded)."""
        return [row.id for row in self.meta.list_checkpoints(session)]

    def records(self, session: str) -> list[Checkpoint]:
        """Every record of a session, newest first, each verified with its link in the hash
        chain (:meth:`get` for all of them, reading each parent row once)."""
        rows = self.meta.list_checkpoints(session)
        by_id = {r.id: r for r in rows}
        out = []
        for row in rows:
            try:
                cp = self.open_row(row)
                if cp.parent is not None:
                    prow = by_id.get(cp.parent) or self.meta.get_checkpoint(cp.parent)
                    if prow is None or prow.digest != cp.parent_digest:
                        what = "is missing" if prow is None else "was altered"
                        raise IntegrityError(
                            f"checkpoint {cp.id} is broken: its parent {cp.parent} {what}",
                            checkpoint=cp.id,
                        )
            except IntegrityError as exc:
                raise self.with_last_good(exc, row) from None
            out.append(cp)
        return out

    def pruned(self, session: str) -> dict[str, str]:
        """Checkpoint id -> when retention released its contents, for one session."""
        return self.meta.pruned(session)

    def prune(self, session: str, ids: Iterable[str]) -> list[str]:
        """Release the contents of checkpoints of ``session`` (their records stay and still
        verify; GC frees what only they reference); returns the ids newly marked. Heads and
        labelled checkpoints are skipped; refused while another worker holds the lease."""
        return self.meta.mark_pruned(session, sorted(ids), utc_now_iso())

    def session_value(self, session: str, name: str) -> str | None:
        """An application's value kept for ``session`` (a name of
        :data:`~stashpoint.metakeys.SESSION_VALUES`), sealed in an encrypted store."""
        return self.meta.get_meta(_session_value_key(session, name))

    def set_session_value(self, session: str, name: str, value: str | None) -> None:
        """Set (None: delete) an application's value kept for ``session``."""
        self.meta.set_meta(_session_value_key(session, name), value)

    def swap_session_value(
        self, session: str, name: str, expected: str | None, value: str | None
    ) -> bool:
        """Set (None: delete) an application's value kept for ``session`` only if it still
        is ``expected`` (None: unset), atomically against every other writer; whether it did.
        What several processes change (LangGraph's pending writes) is swapped, never set."""
        return self.meta.swap_meta(_session_value_key(session, name), expected, value)

    def log_info(self, log: str) -> LogInfo | None:
        """A conversation log's header (its session, fork parent and length), or None."""
        return self.meta.log_info(log)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        """Rows ``start <= idx < stop`` of a log's own messages, as stored (each with its
        running hash, for the caller to check; sealed rows come back opened)."""
        return self.meta.read_messages(log, start, stop)

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
        return self.meta.get_meta(metakeys.GC_EPOCH) or "0"

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
            if self.wrote and self.upkeep_on_close and self.upkeep is not None:
                self.upkeep(self)  # retention and the size budget, once a period
            # Stat caches wait for quiet before they are written: a closed store's directory
            # is at rest (a copy, a backup or a bundle test sees all of it).
            from .workspace.statcache import flush_saves

            flush_saves(10.0)
            if self.witness is not None:
                self.witness.save(self.refs.seen, self.refs.digests)
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
            marker = json.dumps(info, sort_keys=True)
            raw = claim_meta(meta, ENCRYPTION_META, marker)
        if raw == marker:
            return cipher
        # Another process marked the empty store first (a store without local blobs has
        # nothing to hold it alone): its key is the store's, checked below like any other.
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


def config_hash(config: Any) -> str | None:
    if config is None:
        return None
    import msgspec

    from .serde import to_tree

    data = msgspec.json.encode(to_tree(config), order="sorted")
    return hashlib.sha256(data).hexdigest()


def _check_integrity_key(
    refs: AuthenticatedRefs, key: bytes | None, *, explicit: bool, record: bool = True
) -> None:
    """A keyed store says so (the key's id, never the key): opened without its key, or with
    another, it is refused with a message saying which, instead of every record looking
    damaged. A store first opened with a key is marked keyed. (An encrypted store's chain is
    keyed by its encryption key, which it checks itself.) The ref marker
    (:data:`~stashpoint.metakeys.REF_AUTH`, a MAC over the store id and the key id) tells an
    altered or removed marker from a wrong key. ``record`` false (a store in an older format,
    read as it is): a store not marked keyed yet is not marked now; its upgrade does it."""
    from . import metakeys
    from .crypto import integrity_key_id

    meta = refs.inner
    recorded = meta.get_meta(metakeys.INTEGRITY)
    signed = meta.get_meta(metakeys.REF_AUTH)
    if not explicit:
        if recorded is not None and key is None:
            raise UsageError(
                f"store {meta.url} has a keyed hash chain (key id {recorded}): set "
                "STASHPOINT_INTEGRITY_KEY or STASHPOINT_INTEGRITY_KEY_FILE, or pass key="
            )
        if signed is not None and key is None:
            raise IntegrityError(
                f"store {meta.url} has a keyed hash chain, but its integrity marker was "
                "removed: open it with its key (STASHPOINT_INTEGRITY_KEY or "
                "STASHPOINT_INTEGRITY_KEY_FILE) to check it"
            )
        return
    assert key is not None
    kid = integrity_key_id(key)
    if recorded is None and record:
        recorded = claim_meta(meta, metakeys.INTEGRITY, kid)
    if recorded is not None and recorded != kid:
        if signed is not None and refs.signer.marker_ok(signed, kid):
            raise IntegrityError(
                f"store {meta.url}: its integrity marker names key id {recorded}, but the "
                f"store was signed with this key (id {kid}): the marker was altered"
            )
        raise UsageError(
            f"wrong integrity key for store {meta.url}: its hash chain is keyed with key id "
            f"{recorded}, the key given has id {kid}"
        )


def claim_meta(meta: MetaKV, key: str, value: str) -> str:
    """Record ``value`` as a store setting that is set once, when the store is first opened
    (its id, its keys' ids), unless another process recorded one first; the value recorded.
    Read then set, two processes opening a new store at once each kept the one they made,
    and the one whose value was overwritten went on using it: its heads were signed with an
    id the store no longer had and read as forged."""
    while not meta.swap_meta(key, None, value):
        found = meta.get_meta(key)
        if found is not None:
            return found
    return value


def check_not_pruned(store: Store, cp: Checkpoint | Sequence[Checkpoint]) -> None:
    """Raise :class:`PrunedError` if a checkpoint's contents were released by retention.

    For the engine to call before reading a checkpoint's state, files or journal.
    """
    cps = [cp] if isinstance(cp, Checkpoint) else list(cp)
    by_session: dict[str, dict[str, str]] = {}
    for c in cps:
        marks = by_session.get(c.session)
        if marks is None:
            marks = by_session[c.session] = store.meta.pruned(c.session)
        if c.id in marks:
            raise PrunedError(c.id, marks[c.id])


def _session_value_key(session: str, name: str) -> str:
    try:
        return metakeys.SESSION_VALUES[name](session)
    except KeyError:
        known = ", ".join(sorted(metakeys.SESSION_VALUES))
        raise UsageError(f"no session value named {name!r} (known: {known})") from None
