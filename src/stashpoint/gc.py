"""Garbage collection: free the blobs and logs that no kept checkpoint references.

Mark and sweep. The roots are every checkpoint that retention has not pruned (its state
values, its workspace tree, its conversation and journal logs), the logs of live durable runs,
and the parents of every referenced log. Marking walks trees down to file blobs and chunk
lists down to chunks; everything stored and not reached is garbage: inline rows, packed rows
(then their pack files), chunk files in the blob directory, whole logs.

Safe while writers run. A writer checks which blobs exist, skips storing those (dedup, and the
stat cache vouches for unchanged files), and commits a record that references them: a blob
that is garbage when GC looks may be needed again a moment later. So GC does not delete
garbage when it finds it; it *condemns* it (one transaction that also bumps ``gc_epoch``,
invalidating stat caches). From then on a condemned blob counts as absent: a writer that
needs it stores it again, which revives it, atomically against GC's claim. A writer that
checked before the condemnation is *in flight*; GC deletes a condemned blob only when no such
writer can remain:

* at once, when it holds the store exclusively: no other store object is open in any process
  (the blob directory's ``flock``) and no thread of this process is between a blob check and
  its commit - the common case of ``stashpoint gc`` run while no agent is writing; or
* once the blob has been condemned for ``grace`` seconds (default 10 minutes), longer than a
  snapshot takes from its existence checks to its commit.

Before deleting, GC marks again, so records committed meanwhile keep what they reference.
References go before blobs; each deletion claims its mark in the same transaction
as the row delete (chunk files are unlinked inside that transaction), so it is idempotent and
a SIGKILL at any instant leaves only garbage that the next run finishes.

Packs are immutable: a pack whose live entries are less than half its bytes is rewritten (new
pack written and fsynced, rows repointed by compare-and-set, old pack deleted); packs left with
no rows are deleted. Packs that a sweep or a repack may leave without rows are noted in store
meta first, so a run interrupted in between leaves them to the next run, which deletes them.
Readers that race a repack re-read the row.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from . import metakeys
from ._fsutil import TMP_MARK, sweep_temp_files
from ._ids import new_id
from .blobs.local import LocalBlobStore
from .blobs.objects import BlobCodec, PackPointer, make_pointer, parse_pointer
from .errors import (
    GcBusy,
    IntegrityError,
    NotFoundError,
    UpgradeRequired,
)
from .model import Checkpoint
from .stores.base import BlobInfo, CheckpointRow
from .workspace.tree import TreeReader

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["DEFAULT_GRACE", "GcBusy", "GcReport", "Usage", "collect", "usage"]

DEFAULT_GRACE = 600.0
"""Seconds a condemned blob waits when other processes have the store open."""
ORPHAN_PACK_AGE = 3600.0
"""A pack no row points to and no GC wrote is deleted only after this long: a writer writes
its pack just before committing the rows that point into it."""
REPACK_BELOW = 0.5
"""Repack when live entries fill less than this fraction of a pack."""
_PACKS_KEY = metakeys.GC_PACKS
_LOGS_KEY = metakeys.GC_LOGS
_PACK_HEADER = 8  # len(b"SPPACK1\n")

Progress = Callable[[int, int], None]
_unverified = msgspec.json.Decoder(Checkpoint)


@dataclass
class GcReport:
    dry_run: bool = False
    exclusive: bool = False
    """Whether GC held the store alone (then nothing had to wait out the grace period)."""
    grace: float = DEFAULT_GRACE
    checkpoints: int = 0
    pruned: int = 0
    """Checkpoints whose contents are released (pruned by retention)."""
    live_blobs: int = 0
    live_bytes: int = 0
    garbage_blobs: int = 0
    """Blobs no kept checkpoint references, when GC looked."""
    garbage_bytes: int = 0
    garbage_logs: int = 0
    garbage_log_bytes: int = 0
    condemned: int = 0
    """Blobs condemned by this run."""
    revived: int = 0
    """Condemned blobs found referenced again (their marks were removed)."""
    freed_blobs: int = 0
    freed_logs: int = 0
    freed_db_bytes: int = 0
    """Row payloads deleted from the metadata database (blobs and log messages)."""
    freed_file_bytes: int = 0
    """Chunk files and pack bytes deleted from the blob directory."""
    packs_deleted: int = 0
    packs_repacked: int = 0
    temp_files: int = 0
    pending_blobs: int = 0
    """Condemned blobs waiting for the grace period (another process had the store open)."""
    pending_bytes: int = 0
    pending_logs: int = 0
    collectable_after: str | None = None
    """When a later ``gc`` can free the pending ones (ISO 8601 UTC)."""
    vacuumed: bool = False
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return self.freed_db_bytes + self.freed_file_bytes

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out["freed_bytes"] = self.freed_bytes
        return out


# -- inventory and marking --------------------------------------------------------------------
@dataclass
class _Inventory:
    rows: dict[bytes, BlobInfo]
    loose: dict[bytes, int]
    packs: dict[str, tuple[int, float]]

    def cost(self, digest: bytes) -> int:
        """Bytes a blob occupies where it is stored (row data, pack entry, chunk file)."""
        n = self.loose.get(digest, 0)
        row = self.rows.get(digest)
        if row is not None:
            n += row.stored
            if row.codec == BlobCodec.PACKED and row.ref is not None:
                p = parse_pointer(row.ref)
                n += p.length if p is not None else 0
        return n


def _inventory(store: Store) -> _Inventory:
    local = store.blobs.local
    packs = local.packs() if local is not None else {}  # before the rows: see _packs()
    rows = {info.digest: info for info in store.meta.iter_blob_info()}
    loose = dict(local.iter_sizes()) if local is not None else {}
    return _Inventory(rows, loose, packs)


class _Unreadable(IntegrityError):
    """GC cannot tell what a checkpoint references; it deletes nothing."""


class _Marker:
    """Everything reachable from the checkpoints that are not pruned; incremental: a second
    :meth:`run` walks only records committed since the first."""

    def __init__(self, store: Store, inv: _Inventory, progress: Progress | None) -> None:
        self.store = store
        self.inv = inv
        self.progress = progress
        self.reader = TreeReader(store.blobs)
        self.reachable: set[bytes] = set()
        self.logs: set[str] = set()
        self.seen: set[str] = set()
        self.pruned = 0
        self.records = 0
        self._pruned_ids: dict[str, set[str]] = {}
        self._visited = 0

    def run(self, sessions: set[str] | None = None) -> None:
        for row in self.store.meta.iter_checkpoints():
            if row.id in self.seen or (sessions is not None and row.session not in sessions):
                continue
            self.seen.add(row.id)
            self.records += 1
            marks = self._pruned_ids.get(row.session)
            if marks is None:
                marks = self._pruned_ids[row.session] = set(self.store.meta.pruned(row.session))
            if row.id in marks:
                self.pruned += 1
                continue
            self.checkpoint(self._open(row))

    def _open(self, row: CheckpointRow) -> Checkpoint:
        try:
            return self.store.open_row(row)
        except IntegrityError:
            pass
        try:  # damaged or foreign-keyed: its references still count, conservatively
            return _unverified.decode(self.store.hasher.plain_body(row.id, row.body))
        except (msgspec.DecodeError, IntegrityError):
            raise _Unreadable(
                f"gc stopped: checkpoint {row.id} is unreadable, so what it references is "
                "unknown; nothing was deleted (run stashpoint verify)",
                checkpoint=row.id,
            ) from None

    def checkpoint(self, cp: Checkpoint) -> None:
        for hexd in cp.state.values.values():
            self.blob(bytes.fromhex(hexd))
        for art in cp.artifacts.values():  # chunk lists, followed down to their chunks
            self.blob(bytes.fromhex(art.digest))
        for ref in (cp.state.conversation, cp.journal):
            if ref is not None:
                self.logs.add(ref.log)
        if cp.workspace is not None:
            try:
                self.tree(bytes.fromhex(cp.workspace.tree))
            except (IntegrityError, NotFoundError) as exc:
                raise _Unreadable(
                    f"gc stopped: the workspace of checkpoint {cp.id} cannot be read ({exc}); "
                    "nothing was deleted (run stashpoint verify)",
                    checkpoint=cp.id,
                ) from None

    def blob(self, digest: bytes) -> None:
        if digest in self.reachable:
            return
        self.reachable.add(digest)
        info = self.inv.rows.get(digest)
        if info is None:  # stored after the inventory: ask the store
            row = self.store.meta.get_blob(digest)
            info = (
                BlobInfo(row.digest, row.codec, row.size, len(row.data), row.data) if row else None
            )
        if info is not None and info.codec == BlobCodec.CHUNKS and info.ref is not None:
            ref = info.ref
            for i in range(0, len(ref) - len(ref) % 32, 32):
                self.reachable.add(ref[i : i + 32])

    def tree(self, root: bytes) -> None:
        stack = [root]
        while stack:
            digest = stack.pop()
            if digest in self.reachable:
                continue
            self.reachable.add(digest)
            for e in self.reader.load(digest).values():
                if e.kind == "d":
                    stack.append(e.ref)
                elif e.kind == "f":
                    self.blob(e.ref)
            self._visited += 1
            if self.progress is not None:
                self.progress(self._visited, 0)

    def live_logs(self) -> set[str]:
        """Referenced logs, live runs' logs, and every parent they continue."""
        roots = set(self.logs)
        for _key, raw in self.store.meta.iter_meta(metakeys.RUN):
            rec = _json(raw)
            for k in ("log", "parent"):
                if isinstance(rec.get(k), str):
                    roots.add(rec[k])
        infos = dict(self.store.meta.iter_logs())
        live: set[str] = set()
        for root in roots:
            log: str | None = root
            while log is not None and log not in live:
                live.add(log)
                info = infos.get(log)
                log = info.parent if info is not None else None
        return live


# -- the collector ----------------------------------------------------------------------------
def collect(
    store: Store,
    *,
    grace: float | None = None,
    dry_run: bool = False,
    wait: bool = False,
    vacuum: bool = False,
    repack_below: float = REPACK_BELOW,
    lock_wait: float = 2.0,
    progress: Progress | None = None,
) -> GcReport:
    """Run one garbage collection; see the module docstring for the protocol.

    ``grace`` (seconds, default :data:`DEFAULT_GRACE`) is how long a condemned blob waits
    when GC cannot hold the store alone; ``0`` asserts that no writer is in flight. With
    ``wait``, GC sleeps out the grace period instead of leaving the rest to a later run.
    ``lock_wait`` is how long to keep trying to hold the store alone.
    """
    t0 = time.monotonic()
    if store.blobs.read_only is not None and not dry_run:
        raise UpgradeRequired(store.blobs.read_only)  # before its lock file is made
    grace = DEFAULT_GRACE if grace is None else max(0.0, grace)
    report = GcReport(dry_run=dry_run, grace=grace)
    meta, local = store.meta, store.blobs.local
    with _one_gc(store, dry_run) as ok:
        if not ok:
            raise GcBusy("another stashpoint gc is running on this store")
        if isinstance(local, LocalBlobStore) and not dry_run:
            report.temp_files = sweep_temp_files(local.root)
        inv = _inventory(store)
        marker = _Marker(store, inv, progress)
        marker.run()
        garbage = (inv.rows.keys() | inv.loose.keys()) - marker.reachable
        marks = meta.condemned()
        _tally(report, inv, marker, garbage)
        all_logs = dict(meta.iter_logs())
        log_sizes = meta.log_sizes()
        dead_logs = all_logs.keys() - marker.live_logs()
        report.garbage_logs = len(dead_logs)
        report.garbage_log_bytes = sum(log_sizes.get(log, (0, 0))[1] for log in dead_logs)
        if dry_run:
            pending = {d: at for d, at in marks.items() if d in garbage}
            _pending(report, inv, pending, grace)
            report.seconds = time.monotonic() - t0
            return report

        referenced = [d for d in marks if d in marker.reachable]
        if referenced:
            report.revived += len(meta.revive(referenced))
        new = sorted(garbage - marks.keys())
        if new:
            meta.condemn(new, time.time(), epoch=new_id())  # stat caches must re-check
            meta.note_gc_epoch(None)  # and writers through this object re-read it now
            report.condemned = len(new)
        log_marks = _log_marks(store, dead_logs)

        with _exclusive(store, lock_wait) as exclusive:
            report.exclusive = exclusive
            cutoff = time.time() if exclusive else time.time() - grace
            if not exclusive and wait:
                newest = max([*meta.condemned().values(), *log_marks.values()], default=None)
                if newest is not None and newest > cutoff:
                    time.sleep(max(0.0, newest - cutoff))
                    cutoff = time.time() - grace
            _sweep(store, inv, marker, report, cutoff, log_marks, log_sizes)
        _packs(store, inv, report, repack_below)
        _pending(report, inv, meta.condemned(), grace)
        if vacuum:
            meta.vacuum()
            report.vacuumed = True
    report.seconds = time.monotonic() - t0
    return report


def _tally(report: GcReport, inv: _Inventory, marker: _Marker, garbage: set[bytes]) -> None:
    report.checkpoints = marker.records
    report.pruned = marker.pruned
    stored = inv.rows.keys() | inv.loose.keys()
    live = stored & marker.reachable
    report.live_blobs = len(live)
    report.live_bytes = sum(inv.cost(d) for d in live)
    report.garbage_blobs = len(garbage)
    report.garbage_bytes = sum(inv.cost(d) for d in garbage)


def _sweep(
    store: Store,
    inv: _Inventory,
    marker: _Marker,
    report: GcReport,
    cutoff: float,
    log_marks: dict[str, float],
    log_sizes: dict[str, tuple[int, int]],
) -> None:
    """Mark again (records committed meanwhile keep their blobs), then delete what is still
    condemned, unreferenced and old enough; logs likewise."""
    meta, local = store.meta, store.blobs.local
    marker.run()
    marks = meta.condemned()
    referenced = [d for d in marks if d in marker.reachable]
    if referenced:
        report.revived += len(meta.revive(referenced))
    doomed = sorted(d for d, at in marks.items() if at <= cutoff and d not in marker.reachable)
    _note_packs(store, inv, doomed)
    freed_files = 0

    def unlink(digests: list[bytes]) -> None:
        nonlocal freed_files
        assert local is not None
        for d in digests:
            freed_files += local.delete(d)

    use_unlink = local is not None and meta.atomic_unlink
    for i in range(0, len(doomed), 2000):  # short transactions: writers wait on them
        batch = doomed[i : i + 2000]
        claimed = meta.sweep_blobs(batch, cutoff, unlink if use_unlink else None)
        report.freed_blobs += len(claimed)
        for d in claimed:
            row = inv.rows.get(d)
            if row is not None:
                report.freed_db_bytes += row.stored
        if marker.progress is not None:
            marker.progress(report.freed_blobs, report.freed_db_bytes + freed_files)
    report.freed_file_bytes += freed_files

    live_logs = marker.live_logs()
    gone = [log for log, at in log_marks.items() if at <= cutoff and log not in live_logs]
    if gone:
        meta.delete_logs(gone)
        report.freed_logs = len(gone)
        report.freed_db_bytes += sum(log_sizes.get(log, (0, 0))[1] for log in gone)
    rest = {log: at for log, at in log_marks.items() if log not in live_logs and log not in gone}
    meta.set_meta(_LOGS_KEY, json.dumps(rest) if rest else None)
    report.pending_logs = len(rest)


def _note_packs(store: Store, inv: _Inventory, doomed: list[bytes]) -> None:
    """Before rows go, note the packs they point into: if GC is interrupted after the sweep,
    the next run still knows those packs may be left without rows (none can come back)."""
    packs = set()
    for d in doomed:
        row = inv.rows.get(d)
        if row is not None and row.codec == BlobCodec.PACKED and row.ref is not None:
            p = parse_pointer(row.ref)
            if p is not None:
                packs.add(p.pack)
    if packs:
        noted = set(_json_list(store.meta.get_meta(_PACKS_KEY)))
        if not packs <= noted:
            store.meta.set_meta(_PACKS_KEY, json.dumps(sorted(noted | packs)))


def _log_marks(store: Store, dead: set[str]) -> dict[str, float]:
    """Condemn unreferenced logs (a JSON map in store meta: log -> when first seen dead)."""
    marks = {k: float(v) for k, v in _json(store.meta.get_meta(_LOGS_KEY) or "").items()}
    now = time.time()
    out = {log: marks.get(log, now) for log in dead}
    if out != marks:
        store.meta.set_meta(_LOGS_KEY, json.dumps(out) if out else None)
    return out


def _pending(report: GcReport, inv: _Inventory, marks: dict[bytes, float], grace: float) -> None:
    report.pending_blobs = len(marks)
    report.pending_bytes = sum(inv.cost(d) for d in marks)
    if marks:
        when = max(marks.values()) + grace
        report.collectable_after = dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat(
            timespec="seconds"
        )


def _packs(store: Store, inv: _Inventory, report: GcReport, repack_below: float) -> None:
    """Delete packs no row points to; rewrite packs that are mostly garbage."""
    local = store.blobs.local
    if local is None:
        return
    meta = store.meta
    owned = set(_json_list(meta.get_meta(_PACKS_KEY)))
    files = local.packs()  # listed before the rows: a pack written later is not judged
    live: dict[str, list[tuple[BlobInfo, PackPointer]]] = {}
    for info in meta.iter_blob_info():
        if info.codec == BlobCodec.PACKED and info.ref is not None:
            p = parse_pointer(info.ref)
            if p is not None:
                live.setdefault(p.pack, []).append((info, p))
    had_rows = {
        p.pack
        for info in inv.rows.values()
        if info.codec == BlobCodec.PACKED and info.ref is not None
        for p in [parse_pointer(info.ref)]
        if p is not None
    }
    now = time.time()
    for name, (size, mtime) in sorted(files.items()):
        entries = live.get(name)
        if not entries:
            # Emptied by a sweep (rows never come back to an old pack), left by an interrupted
            # repack, or orphaned by a writer that died long ago: nothing can point here.
            if name in had_rows or name in owned or now - mtime > ORPHAN_PACK_AGE:
                report.freed_file_bytes += local.delete_pack(name)
                report.packs_deleted += 1
            continue
        payload = max(1, size - _PACK_HEADER)
        if sum(p.length for _i, p in entries) < payload * repack_below:
            _repack(store, name, size, entries, owned, report)
    leftover = sorted(n for n in owned if n in local.packs() and not live.get(n))
    meta.set_meta(_PACKS_KEY, json.dumps(leftover) if leftover else None)


def _repack(
    store: Store,
    name: str,
    size: int,
    entries: list[tuple[BlobInfo, PackPointer]],
    owned: set[str],
    report: GcReport,
) -> None:
    local = store.blobs.local
    assert local is not None
    parts = []
    try:
        for info, p in entries:
            data = local.read_packed(name, p.offset, p.length)
            store.blobs.decode_packed_entry(info.digest, p.codec, info.size, data)
            parts.append(data)
    except IntegrityError as exc:  # never copy damage into a new pack; verify names it
        report.problems.append(f"pack {name} not repacked: {exc}")
        return
    new = new_id()
    owned.update((new, name))
    store.meta.set_meta(_PACKS_KEY, json.dumps(sorted(owned)))  # first: a crash leaves a note
    spans = local.write_pack(new, parts)
    changes = [
        (info.digest, info.ref or b"", make_pointer(p.codec, off, n, new))
        for (info, p), (off, n) in zip(entries, spans, strict=True)
    ]
    moved = store.meta.repoint_blobs(changes)
    new_size = local.packs().get(new, (0, 0.0))[0]
    report.packs_repacked += 1
    if moved == len(changes):  # every row points at the new pack: the old one is garbage
        report.freed_file_bytes += local.delete_pack(name) - new_size
        owned.difference_update((new, name))
    # else a row changed under us: both packs stay noted; the next run settles them
    store.meta.set_meta(_PACKS_KEY, json.dumps(sorted(owned)) if owned else None)


@contextmanager
def _exclusive(store: Store, lock_wait: float) -> Iterator[bool]:
    """Hold the store alone if no other store object is open and no thread of this process
    is between a blob check and its commit; yields whether we do."""
    local = store.blobs.local
    if local is None:
        from .stores.memory import MemoryStore

        backend = getattr(store.meta, "inner", store.meta)  # unwrap EncryptedLogs
        yield isinstance(backend, MemoryStore) and store.meta.writers.in_flight() == 0
        return
    with local.exclusive(attempts=1 + int(lock_wait / 0.1), pause=0.1) as got:
        yield got and store.meta.writers.in_flight() == 0


@contextmanager
def _one_gc(store: Store, dry_run: bool) -> Iterator[bool]:
    """One collector at a time per blob directory (two would race over packs)."""
    local = store.blobs.local
    if not isinstance(local, LocalBlobStore) or dry_run:
        yield True  # S3: two collectors can race over a pack; repoints are compare-and-set
        return
    import fcntl
    import os

    fd = os.open(local.root / "gc.run", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


# -- du ---------------------------------------------------------------------------------------
@dataclass
class Usage:
    """Where a store's bytes are (``stashpoint du``)."""

    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    """Kind -> {"count", "bytes"}: records, conversation, journal, logs (unreferenced),
    inline blobs, packed blobs, packs, loose chunks, temp files, database file."""
    sessions: dict[str, dict[str, int]] = field(default_factory=dict)
    """Session -> records, pruned, record bytes, message bytes, blob bytes it reaches."""
    gc: dict[str, Any] = field(default_factory=dict)
    """What ``gc`` would free now (garbage) and what is already condemned (pending)."""

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": self.kinds, "sessions": self.sessions, "gc": self.gc}


def usage(store: Store, progress: Progress | None = None) -> Usage:
    meta, local = store.meta, store.blobs.local
    out = Usage()
    inv = _inventory(store)
    rows = list(meta.iter_checkpoints())
    sizes = meta.log_sizes()
    infos = dict(meta.iter_logs())
    conv: set[str] = set()
    journal: set[str] = set()
    per: dict[str, dict[str, int]] = {}
    for row in rows:
        s = per.setdefault(
            row.session,
            {"records": 0, "pruned": 0, "record_bytes": 0, "message_bytes": 0, "blob_bytes": 0},
        )
        s["records"] += 1
        s["record_bytes"] += len(row.body)
        try:
            cp = _unverified.decode(store.hasher.plain_body(row.id, row.body))
        except (msgspec.DecodeError, IntegrityError):
            continue
        for ref, kind in ((cp.state.conversation, conv), (cp.journal, journal)):
            if ref is not None:
                kind.add(ref.log)
    for session, s in per.items():
        s["pruned"] = len(meta.pruned(session))
    for log, info in infos.items():
        if info.session in per:
            per[info.session]["message_bytes"] += sizes.get(log, (0, 0))[1]

    def closure(logs: set[str]) -> set[str]:
        out_logs: set[str] = set()
        for log in logs:
            cur: str | None = log
            while cur is not None and cur not in out_logs:
                out_logs.add(cur)
                info = infos.get(cur)
                cur = info.parent if info is not None else None
        return out_logs

    conv_all, journal_all = closure(conv), closure(journal)
    other = infos.keys() - conv_all - journal_all

    def add(kind: str, count: int, nbytes: int) -> None:
        out.kinds[kind] = {"count": count, "bytes": nbytes}

    add("records", len(rows), sum(len(r.body) for r in rows))
    for name, logs in (("conversation", conv_all), ("journal", journal_all - conv_all)):
        add(
            name,
            sum(sizes.get(g, (0, 0))[0] for g in logs),
            sum(sizes.get(g, (0, 0))[1] for g in logs),
        )
    add(
        "other logs",
        sum(sizes.get(g, (0, 0))[0] for g in other),
        sum(sizes.get(g, (0, 0))[1] for g in other),
    )
    inline = [i for i in inv.rows.values() if i.codec != BlobCodec.PACKED]
    packed = [i for i in inv.rows.values() if i.codec == BlobCodec.PACKED]
    add("inline blobs", len(inline), sum(i.stored for i in inline))
    add("packed blobs", len(packed), sum(inv.cost(i.digest) for i in packed))
    add("pack files", len(inv.packs), sum(size for size, _m in inv.packs.values()))
    add("loose chunks", len(inv.loose), sum(inv.loose.values()))
    if isinstance(local, LocalBlobStore):
        temps = [p for p in local.root.rglob(f"*{TMP_MARK}*") if p.is_file()]
        add("temp files", len(temps), sum(p.stat().st_size for p in temps))
    if store.home is not None:
        db = [p for p in store.home.glob("store.db*") if p.is_file()]
        add("database files", len(db), sum(p.stat().st_size for p in db))
    for session in per:
        m = _Marker(store, inv, progress)
        try:
            m.run({session})
        except _Unreadable:
            continue
        per[session]["blob_bytes"] = sum(inv.cost(d) for d in m.reachable)
    out.sessions = per
    try:
        report = collect(store, dry_run=True, progress=progress)
        out.gc = {
            "garbage_blobs": report.garbage_blobs,
            "garbage_bytes": report.garbage_bytes,
            "garbage_logs": report.garbage_logs,
            "garbage_log_bytes": report.garbage_log_bytes,
            "pending_blobs": report.pending_blobs,
            "pending_bytes": report.pending_bytes,
        }
    except _Unreadable as exc:
        out.gc = {"error": str(exc)}
    return out


def _json(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _json_list(raw: str | None) -> list[str]:
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
