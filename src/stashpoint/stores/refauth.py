"""Authenticated references: every branch head and label row carries a sequence number and,
in a keyed store, a MAC.

A keyed hash chain (:mod:`stashpoint.integrity`) makes every *record* unforgeable, but the
refs that point into the chain are plain rows: someone who can write the store could move a
branch head back to an older (genuine) checkpoint, or a label onto another one, and nothing
would notice. Here each ref row gets an ``auth`` string on the same row (one more column, no
extra write per checkpoint)::

    <seq>.<mac>     keyed store: mac = keyed BLAKE2b-128(key, store id, session, kind,
                    name, target checkpoint, seq), in hex
    <seq>           unkeyed store: the sequence number alone

``seq`` grows by one at every move of that ref (a rewind included), so the latest state a
user has seen can be remembered outside the store (:mod:`stashpoint.witness`) and an older
copy of the store recognised. Without the key, a ref cannot be moved (nor its sequence
number changed) without the MAC failing; what the key cannot stop by itself is a *replay* of
an older genuine row, or of the whole store: the witness is for that.

Reads verify: a head or label whose MAC fails is an :class:`~stashpoint.errors.IntegrityError`
naming it. Rows written before refs carried an ``auth`` (a store created by an older version)
are *legacy*: the first keyed open signs them as they are (trust on first use) and records a
MAC'd marker (:data:`~stashpoint.metakeys.REF_AUTH`); from then on a ref without a valid MAC
is damage, not legacy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Protocol

from .. import metakeys
from ..errors import IntegrityError, LeaseHeld, StoreError
from .base import Commit, Fence, MetadataStore
from .forwarding import ForwardingStore

__all__ = ["AuthenticatedRefs", "RefSigner", "parse_seq"]

_PERSON = b"stashpoint-ref1"
"""BLAKE2b personalisation: ref MACs are domain-separated from every other use of the key."""
_MARKER_DOMAIN = b"stashpoint-store-v1\0"
MARKER_VERSION = "refs1"
"""What :data:`~stashpoint.metakeys.REF_AUTH` records: every ref of the store carries a MAC."""


class Observer(Protocol):
    """Told of every head read (the rollback witness, :mod:`stashpoint.witness`)."""

    def observe(self, session: str, branch: str, head: str, seq: int) -> None: ...

    def observe_session(self, session: str, branches: set[str]) -> None: ...


def parse_seq(auth: str | None) -> int:
    """The sequence number of an ``auth`` string (0 for none or a malformed one)."""
    if not auth:
        return 0
    head, _, _ = auth.partition(".")
    return int(head) if head.isdigit() else 0


class RefSigner:
    """Computes and checks the ``auth`` strings of one store's refs."""

    def __init__(self, key: bytes | None, store_id: str) -> None:
        self.key = key
        self.store_id = store_id
        self._base = (
            hashlib.blake2b(store_id.encode(), key=key, digest_size=16, person=_PERSON)
            if key is not None
            else None
        )
        self._refs: dict[tuple[str | int, ...], hashlib.blake2b] = {}
        self.strict = False
        """Set once the store is marked (:meth:`marker`): then a ref without a MAC is damage."""

    @property
    def keyed(self) -> bool:
        return self.key is not None

    def _mac(self, fields: list[str | int]) -> str:
        # Keyed BLAKE2b is a MAC by design, and three C calls: a third of HMAC-SHA256's cost
        # through the hmac module (this runs once per checkpoint). The key and store id are
        # absorbed once, each ref's name part once per ref; names are length-prefixed, so no
        # two refs read the same.
        kind, session, name, target, seq = fields
        ref = (kind, session, name)
        base = self._refs.get(ref)
        if base is None:
            assert self._base is not None
            base = self._base.copy()
            base.update(f"{kind}\0{len(str(session))}:{session}{len(str(name))}:{name}\0".encode())
            if len(self._refs) < 4096:
                self._refs[ref] = base
        h = base.copy()
        h.update(f"{target}\0{seq}".encode())
        return h.hexdigest()

    def head_auth(self, session: str, branch: str, target: str, seq: int) -> str:
        """:meth:`auth` of a head: the checkpoint path, with one call less."""
        base = self._refs.get(("head", session, branch))
        if base is None:
            return self.auth("head", session, branch, target, seq)
        h = base.copy()
        h.update(f"{target}\0{seq}".encode())
        return f"{seq}.{h.hexdigest()}"

    def auth(self, kind: str, session: str, name: str, target: str, seq: int) -> str:
        if self.key is None:
            return str(seq)
        return f"{seq}.{self._mac([kind, session, name, target, seq])}"

    def check(self, kind: str, session: str, name: str, target: str, auth: str | None) -> int:
        """The ref's sequence number, or IntegrityError when its MAC fails (or, in a marked
        store, is missing). Unkeyed: the sequence number as stored (nothing to check)."""
        seq = parse_seq(auth)
        if self.key is None:
            return seq
        what = (
            f"branch {name!r} of session {session!r} (head {target})"
            if kind == "head"
            else f"label {name!r} of session {session!r} (on {target})"
        )
        if auth is None or "." not in auth or seq == 0:
            if not self.strict:
                return 0  # legacy: written before refs carried a MAC
            raise IntegrityError(
                f"{what} carries no MAC, but every ref of this keyed store must: it was "
                "written or altered without the key",
                checkpoint=target,
            )
        mac = auth.partition(".")[2]
        if not hmac.compare_digest(mac, self._mac([kind, session, name, target, seq])):
            raise IntegrityError(
                f"{what} does not match its MAC: the ref was moved or altered without the key "
                f"(sequence {seq})",
                checkpoint=target,
            )
        return seq

    def marker(self, key_id: str) -> str:
        """The value of :data:`~stashpoint.metakeys.REF_AUTH`: a MAC over the store id, the
        key's id and the ref format, so that neither can be swapped without the key."""
        assert self.key is not None
        data = _MARKER_DOMAIN + json.dumps([self.store_id, key_id, MARKER_VERSION]).encode()
        mac = hmac.new(self.key, data, hashlib.sha256).hexdigest()
        return f"{MARKER_VERSION}.{key_id}.{mac}"

    def marker_ok(self, value: str, key_id: str) -> bool:
        return hmac.compare_digest(value, self.marker(key_id))


class AuthenticatedRefs(ForwardingStore):
    """Writes an ``auth`` string with every head and label, and verifies it on every read
    through :meth:`branches`, :meth:`get_head` and :meth:`labels`. The raw rows
    (:meth:`head_rows`, :meth:`label_rows`) pass through unverified, for ``verify`` to report
    each problem rather than stop at the first.

    Only the storage protocols' operations are reachable through it (each forwarded by
    name): a backend's other methods and attributes are not, so nothing can move a head
    around the signature by calling the backend through this object."""

    def __init__(self, inner: MetadataStore, signer: RefSigner) -> None:
        super().__init__(inner)
        self.signer = signer
        self.seen: dict[tuple[str, str], tuple[str, int]] = {}
        """(session, branch) -> (head, seq) last read or written through this object."""
        self.digests: dict[tuple[str, str], str] = {}
        """(session, branch) -> the record digest of a head this object wrote."""
        self.observer: Observer | None = None

    # -- heads ------------------------------------------------------------------------------
    def _head(self, session: str, branch: str, target: str, auth: str | None) -> str:
        seq = self.signer.check("head", session, branch, target, auth)
        self.seen[(session, branch)] = (target, seq)
        if self.observer is not None:
            self.observer.observe(session, branch, target, seq)
        return target

    def branches(self, session: str) -> dict[str, str]:
        heads = {
            b: self._head(session, b, target, auth)
            for b, (target, auth) in self.inner.head_rows(session).items()
        }
        if self.observer is not None:
            self.observer.observe_session(session, set(heads))
        return heads

    def get_head(self, session: str, branch: str) -> str | None:
        row = self.inner.head_row(session, branch)
        return None if row is None else self._head(session, branch, *row)

    def _next_seq(self, session: str, branch: str, expected: str | None) -> int:
        if expected is None:
            return 1  # a new branch (if it exists after all, the compare-and-set refuses)
        known = self.seen.get((session, branch))
        if known is not None and known[0] == expected:
            return known[1] + 1
        row = self.inner.head_row(session, branch)
        return parse_seq(row[1]) + 1 if row is not None else 1

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
        seq = self._next_seq(session, branch, expected)
        auth = self.signer.auth("head", session, branch, new, seq)
        self.inner.set_head(session, branch, new, expected, fence=fence, auth=auth)
        self.seen[(session, branch)] = (new, seq)
        self.digests.pop((session, branch), None)

    def copy_head(
        self, session: str, branch: str, new: str, expected: str | None, seq: int
    ) -> None:
        """Move a head to ``new`` at the sequence number another store gave it (a mirror copies
        the primary's heads this way, so that each store can witness the other's)."""
        auth = self.signer.auth("head", session, branch, new, seq)
        self.inner.set_head(session, branch, new, expected, auth=auth)
        self.seen[(session, branch)] = (new, seq)
        self.digests.pop((session, branch), None)

    def head_seq(self, session: str, branch: str) -> tuple[str, int] | None:
        """(head, sequence number) of a branch as stored, its MAC checked, without telling
        the observer: what another store's witness compares against."""
        row = self.inner.head_row(session, branch)
        if row is None:
            return None
        return row[0], self.signer.check("head", session, branch, *row)

    def commit(self, commit: Commit) -> None:
        if not commit.move_head:
            self.inner.commit(commit)
            return
        row = commit.row
        key = (row.session, row.branch)
        known = self.seen.get(key)
        if (
            known is not None
            and commit.expected_head is not None
            and known[0] == commit.expected_head
        ):
            seq = known[1] + 1
        else:
            seq = self._next_seq(row.session, row.branch, commit.expected_head)
        auth = self.signer.head_auth(row.session, row.branch, row.id, seq)
        self.inner.commit(commit.with_head_auth(auth))
        self.seen[key] = (row.id, seq)
        self.digests[key] = row.digest

    # -- labels -----------------------------------------------------------------------------
    def labels(self, session: str) -> dict[str, str]:
        out = {}
        for ident, (label, auth) in self.inner.label_rows(session).items():
            self.signer.check("label", session, label, ident, auth)
            out[ident] = label
        return out

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        if label is None:
            self.inner.set_label(ident, session, None)
            return
        rows = self.inner.label_rows(session)
        seq = 1 + max(
            (parse_seq(a) for i, (lab, a) in rows.items() if lab == label or i == ident),
            default=0,
        )
        self.inner.set_label(
            ident, session, label, self.signer.auth("label", session, label, ident, seq)
        )

    # -- marking a store ------------------------------------------------------------------------
    def authenticate(self, key_id: str) -> None:
        """Check (or, the first time, write) the store's ref marker; a keyed store only.

        Marked and valid: refs must carry MACs from now on. Marked but the MAC fails: the
        marker, the store id or the key id was altered. Not marked: a store written before
        refs were signed (or a new one): sign every ref as it is now and mark the store. A
        ref already carrying a valid MAC in an unmarked store means the marker was removed.
        """
        signer = self.signer
        value = self.inner.get_meta(metakeys.REF_AUTH)
        if value is not None:
            if not signer.marker_ok(value, key_id):
                named = value.split(".")[1] if value.count(".") == 2 else "?"
                raise IntegrityError(
                    f"store {self.url}: its integrity marker does not match its MAC under this "
                    + (
                        f"key (id {key_id}): the marker, the store id or the key id were altered"
                        if named == key_id
                        else f"key: it names key id {named}, the key given has id {key_id} "
                        "(another key, or an altered marker)"
                    )
                )
            signer.strict = True
            return
        try:
            self._sign_legacy()
        except (LeaseHeld, StoreError):
            return  # busy or read-only: stays legacy this time, signed by a later open
        self.inner.set_meta(metakeys.REF_AUTH, signer.marker(key_id))
        signer.strict = True

    def _sign_legacy(self) -> None:
        signer = self.signer
        for session in self.inner.sessions():
            for branch, (target, auth) in self.inner.head_rows(session).items():
                if signer.check("head", session, branch, target, auth) > 0:
                    raise IntegrityError(
                        f"store {self.url}: its refs carry MACs but its integrity marker is "
                        "missing: it was removed"
                    )
                self.inner.set_head(
                    session,
                    branch,
                    target,
                    target,
                    auth=signer.auth("head", session, branch, target, 1),
                )
            for ident, (label, auth) in self.inner.label_rows(session).items():
                if signer.check("label", session, label, ident, auth) > 0:
                    raise IntegrityError(
                        f"store {self.url}: its labels carry MACs but its integrity marker is "
                        "missing: it was removed"
                    )
                self.inner.set_label(
                    ident, session, label, signer.auth("label", session, label, ident, 1)
                )
