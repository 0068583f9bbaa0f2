"""Import: a checked bundle written into a store in an order a crash cannot break, and an
import into a new session that a re-run completes.

Named ``importing`` because ``import`` is a keyword.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from .._ids import new_id
from .._killpoints import KILL_ENV as KILL_ENV
from .._killpoints import kill_point as kill_point
from .._store import Store
from ..blobs.objects import BlobCodec
from ..errors import ClashError, ConflictError, IntegrityError, UsageError
from ..metakeys import import_key
from ..model import Checkpoint, LogRef
from ..stores.base import (
    GC_EPOCH_KEY,
    BlobRow,
    CheckpointRow,
    Commit,
    GcEpochChanged,
    LogAppend,
    LogInfo,
    MetadataStore,
    lease_held,
)
from .check import _check_text, _Checked
from .format import ZSTD, RecordEntry, _refused
from .read import Bundle

_BATCH_BYTES = 32 << 20


Clash = ClashError
"""Older name of :class:`~stashpoint.errors.ClashError`."""


_S = TypeVar("_S", bound=msgspec.Struct)


def _remap_logs(obj: _S, fn: Callable[[str], str]) -> _S:
    changes: dict[str, Any] = {}
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        if isinstance(value, LogRef):
            changes[name] = msgspec.structs.replace(value, log=fn(value.log))
        elif isinstance(value, msgspec.Struct):
            new = _remap_logs(value, fn)
            if new is not value:
                changes[name] = new
    return msgspec.structs.replace(obj, **changes) if changes else obj


@dataclass
class ImportReport:
    session: str
    digest: str
    checkpoints: int = 0
    """Records written."""
    present: int = 0
    """Records the store already had (same id, same digest): skipped."""
    logs: int = 0
    """Logs created or extended."""
    objects: int = 0
    """Trees, blobs and chunk lists written."""
    objects_present: int = 0
    bytes: int = 0
    """Bytes of content written."""
    pruned: int = 0
    """Records marked pruned, as they were in the source (imported without contents)."""
    heads: dict[str, dict[str, str | None]] = field(default_factory=dict)
    """Branch -> {"head": id, "action": created | fast-forward | unchanged | kept}."""
    ids: dict[str, str] = field(default_factory=dict)
    """Id in the bundle -> id in the store (they differ only when imported ``as_session``)."""
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class _LogPlan:
    log: str
    start: int
    rows: list[tuple[bytes, bytes]]
    new: LogInfo | None


def import_bundle(
    store: Store,
    bundle: Bundle,
    *,
    as_session: str | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Import a checked bundle; every check against the store happens before the first write.

    Records whose id the store has with the same digest are skipped; another digest refuses the
    bundle. A branch is created, fast-forwarded, or left where it is when the store is ahead; a
    branch whose history diverged refuses the bundle - import it ``as_session`` (records are
    then re-sealed into that new session with new ids, each naming its origin in ``meta``).

    Writes go blobs -> logs -> records -> heads, so a crash leaves only unreferenced rows that
    a rerun skips or completes. Imported ``as_session``, the new ids are noted in the store
    before the first write (see :class:`_PendingImport`): running the same import again
    reuses them, so it completes the half-done session instead of being refused as existing.
    Another writer moving a branch meanwhile, or a GC condemning blobs after they were found
    present (the ``gc_epoch`` fence), is a ConflictError; a session another worker holds a live
    lease on is refused (LeaseHeld) before the first write. Every record the bundle carries
    ends with the bundle's label, or none (a re-run carries changes).
    """
    checked = bundle.checked
    if checked is None:
        raise UsageError("import_bundle needs a bundle from read_bundle")
    m = bundle.manifest
    if as_session is None and m.keyed != store.hasher.keyed:
        raise _refused(
            "it was checked under another key than this store's; import it as a new session "
            "(--as NAME) to seal its records again under this store's key"
        )
    session = as_session or m.session
    _check_text("session name", session)
    report = ImportReport(session, bundle.digest, dry_run=dry_run)
    meta = store.meta
    if as_session is None:
        plain = store.hasher.plain()  # bundles carry plaintext bodies; sealed again on write
        records = [(plain.open(cp.id, rec.body, rec.digest), rec) for cp, rec in checked.records]
    else:  # checked by read_bundle under the key it was given, sealed again under ours: this
        records = list(checked.records)  # is how a store is encrypted or re-keyed

    pending: _PendingImport | None = None
    if as_session is not None:
        pending = _PendingImport.find(meta, session, records)
        if pending is None:
            if meta.branches(session) or meta.list_checkpoints(session, limit=1):
                raise UsageError(f"session {session!r} exists in this store; --as needs a new name")
            pending = _PendingImport(bundle.digest, {}, {})
        resumed = bool(pending.records or pending.logs)
        log_ids = {name: pending.logs.get(name) or new_id() for name in checked.logs}
        rows, report.ids = _reseal(store, records, session, log_ids, pending)
        pending.logs = log_ids
        pending.records = {cp.id: (report.ids[cp.id], rec.digest) for cp, rec in records}
        new_rows = []
        for row in rows:  # a re-run: what the interrupted import wrote is there, same digest
            existing = meta.get_checkpoint(row.id) if resumed else None
            if existing is None:
                new_rows.append(row)
            elif existing.digest != row.digest:
                raise Clash(
                    f"refusing bundle: checkpoint {row.id} of the interrupted import into "
                    f"{session!r} has other contents than this bundle gives it"
                )
            else:
                report.present += 1
    else:
        log_ids = {name: name for name in checked.logs}
        rows = [
            CheckpointRow(
                cp.id,
                cp.session,
                cp.branch,
                cp.parent,
                store.hasher.store_body(cp.id, rec.body),
                rec.digest,
            )
            for cp, rec in records
        ]
        new_rows = []
        for row in rows:
            existing = meta.get_checkpoint(row.id)
            if existing is None:
                new_rows.append(row)
            elif existing.digest != row.digest:
                raise Clash(
                    f"refusing bundle: checkpoint {row.id} exists in this store with other "
                    "contents; refusing to overwrite it"
                )
            else:
                report.present += 1
        report.ids = {row.id: row.id for row in rows}
    logs = _plan_logs(store, bundle, checked.logs, log_ids, session)
    # In the store's ids: a re-run of an interrupted import --as finds heads it set itself.
    ids = report.ids
    parents: dict[str, str | None] = {
        ids[cp.id]: ids.get(cp.parent, cp.parent) for cp, _rec in records if cp.parent
    }
    heads: list[tuple[str, str, str | None]] = []
    for branch, head in sorted(m.heads.items()):
        target = ids[head]
        action, current = _head_action(store, session, branch, target, parents)
        report.heads[branch] = {"head": target, "action": action}
        if action in ("created", "fast-forward"):
            heads.append((branch, target, current))
    fresh = {row.id for row in new_rows}
    # Every record the bundle carries gets the bundle's label (or none), also one that was
    # here already: a re-run then carries a label added, moved or removed since the last one.
    # Records the bundle does not carry keep theirs.
    here = meta.labels(session)
    want = {report.ids[i]: label for i, label in m.labels.items()}
    labels = {i: want.get(i) for i in report.ids.values() if here.get(i) != want.get(i)}
    digests = [*bundle.slots, *checked.list_sizes]
    epoch = meta.get_meta(GC_EPOCH_KEY) or "0"  # read before relying on which blobs exist
    # Only chunks live as files: asking the blob directory about small blobs costs a stat each.
    have = store.blobs.has(checked.chunks) | meta.has_blobs(
        d for d in digests if d not in checked.chunks
    )
    report.objects_present = len(have)
    report.checkpoints, report.logs = len(new_rows), len(logs)
    _check_ids(store.meta, [row.id for row in new_rows], [plan.log for plan in logs])
    if dry_run:
        report.objects = len(digests) - len(have)
        return report
    lease = meta.lease_info(session)
    if lease is not None and lease.expires_in > 0:  # refuse before writing anything
        raise lease_held(session, lease.owner, lease.expires_in)
    if pending is not None:  # before the first write: a re-run must find the ids it reuses
        meta.set_meta(import_key(session), pending.to_json())
    _write_objects(store, bundle, checked, have, report, progress)
    for plan in logs:  # session=: refused in the append's own transaction if leased meanwhile
        meta.append_log(LogAppend(plan.log, plan.start, plan.rows, plan.new, session=session))
        kill_point("import-log")
    try:
        for row in new_rows:
            meta.commit(Commit(row, None, move_head=False, gc_epoch=epoch))
            kill_point("import-record")
    except GcEpochChanged:
        raise ConflictError(
            "a garbage collection began during the import; run it again (what was written "
            "is kept and skipped)"
        ) from None
    for branch, target, current in heads:
        _bind_imported(store, session, branch, current)
        meta.set_head(session, branch, target, current)
        kill_point("import-head")
    for ident, label in sorted(labels.items(), key=lambda kv: kv[1] is not None):
        meta.set_label(ident, session, label)  # removals first: a moved label is never twice
    # Marks after their records (a mark needs its record): a crash between leaves one unmarked.
    by_time: dict[str, list[str]] = {}
    for ident, when in m.pruned.items():
        if report.ids[ident] in fresh:
            by_time.setdefault(when, []).append(report.ids[ident])
    for when, idents in sorted(by_time.items()):
        report.pruned += len(meta.mark_pruned(session, idents, when))
    if pending is not None:
        meta.set_meta(import_key(session), None)  # complete: the session is an ordinary one
    return report


def _bind_imported(store: Store, session: str, branch: str, current: str | None) -> None:
    """The root a bundle's records were snapshotted in is the sender's, not a place to
    write: a branch the import creates is bound to no directory (a restore then needs one
    named explicitly); one it fast-forwards stays bound where it was here."""
    from .. import restore_target

    if restore_target.bound_to(store, session, branch) is not None:
        return
    here = store.get(current) if current is not None else None
    if here is not None and here.workspace is not None:
        restore_target.bind(store, session, branch, Path(here.workspace.root))
    else:
        restore_target.unbind(store, session, branch)


@dataclass
class _PendingImport:
    """The ids an import ``as_session`` gives the records and logs it writes, noted in the
    store (meta ``import:<session>``) before its first write and removed after its last.

    Why: those ids are new, so a crash midway leaves records of a session with no head, or
    logs no record names, which a plain re-run would refuse ("session exists") or duplicate.
    With the note, a re-run that carries the same records (same original ids and digests: the
    same bundle, or a new export of the same history, as ``stashpoint copy --as`` makes on each
    run) reuses those ids: what was written is found present and the rest is completed. A
    bundle with other records is refused while the note is there."""

    bundle: str
    """The digest of the bundle the import began with (each record's ``stashpoint_import``
    names it, also the ones a re-run writes: records of one import are sealed alike)."""
    records: dict[str, tuple[str, str]]
    """Original id -> (id here, original digest)."""
    logs: dict[str, str]
    """Original log id -> log id here."""

    def to_json(self) -> str:
        return json.dumps(
            {"bundle": self.bundle, "records": self.records, "logs": self.logs},
            separators=(",", ":"),
        )

    @classmethod
    def find(
        cls, meta: MetadataStore, session: str, records: list[tuple[Checkpoint, RecordEntry]]
    ) -> _PendingImport | None:
        """The interrupted import into ``session`` that these records continue, if any."""
        raw = meta.get_meta(import_key(session))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            note = cls(
                str(data["bundle"]),
                {k: (str(v[0]), str(v[1])) for k, v in data["records"].items()},
                {str(k): str(v) for k, v in data["logs"].items()},
            )
        except (ValueError, TypeError, KeyError, IndexError):
            raise IntegrityError(
                f"the note of an interrupted import into session {session!r} is unreadable"
            ) from None
        digests = {cp.id: rec.digest for cp, rec in records}
        if any(digests.get(orig) != digest for orig, (_id, digest) in note.records.items()):
            raise UsageError(
                f"session {session!r} holds an interrupted import of another bundle "
                f"({note.bundle[:16]}); import that bundle --as {session!r} again to finish "
                "it, or import this one as another session"
            )
        return note


def _check_ids(meta: MetadataStore, checkpoints: list[str], logs: list[str]) -> None:
    """Refuse ids the destination cannot hold before the first write: a bundle allows 128
    characters with ``.`` and ``:``, a ``file://`` store only what can be a file name. Its
    refusal came after blobs and logs were written."""
    try:
        for ident in checkpoints:
            meta.check_id("checkpoint id", ident)
        for log in logs:
            meta.check_id("log", log)
    except UsageError as exc:
        raise _refused(f"{exc}; import it as a new session (--as NAME) for new ids") from None


def _reseal(
    store: Store,
    records: list[tuple[Checkpoint, RecordEntry]],
    session: str,
    log_ids: dict[str, str],
    pending: _PendingImport,
) -> tuple[list[CheckpointRow], dict[str, str]]:
    """The records as a new session: new ids (those an interrupted import of them gave them,
    if any), new log ids, the chain sealed again here. Sealing is deterministic, so a record
    the interrupted import wrote comes out the same and is found present."""
    ids: dict[str, str] = {}
    digests: dict[str, str] = {}
    rows = []
    for cp, rec in records:
        known = pending.records.get(cp.id)
        ids[cp.id] = known[0] if known is not None else new_id()
        parent = ids[cp.parent] if cp.parent is not None else None
        origin = {
            "id": cp.id,
            "digest": rec.digest,
            "session": cp.session,
            "bundle": pending.bundle,
        }
        new = msgspec.structs.replace(
            _remap_logs(cp, log_ids.__getitem__),
            id=ids[cp.id],
            session=session,
            parent=parent,
            parent_digest=digests[cp.parent] if cp.parent is not None else None,
            meta={**cp.meta, "stashpoint_import": origin},
            digest="",
        )
        sealed, body = store.hasher.seal(new)
        digests[cp.id] = sealed.digest
        rows.append(CheckpointRow(sealed.id, session, sealed.branch, parent, body, sealed.digest))
    return rows, ids


def _plan_logs(
    store: Store, bundle: Bundle, order: list[str], log_ids: dict[str, str], session: str
) -> list[_LogPlan]:
    """What to append to each log; a log here that disagrees with the bundle refuses it."""
    meta = store.meta
    plans = []
    for name in order:
        entry = bundle.contents.logs[name]
        target = log_ids[name]
        parent = log_ids[entry.parent] if entry.parent is not None else None
        start = entry.start
        info = meta.log_info(target)
        if info is None:
            new = LogInfo(session, parent, entry.parent_len, entry.parent_len)
            plans.append(_LogPlan(target, start, entry.rows, new))
            continue
        if (info.session, info.parent, info.parent_len) != (session, parent, entry.parent_len):
            raise Clash(f"refusing bundle: log {target} exists in this store with another origin")
        overlap = min(info.length, start + len(entry.rows))
        have = meta.read_messages(target, start, overlap) if overlap > start else []
        if [(r.chain, r.data) for r in have] != entry.rows[: overlap - start]:
            raise Clash(f"refusing bundle: log {target} exists in this store with other entries")
        if start + len(entry.rows) > info.length:
            plans.append(_LogPlan(target, info.length, entry.rows[info.length - start :], None))
    return plans


def _head_action(
    store: Store, session: str, branch: str, head: str, parents: dict[str, str | None]
) -> tuple[str, str | None]:
    current = store.meta.get_head(session, branch)
    if current is None:
        return "created", None
    if current == head:
        return "unchanged", current
    node: str | None = head
    while node is not None:
        if node == current:
            return "fast-forward", current
        node = parents.get(node)
    node, steps = current, 0
    while node is not None and steps < 10_000_000:
        if node == head:
            return "kept", current  # the store is ahead of the bundle on this branch
        row = store.meta.get_checkpoint(node)
        node, steps = (row.parent if row else None), steps + 1
    raise Clash(
        f"branch {branch!r} of session {session!r} has another history here (head {current}) "
        f"than in the bundle (head {head}); import it as a new session with --as NAME"
    )


def _write_objects(
    store: Store,
    bundle: Bundle,
    checked: _Checked,
    have: set[bytes],
    report: ImportReport,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Blobs, in file order, as they are in the bundle (zstd frames stay compressed); chunks
    before the chunk lists that name them."""
    blobs = store.blobs
    local = blobs.local
    batch: list[BlobRow] = []
    batch_bytes = 0

    def flush() -> None:
        nonlocal batch, batch_bytes
        if batch:
            store.meta.put_blobs(blobs.pack(batch))
        batch, batch_bytes = [], 0

    for digest, slot in sorted(bundle.slots.items(), key=lambda kv: kv[1].offset):
        if digest in have:
            continue
        codec: int = BlobCodec.ZSTD if slot.codec == ZSTD else BlobCodec.RAW
        codec, payload = blobs.seal_frame(digest, codec, bundle.payload(digest))
        if digest in checked.chunks and local is not None:
            local.put(digest, codec, slot.size, payload)
        else:
            batch.append(BlobRow(digest, codec, slot.size, payload))
            batch_bytes += len(payload)
            if batch_bytes >= _BATCH_BYTES:
                flush()
        report.objects += 1
        report.bytes += slot.size
        if progress is not None:
            progress(report.objects, report.bytes)
    flush()
    lists = [
        BlobRow(d, BlobCodec.CHUNKS, size, bundle.contents.lists[d])
        for d, size in checked.list_sizes.items()
        if d not in have
    ]
    if lists:
        store.meta.put_blobs(lists)
        report.objects += len(lists)
