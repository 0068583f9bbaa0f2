"""Store format versions: which layout a store is in, and read-only access to an older one.

A store records its format in one place, the meta key :data:`~stashpoint.metakeys.FORMAT`:

``1``
    What stashpoint wrote up to the authenticated refs: heads and labels without an ``auth``
    string, no format key (SQLite and PostgreSQL schema 3, file store layout 1, Redis without
    ``headauth:``/``labelauth:`` hashes). Read as it is; never written.
``2``
    Every head and label carries its sequence number (and, keyed, its MAC); a keyed store holds
    its integrity marker and the MAC'd ref marker (:mod:`stashpoint.stores.refauth`).

Why reads of an older format work but writes need ``stashpoint upgrade`` (as borg and git do
with repository formats): an upgrade is a one-way step that an older program then refuses, so
the user takes it on purpose, once, with the key at hand (a keyed store's refs are signed by
it), not as the side effect of whichever command happened to open the store first. So opening
a v1 store writes nothing at all, and ``log``, ``show``, ``diff``, ``verify`` and the web UI
leave its files byte for byte as they were.

A store holding no format key was written before the key existed: v1, unless its backend's own
layout version says it is newer (a store with neither an id nor a layout of its own is new and
gets the current format at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import metakeys
from ..errors import IntegrityError, SchemaVersionError, UpgradeRequired
from .base import BlobRow, Commit, Fence, LeaseInfo, LogAppend, MetadataStore
from .forwarding import ForwardingStore

__all__ = ["CURRENT", "V1", "FormatV1Store", "detect", "upgrade_hint"]

V1 = 1
CURRENT = 2
"""The format this stashpoint writes."""


def upgrade_hint(url: str) -> str:
    return (
        f"store {url} is in format {V1}, written by an older stashpoint: it can be read as it "
        f"is, but it is written only after `stashpoint --store {url} upgrade` converts it to "
        f"format {CURRENT} (then an older stashpoint no longer opens it)"
    )


def detect(meta: MetadataStore) -> int:
    """The store's format version; a new store is given the current one here.

    SchemaVersionError for a format newer than this program's; IntegrityError for a malformed
    marker. ``meta`` is the backend itself (below encryption: the key is plaintext)."""
    layout_v1 = getattr(meta, "format_v1", None)
    if layout_v1:
        return V1  # the backend's own layout is format 1's, whatever else says otherwise
    recorded = meta.get_meta(metakeys.FORMAT)
    if recorded is not None:
        if not recorded.isdigit() or int(recorded) < V1:
            raise IntegrityError(f"store {meta.url} has a malformed format marker {recorded!r}")
        version = int(recorded)
        if version > CURRENT:
            raise SchemaVersionError(
                f"store {meta.url} is in format {version}; this stashpoint reads formats up to "
                f"{CURRENT}: upgrade stashpoint"
            )
        return version
    if meta.get_meta(metakeys.STORE_ID) is not None:
        # Opened before. A backend with a layout version of its own has said it is current
        # (written by a version with auth strings but without this key); one without can only
        # have been written by format 1.
        return CURRENT if layout_v1 is not None else V1
    meta.set_meta(metakeys.FORMAT, str(CURRENT))  # new: the current format from the start
    return CURRENT


class FormatV1Store(ForwardingStore):
    """A v1 store, read as it is: refs without ``auth`` strings, and every write refused with
    :class:`~stashpoint.errors.UpgradeRequired` before it reaches the backend.

    Where the backend's rows have no ``auth`` column yet (SQL schema 3, ``ref_auth`` false),
    refs are read through the v1 queries and carry no ``auth``; elsewhere (Redis, file store)
    the rows are read as they are, so refs that an interrupted upgrade already gave an
    ``auth`` are checked like any other."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self.ref_auth = False

    def _refused(self) -> UpgradeRequired:
        return UpgradeRequired(upgrade_hint(self.url))

    # -- reads without auth columns ---------------------------------------------------------
    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        if self.inner.ref_auth:
            return self.inner.head_rows(session)
        return {b: (c, None) for b, c in self.inner.branches(session).items()}

    def head_row(self, session: str, branch: str) -> tuple[str, str | None] | None:
        if self.inner.ref_auth:
            return self.inner.head_row(session, branch)
        head = self.inner.get_head(session, branch)
        return None if head is None else (head, None)

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        if self.inner.ref_auth:
            return self.inner.label_rows(session)
        return {c: (label, None) for c, label in self.inner.labels(session).items()}

    # -- every write: refused ---------------------------------------------------------------
    def set_meta(self, key: str, value: str | None) -> None:
        raise self._refused()

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        raise self._refused()

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        raise self._refused()

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        raise self._refused()

    def append_log(self, append: LogAppend) -> None:
        raise self._refused()

    def delete_logs(self, logs: Sequence[str]) -> None:
        raise self._refused()

    def commit(self, commit: Commit) -> None:
        raise self._refused()

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
        raise self._refused()

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        raise self._refused()

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        raise self._refused()

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        raise self._refused()

    def release_lease(self, fence: Fence) -> None:
        raise self._refused()

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        raise self._refused()

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        raise self._refused()

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        raise self._refused()

    def vacuum(self) -> None:
        raise self._refused()

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        raise self._refused()
