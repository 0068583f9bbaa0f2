"""Mirrored writes: every checkpoint also goes to a second store.

``open_store(url, mirror=url2)`` (CLI ``--mirror URL``, env ``STASHPOINT_MIRROR``) returns a
:class:`MirroredStore`. The contract:

* **Writes go to the primary, then the mirror.** The primary write is the one that counts: it
  succeeds or fails exactly as without a mirror. Copying to the mirror happens after it, and
  any failure there (server down, conflict, damage in the primary) is *recorded*, never
  raised: the store meta key ``mirror:behind`` says since when and why, ``verify --mirror``
  reports it, and the next successful write catches the mirror up (a full sync) before
  clearing it.
* **What is copied:** checkpoint records (byte for byte, so the hash chain and keyed digests
  verify there too), everything they reference (state values, workspace trees and file
  contents, artifacts, conversation and journal logs), branch heads, labels and pruned marks
  (a pruned record is copied without its contents: GC may have freed them). Blobs are copied as
  verified content and stored inline in the mirror's metadata store, whatever the primary's
  placement (packs and chunk files are local to the primary). Damage is never copied: records
  and blobs are verified on the way. Store-local bookkeeping (GC marks and epochs, durable-run
  records) stays with each store; run ``gc`` on each store separately.
* **Reads fall back to the mirror** when the primary's record or blob fails verification
  (:class:`IntegrityError`), is missing, or the primary is unreachable (:class:`StoreError`),
  with a warning naming what was damaged. Conversation logs are read from the primary only.
* A mirror that cannot be opened at all leaves a working primary: writes proceed and the
  mirror is marked behind.

Why a wrapper around the engine's store, not a dual-writing backend: the mirror may be another
kind of store (SQLite primary, PostgreSQL mirror) with other blob placement, and verified
fallback reads need the record and blob verification that sits above the backends.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import metakeys
from ._store import Problem, Store
from .blobs.objects import BlobCodec, Blobs
from .errors import (
    ConflictError,
    IntegrityError,
    MirrorWarning,
    NotFoundError,
    StashpointError,
    StoreError,
    UsageError,
)
from .integrity import message_chain
from .model import Checkpoint, utc_now_iso
from .stores import formats
from .stores.base import (
    BlobRow,
    CheckpointRow,
    Commit,
    Fence,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
    MetaKV,
)
from .stores.forwarding import ForwardingStore
from .workspace.tree import TreeReader

__all__ = [
    "BEHIND_KEY",
    "MirrorReport",
    "MirrorWarning",
    "MirroredStore",
    "compare_stores",
    "mirrored",
]

BEHIND_KEY = metakeys.MIRROR_BEHIND
"""Primary store meta key: JSON ``{"mirror", "since", "error"}`` while the mirror lags."""

_FAILED = metakeys.MIRROR_FAILED
"""Prefix of one more key per failed copy (``mirror:behind:<token>``, the same JSON). A writer
that caught the mirror up clears only the marks it saw before its sync: a failure recorded
meanwhile has a key of its own and survives, and no key is ever read, changed and written
back, so no interleaving of writers can lose a failure (a compare-and-set on one key would
not do better). What a race can leave is a summary without failure keys (one more full sync
on the next write) or failure keys without a summary: readers take the whole prefix."""


def _behind_marks(meta: MetaKV) -> dict[str, str]:
    """The summary mark and every failure's own mark (one read: the same key prefix)."""
    return dict(meta.iter_meta(BEHIND_KEY))


def _since(raw: str) -> str:
    try:
        return str(json.loads(raw).get("since", ""))
    except (ValueError, AttributeError):
        return ""


def _clear_behind(meta: MetaKV, seen: dict[str, str]) -> None:
    """After a full sync: drop the failure marks seen before it began; the summary goes only
    when no failure recorded since then is left."""
    for key in seen:
        if key.startswith(_FAILED):
            meta.set_meta(key, None)
    if not any(True for _ in meta.iter_meta(_FAILED)):
        meta.set_meta(BEHIND_KEY, None)


_T = TypeVar("_T")
_V = TypeVar("_V")

_BATCH_BYTES = 8 << 20
_BATCH_MESSAGES = 1000


class _Replicator:
    """Copies checkpoints and what they reference from a verified primary to a mirror."""

    def __init__(self, primary: Store, mirror: Store, *, follow_back: bool = False) -> None:
        self.p = primary
        self.m = mirror
        self.reader = TreeReader(primary.blobs)
        self.follow_back = follow_back
        """The user accepted a primary older than its mirror: copy its heads back."""

    # -- blobs ----------------------------------------------------------------------------
    def blobs(self, digests: Iterable[bytes]) -> None:
        wanted = list(dict.fromkeys(digests))
        have = self.m.meta.has_blobs(wanted)
        missing = [d for d in wanted if d not in have]
        batch: list[BlobRow] = []
        size = 0
        for d in missing:
            row = self.p.meta.get_blob(d)
            if row is not None and row.codec == BlobCodec.CHUNKS:
                data = row.data
                self.blobs(data[i : i + 32] for i in range(0, len(data) - len(data) % 32, 32))
                new = row  # the chunk list itself; its chunks are in the mirror now
            else:
                new = self.m.blobs.encode(d, self.p.blobs.read(d))  # verified on the way
            batch.append(new)
            size += len(new.data)
            if size >= _BATCH_BYTES:
                self.m.meta.put_blobs(batch)
                batch, size = [], 0
        if batch:
            self.m.meta.put_blobs(batch)

    def tree(self, root: bytes) -> None:
        """Children before parents, so a tree in the mirror implies its whole subtree."""
        if self.m.meta.has_blobs([root]):
            return
        entries = self.reader.load(root).values()
        self.blobs(e.ref for e in entries if e.kind == "f")
        dirs = [e.ref for e in entries if e.kind == "d"]
        have = self.m.meta.has_blobs(dirs)
        for d in dirs:
            if d not in have:
                self.tree(d)
        self.blobs([root])

    # -- logs -----------------------------------------------------------------------------
    def log(self, log: str, depth: int = 0) -> None:
        pi = self.p.meta.log_info(log)
        if pi is None or depth > 1000:
            return None
        if pi.parent is not None:
            self.log(pi.parent, depth + 1)
        mi = self.m.meta.log_info(log)
        own_start = pi.parent_len if pi.parent is not None else 0
        start = mi.length if mi is not None else own_start
        if start >= pi.length:
            return None
        prev: bytes | None = None
        if mi is not None and start > own_start:
            last = self.m.meta.read_messages(log, start - 1, start)
            prev = last[0].chain if last else None
        new = None if mi is not None else LogInfo(pi.session, pi.parent, pi.parent_len, start)
        while start < pi.length:
            rows = self.p.meta.read_messages(log, start, min(pi.length, start + _BATCH_MESSAGES))
            for i, r in enumerate(rows):
                if r.idx != start + i or (
                    prev is not None and bytes.fromhex(message_chain(prev.hex(), r.data)) != r.chain
                ):
                    raise IntegrityError(f"log {log} is damaged in the primary at {start + i}")
                prev = r.chain
            if not rows:
                raise IntegrityError(f"log {log} is missing messages in the primary at {start}")
            try:
                self.m.meta.append_log(
                    LogAppend(log, start, [(r.chain, r.data) for r in rows], new)
                )
            except ConflictError:
                if depth > 1000:
                    raise
                return self.log(log, depth + 1)  # another process appended: start again
            start += len(rows)
            new = None
        return None

    # -- checkpoints, heads, labels -------------------------------------------------------
    def checkpoint(self, ident: str, marks: dict[str, dict[str, str]] | None = None) -> None:
        """Copy a checkpoint and every ancestor the mirror lacks, oldest first. ``marks``:
        session -> the primary's pruned marks, read once per session (a cache for ``sync``)."""
        chain: list[CheckpointRow] = []
        cur: str | None = ident
        while cur is not None and self.m.meta.get_checkpoint(cur) is None:
            row = self.p.meta.get_checkpoint(cur)
            if row is None:
                raise NotFoundError(f"checkpoint {cur} is missing from the primary")
            chain.append(row)
            cur = row.parent
        marks = {} if marks is None else marks
        for row in reversed(chain):
            cp = self.p.open_row(row)  # never copy damage
            known = marks.get(row.session)
            if known is None or row.id not in known:
                try:
                    self.contents(cp)
                except NotFoundError:
                    # A pruned record's contents may be freed by GC already: copy the record
                    # alone (the chain needs it) and its pruned mark. Read the marks only
                    # here: a session's marks can be many, and a new checkpoint has none.
                    if known is None:
                        known = marks[row.session] = self.p.meta.pruned(row.session)
                    if row.id not in known:
                        raise
            try:
                self.m.meta.commit(Commit(row, None, move_head=False))
            except ConflictError:
                if self.m.meta.get_checkpoint(row.id) is None:
                    raise
                # another process copied it first (they share the mirror): fine
        for session in {row.session for row in chain} & marks.keys():
            ids = [row.id for row in chain if row.id in marks[session]]
            if ids:
                self.pruned(session, {i: marks[session][i] for i in ids})

    def contents(self, cp: Checkpoint) -> None:
        self.blobs(bytes.fromhex(h) for h in cp.state.values.values())
        if cp.workspace is not None:
            self.tree(bytes.fromhex(cp.workspace.tree))
        # An artifact is a blob or a chunk list (artifacts.py): blobs() copies both kinds.
        self.blobs(bytes.fromhex(a.digest) for a in cp.artifacts.values())
        for ref in (cp.state.conversation, cp.journal):
            if ref is not None:
                self.log(ref.log)

    def heads(self, session: str, only: str | None = None) -> None:
        """Copy the session's branch heads; ``only``: the one branch a write just moved (every
        earlier failure is caught up by ``sync``, so the others need no reads)."""
        for branch in [only] if only is not None else self.p.meta.branches(session):
            for _attempt in range(5):
                current = self.m.refs.head_seq(session, branch)
                # The primary's head read after the mirror's: a writer copies its head to the
                # mirror only once the primary has it, so this is never older than what another
                # writer copied meanwhile (read first, a stale head moved the mirror backwards).
                mine = self.p.refs.head_seq(session, branch)  # its MAC checked
                if mine is None:
                    break
                head, seq = mine
                old = current[0] if current is not None else None
                if old == head and current is not None and seq <= current[1]:
                    break  # there already (a higher sequence number is re-stamped below)
                if (
                    current is not None
                    and old != head
                    and 0 < seq <= current[1]
                    and not self.follow_back
                ):
                    raise IntegrityError(
                        f"branch {branch!r} of session {session!r} is at sequence {seq} in the "
                        f"primary and {current[1]} in the mirror: the primary is older than "
                        "its mirror (rolled back, or its tip forged); nothing copied"
                    )
                self.checkpoint(head)
                try:
                    if seq > 0:  # the primary's number: each store can witness the other
                        self.m.refs.copy_head(session, branch, head, old, seq)
                    else:  # refs from before sequence numbers: the mirror numbers its own
                        self.m.meta.set_head(session, branch, head, old)
                    break
                except ConflictError:
                    continue

    def labels(self, session: str) -> None:
        """Labels have no compare-and-set: another writer may change a label between our read
        of the primary and our write to the mirror, and our stale write would land last. So
        read the primary again after writing: unchanged means whatever changes it later is
        copied by its writer after ours; changed means copy again."""
        want = self.p.meta.labels(session)
        for _attempt in range(5):
            have = self.m.meta.labels(session)
            for ident, label in want.items():
                if have.get(ident) != label and self.m.meta.get_checkpoint(ident) is not None:
                    self.m.meta.set_label(ident, session, label)
            for ident in have.keys() - want.keys():
                self.m.meta.set_label(ident, session, None)
            now = self.p.meta.labels(session)
            if now == want:
                return
            want = now
        raise ConflictError(f"the labels of session {session!r} kept changing while copied")

    def pruned(self, session: str, want: dict[str, str] | None = None) -> None:
        """Copy pruned marks (``want``: id -> when; default all of the session's) that the
        mirror lacks, for records it has. A prune is never undone, so marks only get added."""
        want = self.p.meta.pruned(session) if want is None else want
        have = self.m.meta.pruned(session)
        by_time: dict[str, list[str]] = {}
        for ident, at in want.items():
            if ident not in have:
                by_time.setdefault(at, []).append(ident)
        for at, ids in sorted(by_time.items()):
            self.m.meta.mark_pruned(session, ids, at)  # skips what the mirror lacks

    def sync(self) -> None:
        """Bring the whole mirror up to the primary (after it was down, or when it is new)."""
        for session in self.p.meta.sessions():
            marks = {session: self.p.meta.pruned(session)}
            for row in reversed(self.p.meta.list_checkpoints(session)):
                self.checkpoint(row.id, marks)
            self.heads(session)
            self.labels(session)
            self.pruned(session)  # after heads: a mirror never marks its own head pruned
        for log, _info in self.p.meta.iter_logs():
            self.log(log)


class _MirroredMeta(ForwardingStore):
    """The primary's metadata store, with writes copied to the mirror after they succeed and
    reads served by the mirror while the primary is unreachable. Everything else - leases,
    blob checks a writer relies on, GC marks - is the primary's own business
    and passes through; blobs reach the mirror with the checkpoints that reference them."""

    def __init__(self, primary: MetadataStore, store: MirroredStore) -> None:
        super().__init__(primary)
        self.store = store
        self._warned = False

    # -- the write path -------------------------------------------------------------------
    def _then_mirror(self, copy: Callable[[_Replicator], None]) -> None:
        rep = self.store.replicator
        if rep is None:
            self._behind(self.store.mirror_error or "the mirror could not be opened")
            return
        try:
            seen = _behind_marks(self.inner)
            if seen:
                rep.sync()
                _clear_behind(self.inner, seen)
            copy(rep)
        except Exception as exc:
            self._behind(f"{type(exc).__name__}: {exc}")

    def _behind(self, error: str) -> None:
        marks = _behind_marks(self.inner)
        summary = marks.get(BEHIND_KEY)
        if summary is None:  # keep the first failure's time and reason
            firsts = [v for k, v in marks.items() if k.startswith(_FAILED)]
            summary = min(firsts, key=_since) if firsts else None
        if summary is None:
            record = {"mirror": self.store.mirror_url, "since": utc_now_iso(), "error": error}
            summary = json.dumps(record)
        # Our own key first, then drop the older failure keys: ours covers them (a sync that
        # may clear ours begins after it exists, so after all of them), and they stay few.
        self.inner.set_meta(_FAILED + uuid.uuid4().hex, summary)
        for key in marks:
            if key.startswith(_FAILED):
                self.inner.set_meta(key, None)
        if BEHIND_KEY not in marks:
            self.inner.set_meta(BEHIND_KEY, summary)
        if not self._warned:  # once per store object, in every process
            self._warned = True
            warnings.warn(
                f"the mirror {self.store.mirror_url} is behind ({error}); the primary has "
                "every checkpoint and the mirror catches up on a later write",
                MirrorWarning,
                stacklevel=4,
            )

    def commit(self, commit: Commit) -> None:
        self.inner.commit(commit)
        row = commit.row

        def copy(rep: _Replicator) -> None:
            rep.checkpoint(row.id)
            if commit.move_head:
                rep.heads(row.session, row.branch)

        self._then_mirror(copy)

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
        self.inner.set_head(session, branch, new, expected, fence=fence, auth=auth)
        self._then_mirror(lambda rep: rep.heads(session, branch))

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        self.inner.set_label(ident, session, label, auth)
        self._then_mirror(lambda rep: rep.labels(session))

    def append_log(self, append: LogAppend) -> None:
        self.inner.append_log(append)
        self._then_mirror(lambda rep: rep.log(append.log))

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        marked = self.inner.mark_pruned(session, ids, at)
        if marked:  # the mirror's verify and GC must see the same pruned records
            self._then_mirror(lambda rep: rep.pruned(session, dict.fromkeys(marked, at)))
        return marked

    # -- reads: the primary, or the mirror while the primary is unreachable ----------------
    def _read(self, call: Callable[[MetadataStore], _T]) -> _T:
        try:
            return call(self.inner)
        except StoreError as exc:
            mirror = self.store.mirror
            if mirror is None:
                raise
            warnings.warn(
                f"primary store unreachable ({exc}); reading from the mirror",
                MirrorWarning,
                stacklevel=3,
            )
            return call(mirror.meta)

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        return self._read(lambda m: m.get_checkpoint(ident))

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        return self._read(lambda m: m.list_checkpoints(session, before=before, limit=limit))

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        return self._read(lambda m: m.find_ids(prefix, session))

    def sessions(self) -> list[str]:
        return self._read(lambda m: m.sessions())

    def branches(self, session: str) -> dict[str, str]:
        return self._read(lambda m: m.branches(session))

    def get_head(self, session: str, branch: str) -> str | None:
        return self._read(lambda m: m.get_head(session, branch))

    def labels(self, session: str) -> dict[str, str]:
        return self._read(lambda m: m.labels(session))

    def log_info(self, log: str) -> LogInfo | None:
        return self._read(lambda m: m.log_info(log))

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        return self._read(lambda m: m.read_messages(log, start, stop))

    def get_blob(self, digest: bytes) -> BlobRow | None:
        return self._read(lambda m: m.get_blob(digest))

    def get_meta(self, key: str) -> str | None:
        return self._read(lambda m: m.get_meta(key))


class _FallbackBlobs(Blobs):
    """The primary's blob layer; a blob that fails verification there is read from the mirror."""

    mirror: Blobs | None
    label: str

    def read_many(self, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        """The batch read (a restore's prefetch); if any blob fails on the primary, each is
        read again through :meth:`iter_content`, which falls back to the mirror."""
        try:
            return super().read_many(digests)
        except (IntegrityError, NotFoundError, StoreError):
            if self.mirror is None:
                raise
            return {d: self.read(d) for d in digests}

    def iter_content(self, digest: bytes) -> Iterator[bytes]:
        sent = 0
        try:
            for part in super().iter_content(digest):
                sent += len(part)
                yield part
            return
        except (IntegrityError, NotFoundError, StoreError) as exc:
            if self.mirror is None:
                raise
            failure = exc
        skip = sent  # a chunked blob may have failed half-way: resume where it stopped
        try:
            parts = self.mirror.iter_content(digest)
            first = True
            for part in parts:
                if first:
                    warnings.warn(
                        f"{failure}; read it from the mirror {self.label}", MirrorWarning, 2
                    )
                    first = False
                if skip >= len(part):
                    skip -= len(part)
                    continue
                yield part[skip:]
                skip = 0
        except StashpointError:
            raise failure from None


class MirroredStore(Store):
    """A :class:`Store` whose checkpoints are also written to a mirror store."""

    def __init__(
        self,
        primary: Store,
        mirror: Store | None,
        mirror_url: str,
        error: str = "",
        *,
        accept_rollback: bool = False,
    ) -> None:
        # Adopt the primary's parts rather than opening them a second time: its blob
        # directory lock and worker pool are already there, and GC counts open stores.
        self.__dict__.update(vars(primary))
        self.primary = primary
        """The primary alone (no fallback): what ``verify`` checks."""
        self.mirror = mirror
        self.mirror_url = mirror_url
        self.mirror_error = error
        self.accept_rollback = accept_rollback
        self.replicator = (
            _Replicator(primary, mirror, follow_back=accept_rollback)
            if mirror is not None
            else None
        )
        self.meta = _MirroredMeta(primary.meta, self)
        blobs = _FallbackBlobs.__new__(_FallbackBlobs)
        blobs.__dict__.update(vars(primary.blobs))
        blobs.meta = self.meta
        blobs.mirror = mirror.blobs if mirror is not None else None
        blobs.label = mirror_url
        self.blobs = blobs
        if mirror is not None and primary.format == mirror.format == formats.CURRENT:
            from .witness import MirrorWitness

            primary.refs.observer = MirrorWitness(
                primary.refs,
                mirror.refs,
                mirror_url,
                primary.refs.observer,
                accept=accept_rollback,
            )

    def get(self, ident: str, *, check_parent: bool = True) -> Checkpoint:
        try:
            return super().get(ident, check_parent=check_parent)
        except (IntegrityError, NotFoundError) as exc:
            if self.mirror is None:
                raise
            try:
                cp = self.mirror.get(ident, check_parent=check_parent)
            except StashpointError:
                raise exc from None
            if isinstance(exc, IntegrityError):
                warnings.warn(
                    f"{exc.args[0]}; read it from the mirror {self.mirror_url}",
                    MirrorWarning,
                    stacklevel=2,
                )
            return cp

    def open_row(self, row: CheckpointRow) -> Checkpoint:
        try:
            return super().open_row(row)
        except IntegrityError as exc:
            good = self.mirror.meta.get_checkpoint(row.id) if self.mirror is not None else None
            if self.mirror is None or good is None:
                raise
            try:
                cp = self.mirror.open_row(good)
            except StashpointError:
                raise exc from None
            warnings.warn(
                f"{exc.args[0]}; read it from the mirror {self.mirror_url}",
                MirrorWarning,
                stacklevel=2,
            )
            return cp

    def sync_mirror(self) -> None:
        """Copy everything the mirror lacks now (also clears the "behind" mark)."""
        if self.replicator is None:
            raise StoreError(f"the mirror {self.mirror_url} is not reachable: {self.mirror_error}")
        seen = _behind_marks(self.primary.meta)
        self.replicator.sync()
        _clear_behind(self.primary.meta, seen)

    def close(self) -> None:
        if self.wrote:
            self.primary.wrote = True  # its upkeep runs on its own records, not the mirror's
        self.primary.close()
        if self.mirror is not None:
            self.mirror.close()


def mirrored(
    primary: Store,
    mirror_url: str,
    open_mirror: Callable[[str], Store],
    *,
    accept_rollback: bool = False,
) -> MirroredStore:
    """Wrap ``primary`` so that its checkpoints are also written to the store at ``mirror_url``.

    A mirror that cannot be opened does not stop the primary (see the module docstring). The
    mirror also witnesses the primary's heads: a primary older than its mirror is refused
    (:class:`~stashpoint.witness.MirrorWitness`) unless ``accept_rollback``.
    """
    try:
        mirror: Store | None = open_mirror(mirror_url)
        error = ""
    except StoreError as exc:
        mirror, error = None, f"cannot open the mirror: {exc}"
        warnings.warn(
            f"mirror {mirror_url} unavailable ({exc}); writing to the primary only",
            MirrorWarning,
            stacklevel=3,
        )
    except BaseException:  # a bad URL (UsageError) and the like: nothing stays open
        primary.close()
        raise
    if mirror is not None and mirror.url == primary.url:
        mirror.close()
        primary.close()
        raise UsageError(f"the mirror {mirror_url} is the primary store itself")
    return MirroredStore(primary, mirror, mirror_url, error, accept_rollback=accept_rollback)


# -- verify --mirror ------------------------------------------------------------------------
@dataclass
class MirrorReport:
    """What ``stashpoint verify --mirror`` found."""

    primary: str
    mirror: str
    checkpoints: int = 0
    """Checkpoint ids compared (the union of both stores)."""
    damaged: list[Problem] = field(default_factory=list)
    """Integrity problems on either side, or records whose digests disagree."""
    behind: list[Problem] = field(default_factory=list)
    """What the mirror lacks or has older (heads, checkpoints): lag, not damage."""
    behind_since: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "in_sync": self.ok and not self.behind and self.behind_since is None,
            "primary": self.primary,
            "mirror": self.mirror,
            "checkpoints": self.checkpoints,
            "damaged": [p.to_dict() for p in self.damaged],
            "behind": [p.to_dict() for p in self.behind],
            "behind_since": self.behind_since,
        }


def compare_stores(primary: Store, mirror: Store) -> MirrorReport:
    """Verify both stores and compare them: checkpoint ids and digests, heads, and (through
    each side's full verification) every referenced blob."""
    from .verify import _Verifier, verify_store

    primary = getattr(primary, "primary", primary)  # never judge the primary through fallback
    report = MirrorReport(primary.url, mirror.url)
    checker = _Verifier(primary, None)
    checker.run()
    # A record damaged in the primary hides what it references there: check those blobs and
    # logs in the primary too, through the mirror's intact copy of the record.
    for ident in sorted({p.checkpoint for p in checker.report.problems if p.checkpoint}):
        prow, mrow = primary.meta.get_checkpoint(ident), mirror.meta.get_checkpoint(ident)
        if prow is None or mrow is None:
            continue
        try:
            primary.open_row(prow)
            continue  # its record is fine: its contents were checked already
        except IntegrityError:
            pass
        try:
            checker.contents(mirror.open_row(mrow))
        except StashpointError:
            continue
    for p in checker.report.problems:
        report.damaged.append(Problem(f"primary: {p.message}", p.checkpoint, p.session))
    for p in verify_store(mirror).problems:
        report.damaged.append(Problem(f"mirror: {p.message}", p.checkpoint, p.session))
    marks = _behind_marks(primary.meta)
    raw = marks.get(BEHIND_KEY) or next(iter(marks.values()), None)
    if raw is not None:
        try:
            report.behind_since = json.loads(raw)
        except ValueError:
            report.behind_since = {"error": raw}
    sessions = sorted(set(primary.meta.sessions()) | set(mirror.meta.sessions()))
    for session in sessions:
        p_rows = {r.id: r.digest for r in primary.meta.list_checkpoints(session)}
        m_rows = {r.id: r.digest for r in mirror.meta.list_checkpoints(session)}
        report.checkpoints += len(p_rows.keys() | m_rows.keys())
        for ident in sorted(p_rows.keys() | m_rows.keys()):
            pd, md = p_rows.get(ident), m_rows.get(ident)
            if md is None:
                report.behind.append(
                    Problem(f"checkpoint {ident} is not in the mirror yet", ident, session)
                )
            elif pd is None:
                report.damaged.append(
                    Problem(
                        f"checkpoint {ident} is in the mirror but missing from the primary",
                        ident,
                        session,
                    )
                )
            elif pd != md:
                report.damaged.append(
                    Problem(
                        f"checkpoint {ident} has different digests in the primary and the mirror",
                        ident,
                        session,
                    )
                )
        labels = _differing(primary.meta.labels(session), mirror.meta.labels(session))
        for ident, pl, ml in labels:
            text = f"checkpoint {ident}: primary label {pl!r}, mirror label {ml!r}"
            report.behind.append(Problem(text, ident, session))
        heads = _differing(_head_seqs(primary, session), _head_seqs(mirror, session))
        for branch, pv, mv in heads:
            where = f"branch {branch!r} of session {session!r}"
            if pv is not None and mv is not None and 0 < pv[1] <= mv[1]:
                # The mirror is written after the primary, with its sequence numbers: it is
                # never ahead of a genuine primary (see MirrorWitness).
                how = (
                    f"the primary was rolled back from seq {mv[1]} to {pv[1]}"
                    if pv[1] < mv[1]
                    else f"a forged or forked tip: both are at seq {pv[1]}"
                )
                text = f"{where}: primary head {pv[0]}, mirror head {mv[0]}: {how}"
                report.damaged.append(Problem(text, pv[0], session))
            else:
                ph, mh = (pv[0] if pv else None), (mv[0] if mv else None)
                text = f"{where}: primary head {ph}, mirror head {mh}"
                report.behind.append(Problem(text, ph or mh, session))
    return report


def _head_seqs(store: Store, session: str) -> dict[str, tuple[str, int]]:
    """Branch -> (head, sequence number) as stored (a head whose MAC fails counts as seq 0:
    that store's own verification reports it)."""
    out = {}
    for branch, (target, auth) in store.refs.inner.head_rows(session).items():
        try:
            out[branch] = (target, store.refs.signer.check("head", session, branch, target, auth))
        except IntegrityError:
            out[branch] = (target, 0)
    return out


def _differing(
    primary: dict[str, _V], mirror: dict[str, _V]
) -> list[tuple[str, _V | None, _V | None]]:
    """(key, primary's value, mirror's value) wherever the two differ, by key."""
    keys = sorted(primary.keys() | mirror.keys())
    return [(k, primary.get(k), mirror.get(k)) for k in keys if primary.get(k) != mirror.get(k)]
