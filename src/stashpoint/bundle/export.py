"""Export: a session, or one checkpoint with its ancestors, read verified from a store and
written as a bundle that passed the checks an import makes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import zstandard

from .._fsutil import atomic_file
from .._store import Store
from ..blobs.objects import BlobCodec, Blobs
from ..errors import IntegrityError, NotFoundError, StashpointWarning, UsageError
from ..model import Checkpoint, TreeEntry, utc_now_iso
from ..stores.base import CheckpointRow, LogInfo
from .check import _Checker, _Contents, log_refs, parse_tree
from .format import (
    BLOB,
    CHUNKS,
    FORMAT,
    LOG,
    MANIFEST,
    RAW,
    RECORD,
    TREE,
    VERSION,
    ZSTD,
    BundleWriter,
    LogEntry,
    Manifest,
    RecordEntry,
    _msgpack,
)
from .limits import TRUSTED

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


@dataclass
class ExportReport:
    path: str
    session: str
    scope: str
    checkpoints: int
    logs: int
    objects: int
    """Trees, blobs and chunk lists."""
    bytes: int
    """Decompressed bytes of every entry."""
    size: int
    """Bytes of the file."""
    digest: str
    heads: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def export_bundle(
    store: Store,
    dest: str | os.PathLike[str],
    *,
    session: str,
    checkpoint: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write a session (or one checkpoint, with its ancestors) to ``dest``.

    Everything written is read back from the store verified, and the bundle is checked by the
    same rules as an import before it is renamed into place, so a bundle that exists imports.
    """
    path = Path(dest)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        # The bundle is renamed over the path: never over a device, FIFO, socket, directory or
        # symlink, --overwrite or not (as root, ``-o /dev/null`` would replace the device).
        kind = _KINDS.get(stat.S_IFMT(mode), "an unknown kind")
        raise UsageError(
            f"{path} exists and is not a regular file ({kind}); refusing to replace it: "
            "choose another name"
        )
    if mode is not None and not overwrite:
        raise UsageError(f"{path} exists; choose another name or pass --overwrite")
    ex = _Exporter(store, session, progress)
    rows = ex.select(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # a file made at ``path`` since the look above is not replaced unasked either
        with (
            atomic_file(path, replace=overwrite) as fd,
            os.fdopen(os.dup(fd), "wb", buffering=1 << 20) as f,
        ):
            digest = ex.write(f, rows, checkpoint)
    except FileExistsError:
        raise UsageError(f"{path} exists; choose another name or pass --overwrite") from None
    m = ex.contents.manifest
    assert m is not None
    return ExportReport(
        str(path),
        session,
        m.scope,
        len(ex.contents.records),
        len(ex.contents.logs),
        len(ex.done),
        ex.writer_bytes,
        path.stat().st_size,
        digest.hex(),
        dict(m.heads),
    )


class _Exporter:
    def __init__(
        self, store: Store, session: str, progress: Callable[[int, int], None] | None
    ) -> None:
        self.store = store
        self.blobs: Blobs = store.blobs
        self.session = session
        self.progress = progress
        self.contents = _Contents()
        self.done: set[bytes] = set()
        self.parsed: dict[bytes, list[TreeEntry]] = {}
        self.writer_bytes = 0
        self._w: BundleWriter | None = None

    def select(self, checkpoint: str | None) -> list[CheckpointRow]:
        """The records to export, each verified with its parent link; parents first."""
        meta = self.store.meta
        if checkpoint is None:
            rows = {r.id: r for r in meta.list_checkpoints(self.session)}
            if not rows:
                raise NotFoundError(f"session {self.session!r} has no checkpoints")
        else:
            row = meta.get_checkpoint(checkpoint)
            if row is None or row.session != self.session:
                raise NotFoundError(f"no checkpoint {checkpoint} in session {self.session!r}")
            rows = {row.id: row}
        out: dict[str, CheckpointRow] = {}
        pending = sorted(rows)
        while pending:
            ident = pending.pop()
            if ident in out:
                continue
            row2 = rows.get(ident) or meta.get_checkpoint(ident)
            if row2 is None:
                raise IntegrityError(f"checkpoint {ident} is missing", checkpoint=ident)
            cp = self.store.open_row(row2)
            if cp.parent is not None:
                prow = rows.get(cp.parent) or meta.get_checkpoint(cp.parent)
                if prow is None or prow.digest != cp.parent_digest:
                    what = "is missing" if prow is None else "was altered"
                    raise IntegrityError(
                        f"checkpoint {cp.id} is broken: its parent {cp.parent} {what}",
                        checkpoint=cp.id,
                    )
                rows.setdefault(prow.id, prow)
                pending.append(prow.id)
            out[ident] = row2
        return [out[i] for i in sorted(out)]

    def write(self, f: BinaryIO, rows: list[CheckpointRow], checkpoint: str | None) -> bytes:
        from .. import __version__

        c, meta = self.contents, self.store.meta
        cps = [self.store.open_row(r) for r in rows]
        ids = {cp.id for cp in cps}
        pruned = {i: at for i, at in meta.pruned(self.session).items() if i in ids}
        if checkpoint is None:
            heads = {b: h for b, h in meta.branches(self.session).items() if h in ids}
            selected = sorted(ids - pruned.keys())
        else:
            target = next(cp for cp in cps if cp.id == checkpoint)
            heads, selected = {target.branch: target.id}, [target.id]
        if pruned.keys() & {*heads.values(), *selected}:
            raise UsageError(
                "a checkpoint to export was pruned by retention: its contents may be gone"
            )
        self._warn_live_runs(heads, {cp.id: cp for cp in cps})
        labels = {i: label for i, label in meta.labels(self.session).items() if i in ids}
        c.manifest = Manifest(
            format=FORMAT,
            version=VERSION,
            session=self.session,
            scope="session" if checkpoint is None else "checkpoint",
            checkpoints=selected,
            heads=heads,
            labels=labels,
            pruned=pruned,
            keyed=self.store.hasher.keyed,
            source_store=self.store.id,
            created_at=utc_now_iso(),
            stashpoint=__version__,
        )
        cps_full = [cp for cp in cps if cp.id not in pruned]
        w = self._w = BundleWriter(f)
        w.add(MANIFEST, "manifest", msgspec.json.encode(c.manifest))
        for row, cp in zip(rows, cps, strict=True):
            rec = RecordEntry(row.digest, self.store.hasher.plain_body(row.id, row.body))
            c.records[cp.id] = rec
            w.add(RECORD, cp.id, _msgpack.encode(rec))
        for name, entry in self._logs(cps_full).items():
            c.logs[name] = entry
            w.add(LOG, name, _msgpack.encode(entry))
        for cp in cps_full:
            for hexd in cp.state.values.values():
                self._blob(bytes.fromhex(hexd))
            if cp.workspace is not None:
                self._tree(bytes.fromhex(cp.workspace.tree))
            for art in cp.artifacts.values():
                self._blob(bytes.fromhex(art.digest))
        _Checker(c, self.store.hasher, TRUSTED, self.parsed).run()  # import would accept it
        self.writer_bytes = w.bytes
        return w.finish()

    def _warn_live_runs(self, heads: dict[str, str], cps: dict[str, Checkpoint]) -> None:
        """A durable run's journal entries after its branch's last checkpoint live in this
        store only (its run record); a run resumed from the bundle would execute those steps
        again, so say so."""
        import warnings

        from .._runs import record_applies
        from ..metakeys import run_key

        meta = self.store.meta
        for branch, head in heads.items():
            raw = meta.get_meta(run_key(self.session, branch))
            record = json.loads(raw) if raw else None
            if not isinstance(record, dict) or not record_applies(record, cps[head]):
                continue
            info = meta.log_info(str(record["log"]))
            tail = info.length if info is not None else int(record.get("parent_len") or 0)
            journal = cps[head].journal
            extra = tail - (journal.length if journal is not None else 0)
            if extra > 0:
                warnings.warn(
                    f"branch {branch!r} has a live durable run with {extra} journal entries "
                    "after its last checkpoint; the bundle carries checkpoints only, so a run "
                    "resumed from it repeats those steps (checkpoint first to include them)",
                    StashpointWarning,
                    stacklevel=4,
                )

    def _logs(self, cps: list[Checkpoint]) -> dict[str, LogEntry]:
        """Every log the records refer to, up to the longest reference, with its fork parents
        up to their fork points; parents first."""
        meta = self.store.meta
        need: dict[str, int] = {}
        infos: dict[str, LogInfo] = {}
        work = [(ref.log, ref.length) for cp in cps for ref in log_refs(cp)]
        while work:
            log, n = work.pop()
            if need.get(log, -1) >= n:
                continue
            need[log] = n
            info = infos.get(log) or meta.log_info(log)
            if info is None:
                raise IntegrityError(f"log {log} is missing")
            infos[log] = info
            if info.parent is not None:
                work.append((info.parent, info.parent_len))
        out: dict[str, LogEntry] = {}

        def add(log: str) -> None:
            if log in out:
                return
            info = infos[log]
            if info.parent is not None:
                add(info.parent)
            start = info.parent_len if info.parent is not None else 0
            rows = meta.read_messages(log, start, need[log]) if need[log] > start else []
            if any(r.idx != start + i for i, r in enumerate(rows)) or len(rows) != max(
                0, need[log] - start
            ):
                raise IntegrityError(f"log {log} has missing entries")
            out[log] = LogEntry(
                info.session, info.parent, info.parent_len, [(r.chain, r.data) for r in rows]
            )

        for log in sorted(need):
            add(log)
        return out

    def _raw(
        self, digest: bytes, row: tuple[int, int, bytes] | None = None
    ) -> tuple[int, int, bytes, bytes]:
        """(bundle codec, size, payload, content) of a stored blob, verified. Reaches into
        :class:`Blobs` for the stored frame, so that it is copied, not re-compressed."""
        codec, size, data = row or self.blobs._fetch(digest)
        if codec == BlobCodec.PACKED:
            codec, data = self.blobs._unpack(digest, data)
        codec, data = self.blobs.open_frame(digest, codec, data)  # bundles hold plaintext
        content = self.blobs.inflate(digest, codec, size, data)
        if codec == BlobCodec.ZSTD and zstandard.frame_content_size(data) == size:
            return ZSTD, size, data, content
        return RAW, size, content, content

    def _put(self, kind: bytes, digest: bytes, codec: int, size: int, payload: bytes) -> None:
        assert self._w is not None
        self._w.add_payload(kind, digest.hex(), codec, size, payload)
        self.done.add(digest)
        if self.progress is not None:
            self.progress(self._w.entries, self._w.bytes)

    def _tree(self, digest: bytes) -> None:
        if digest in self.done:
            return
        codec, size, payload, content = self._raw(digest)
        self._put(TREE, digest, codec, size, payload)
        self.contents.trees[digest] = content
        entries = self.parsed[digest] = parse_tree(digest, content)
        for e in entries:
            if e.kind == "d":
                self._tree(e.ref)
            elif e.kind == "f":
                self._blob(e.ref)

    def _blob(self, digest: bytes) -> None:
        if digest in self.done:
            return
        row = self.blobs._fetch(digest)
        codec, size, data = row
        if codec != BlobCodec.CHUNKS:
            codec, size, payload, _content = self._raw(digest, row)
            self._put(BLOB, digest, codec, size, payload)
            self.contents.blobs[digest] = size
            return
        if not data or len(data) % 32:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad chunk list")
        whole, total = hashlib.sha256(), 0
        for i in range(0, len(data), 32):
            chunk = data[i : i + 32]
            ccodec, csize, payload, content = self._raw(chunk)
            whole.update(content)
            total += csize
            if chunk not in self.done:
                self._put(BLOB, chunk, ccodec, csize, payload)
                self.contents.blobs[chunk] = csize
        if whole.digest() != digest or total != size:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: chunks do not match digest")
        assert self._w is not None
        self._w.add(CHUNKS, digest.hex(), data)
        self.done.add(digest)
        self.contents.lists[digest] = data
