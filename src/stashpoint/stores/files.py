"""Plain-file metadata store (``file:///dir``): every checkpoint a readable JSON document.

For people who want to look at, grep, back up or rsync their checkpoints with ordinary tools
(the seeds' ``fileCheckpoints({dir})``). Layout under ``dir``::

    checkpoints/<session>/<ID>.json   one pretty-printed document per checkpoint
    logs/<log>/info.json              a conversation / journal log: parent, length
    logs/<log>/<start>.jsonl          the messages appended by one commit, one per line
    objects/<hh>/<sha256>             small blobs (header + payload); big ones in blobs/
    heads.json labels.json meta.json pruned.json condemned.json
    lock                              fcntl lock: one writer at a time, across processes
    txn.json                          redo record of a commit in progress (see below)

Integrity is unchanged: the digest covers the canonical encoding of the record, which the
document holds as a JSON object (``record``); reading re-encodes it canonically, so a hand
edit no longer matches the digest and is reported by every read and by ``verify``. A body that
does not round-trip through JSON exactly is kept as base64 (``body_b64``) instead.

Crash safety: every file is written by the crash-safe protocol (temp, fsync, replace, fsync
dir). One commit touches several files (document, log, heads), so it first writes them all
into ``txn.json`` (one atomic write) and then applies them; whoever takes the lock next (or
opens the store) replays a ``txn.json`` a crash left behind. A commit is therefore all or
nothing, as with SQLite. Blobs are written before the redo record: a crash leaves at most
unreferenced blobs, which GC removes. Rejected alternative: append-only log files truncated
on recovery: more code, and a torn append is harder to tell from damage.

Cost: several fsyncs per checkpoint and one file per small blob, so it is slower than SQLite
on big first snapshots; it is the readable store, not the fast one.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import os
import re
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._fsutil import TMP_MARK, fsync_dir, sweep_temp_files
from ..errors import (
    ConflictError,
    IntegrityError,
    PrunedError,
    SchemaVersionError,
    StoreError,
    UsageError,
)
from ._filedir import _OPEN, FileDir, _any, _plain, _pretty
from .base import (
    GC_EPOCH_KEY,
    BlobInfo,
    BlobRow,
    CheckpointRow,
    Commit,
    Fence,
    GcEpochChanged,
    LeaseInfo,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
    grant_lease,
    lease_held,
    lease_lost,
)

__all__ = ["FileStore"]

LAYOUT_VERSION = 2
"""2: refs carry ``auth`` strings (``heads.auth.json``, ``labels.auth.json``) and the store its
format (:mod:`.formats`); 1: format 1, read as it is until upgraded (a version that wrote 1
refuses 2, so it never writes unauthenticated refs into an upgraded store). Version of the
directory layout and document shape; newer ones are refused."""

_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")
"""Checkpoint ids and log ids become file names: anything else is refused (no ``../``)."""
_HEADER = struct.Struct(">4sBQ")
_MAGIC = b"SPO1"
_canonical = msgspec.json.Encoder(order="sorted")


class FileStore(FileDir, MetadataStore):
    """Metadata in plain files under one directory; see the module docstring for the layout."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root).expanduser().absolute()
        self.url = f"file://{self.root}"
        self.durability = (
            "fsync every checkpoint (plain files: temp + fsync + rename + directory fsync)"
        )
        self._tlock = threading.RLock()
        self._depth = 0
        _OPEN.add(self)
        self._where: dict[str, Path] = {}  # checkpoint id -> its document (ids are immutable)
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for sub in ("checkpoints", "logs", "objects"):
                (self.root / sub).mkdir(mode=0o700, exist_ok=True)
            self._fd: int | None = os.open(
                self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise StoreError(f"cannot open file store {self.root}: {exc.strerror}") from exc
        with self._locked():  # replays a commit a crash interrupted
            version = self._read_json("meta.json", {}).get("layout_version")
            if version is None:
                self._apply({"meta.json": _pretty({"layout_version": str(LAYOUT_VERSION)})})
            elif int(version) < LAYOUT_VERSION:
                self.format_v1 = True  # read as it is; `stashpoint upgrade` converts it
            elif int(version) > LAYOUT_VERSION:
                raise SchemaVersionError(
                    f"file store {self.root} has layout {version}; this stashpoint reads up "
                    f"to {LAYOUT_VERSION}: upgrade stashpoint"
                )
            sweep_temp_files(self.root, recursive=False)

    # -- store-level settings -------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        value = self._read_json("meta.json", {}).get(key)
        return value if isinstance(value, str) else None

    def set_meta(self, key: str, value: str | None) -> None:
        with self._locked():
            meta = self._read_json("meta.json", {})
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
            self._apply({"meta.json": _pretty(meta)})

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        with self._locked():
            meta = self._read_json("meta.json", {})
            now = meta.get(key)
            if (now if isinstance(now, str) else None) != expected:
                return False
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
            self._apply({"meta.json": _pretty(meta)})
            return True

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        meta = self._read_json("meta.json", {})
        yield from sorted((k, v) for k, v in meta.items() if k.startswith(prefix))

    # -- blobs ----------------------------------------------------------------------------
    @staticmethod
    def _blob_rel(digest: bytes) -> str:
        h = digest.hex()
        return f"objects/{h[:2]}/{h}"

    def _condemned(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._read_json("condemned.json", {}).items()}

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        condemned = self._condemned()
        return {
            d
            for d in digests
            if d.hex() not in condemned and (self.root / self._blob_rel(d)).exists()
        }

    def _store_blobs(self, blobs: Sequence[BlobRow]) -> dict[str, bytes | None]:
        """Write missing blob files; return the condemned-list update that revives them."""
        missing = {}
        for b in blobs:
            path = self.root / self._blob_rel(b.digest)
            if not path.exists():
                missing[path] = _HEADER.pack(_MAGIC, b.codec, b.size) + b.data
        if missing:
            self._put_files(missing)  # durable before the record that needs them
        condemned = self._condemned()
        revived = [b for b in blobs if condemned.pop(b.digest.hex(), None) is not None]
        return {"condemned.json": _pretty(condemned)} if revived else {}

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        with self._locked():
            writes = self._store_blobs(blobs)
            if writes:
                self._apply(writes)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        raw = self._read(self._blob_rel(digest))
        if raw is None:
            return None
        if len(raw) < _HEADER.size or raw[:4] != _MAGIC:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad header in its file")
        _magic, codec, size = _HEADER.unpack_from(raw)
        return BlobRow(digest, codec, size, raw[_HEADER.size :])

    def _blob_paths(self) -> Iterator[tuple[bytes, Path]]:
        objects = self.root / "objects"
        for sub in sorted(objects.iterdir()):
            if not sub.is_dir():
                continue
            for path in sorted(sub.iterdir()):
                if len(path.name) == 64 and not path.name.startswith(TMP_MARK):
                    try:
                        yield bytes.fromhex(path.name), path
                    except ValueError:
                        continue

    def iter_blob_digests(self) -> Iterator[bytes]:
        for digest, _path in self._blob_paths():
            yield digest

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        for digest, _path in self._blob_paths():
            try:
                row = self.get_blob(digest)
            except IntegrityError:
                continue  # verify names it; GC must not trip over it
            if row is not None:
                ref = row.data if row.codec in (2, 3) else None
                yield BlobInfo(digest, row.codec, row.size, len(row.data), ref)

    # -- conversation logs ----------------------------------------------------------------
    @staticmethod
    def _check_name(what: str, name: str) -> None:
        if not _NAME.fullmatch(name):
            raise UsageError(f"{what} {name!r} cannot be stored in a file store")

    def check_id(self, what: str, name: str) -> None:
        self._check_name(what, name)

    def log_info(self, log: str) -> LogInfo | None:
        if not _NAME.fullmatch(log):
            return None
        d = self._read_json(f"logs/{log}/info.json", None)
        if d is None:
            return None
        return LogInfo(d["session"], d["parent"], d["parent_len"], d["length"])

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        info = self.log_info(log)
        if info is None:
            return []
        stop = min(stop, info.length)
        if start >= stop:
            return []
        segments = self._segments(log)
        starts = [s for s, _name in segments]
        first = max(0, bisect.bisect_right(starts, start) - 1)  # the segment holding `start`
        out: list[MessageRow] = []
        d = self.root / "logs" / log
        for seg_start, name in segments[first:]:
            if seg_start >= stop:
                break
            out.extend(r for r in self._read_segment(d / name) if start <= r.idx < stop)
        return out

    def _segments(self, log: str) -> list[tuple[int, str]]:
        """(first index, file name) of a log's segments, sorted; names parsed without Path
        objects (a long conversation has a thousand of them)."""
        try:
            names = os.listdir(self.root / "logs" / log)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if name.endswith(".jsonl") and name[:-6].isdigit():
                found.append((int(name[:-6]), name))
        found.sort()
        return found

    def _read_segment(self, path: Path) -> list[MessageRow]:
        """The readable rows of one segment. A damaged line ends it: the rows after it are
        reported missing by the reader's chain check and by ``verify``, which name the log."""
        rows = []
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        for line in raw.splitlines():
            try:
                d = _any.decode(line)
                data = d["text"].encode() if "text" in d else base64.b64decode(d["b64"])
                rows.append(MessageRow(int(d["idx"]), bytes.fromhex(d["chain"]), data))
            except (msgspec.DecodeError, KeyError, ValueError, TypeError, AttributeError):
                break
        return rows

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        for name in sorted(os.listdir(self.root / "logs")):
            info = self.log_info(name)
            if info is not None:
                yield name, info

    def _check_append(self, a: LogAppend) -> LogInfo:
        self._check_name("log", a.log)
        current = self.log_info(a.log)
        info = a.new if a.new is not None else current
        if info is None or info.length != a.start or (a.new is not None and current is not None):
            raise ConflictError(f"log {a.log} grew under us; another writer appended first")
        return info

    def _append_writes(self, a: LogAppend, info: LogInfo) -> dict[str, bytes | None]:
        writes: dict[str, bytes | None] = {}
        if a.new is not None:  # leftovers of a deleted log of that name go, in this txn
            writes.update({f"logs/{a.log}/{name}": None for _s, name in self._segments(a.log)})
        lines = []
        for i, (chain, data) in enumerate(a.messages):
            line: dict[str, Any] = {"idx": a.start + i, "chain": chain.hex()}
            try:
                line["text"] = data.decode()
            except UnicodeDecodeError:
                line["b64"] = base64.b64encode(data).decode()
            lines.append(_plain.encode(line))
        if lines:
            writes[f"logs/{a.log}/{a.start:012d}.jsonl"] = b"\n".join(lines) + b"\n"
        new = info._replace(length=a.start + len(a.messages))
        writes[f"logs/{a.log}/info.json"] = _pretty(new._asdict())
        return writes

    def append_log(self, append: LogAppend) -> None:
        with self._locked():
            self._check_fence(append.fence, append.session)
            info = self._check_append(append)
            self._apply(self._append_writes(append, info))

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for log, info in self.iter_logs():
            rows = self.read_messages(log, 0, info.length)
            if rows:
                out[log] = (len(rows), sum(len(r.data) + len(r.chain) for r in rows))
        return out

    def delete_logs(self, logs: Sequence[str]) -> None:
        with self._locked():
            for log in logs:
                if not _NAME.fullmatch(log):
                    continue
                self._unlink(f"logs/{log}/info.json")  # first: the log is gone from here on
                for _s, name in self._segments(log):
                    self._unlink(f"logs/{log}/{name}")
                try:
                    (self.root / "logs" / log).rmdir()
                except OSError:
                    pass

    # -- checkpoints ----------------------------------------------------------------------
    @staticmethod
    def _session_dir(session: str) -> str:
        enc = urllib.parse.quote(session, safe="")
        if len(enc) > 180:  # file names are limited to 255 bytes
            enc = "h-" + hashlib.sha256(session.encode()).hexdigest()[:40]
        return f"checkpoints/s-{enc}"

    def _doc_path(self, ident: str) -> Path | None:
        if not _NAME.fullmatch(ident):
            return None
        path = self._where.get(ident)
        if path is not None and path.exists():
            return path
        for sub in (self.root / "checkpoints").iterdir():
            path = sub / f"{ident}.json"
            if path.exists():
                self._where[ident] = path
                return path
        return None

    @staticmethod
    def _document(row: CheckpointRow) -> bytes:
        doc: dict[str, Any] = {
            "stashpoint": "checkpoint",
            "layout": LAYOUT_VERSION,
            "id": row.id,
            "session": row.session,
            "branch": row.branch,
            "parent": row.parent,
            "digest": row.digest,
        }
        try:
            record = _any.decode(row.body)
            readable = _canonical.encode(record) == row.body
        except msgspec.DecodeError:
            readable = False
        if readable:
            doc["record"] = record
        else:  # not canonical JSON (foreign backends' tests, future encodings): exact bytes
            doc["body_b64"] = base64.b64encode(row.body).decode()
        return _pretty(doc)

    def _row(self, ident: str, path: Path, session: str | None = None) -> CheckpointRow:
        raw = path.read_bytes()
        try:
            doc = _any.decode(raw)
            if "record" in doc:
                body = _canonical.encode(doc["record"])
            else:
                body = base64.b64decode(doc["body_b64"], validate=True)
            parent = doc["parent"]
            row = CheckpointRow(
                str(doc["id"]),
                str(doc["session"]),
                str(doc["branch"]),
                None if parent is None else str(parent),
                body,
                str(doc["digest"]),
            )
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
            # Unreadable: hand the engine a row that cannot verify, so every read and
            # `verify` name this checkpoint instead of failing somewhere below.
            return CheckpointRow(ident, session or "", "", None, raw, "")
        return row if row.id == ident else row._replace(id=ident, digest="")

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        path = self._doc_path(ident)
        if path is None:
            return None
        try:
            return self._row(ident, path)
        except FileNotFoundError:
            return None

    def _ids(self, session: str) -> list[str]:
        try:
            names = os.listdir(self.root / self._session_dir(session))
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and _NAME.fullmatch(n[:-5]))

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        ids = self._ids(session)[::-1]
        if before is not None:
            ids = [i for i in ids if i < before]
        if limit is not None:
            ids = ids[:limit]
        d = self.root / self._session_dir(session)
        return [self._row(i, d / f"{i}.json", session) for i in ids]

    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        found: list[tuple[str, Path]] = []
        for sub in (self.root / "checkpoints").iterdir():
            for name in os.listdir(sub):
                if name.endswith(".json") and _NAME.fullmatch(name[:-5]):
                    found.append((name[:-5], sub / name))
        for ident, path in sorted(found):
            yield self._row(ident, path)

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        if session is not None:
            ids = self._ids(session)
        else:
            ids = sorted(
                n[:-5]
                for sub in (self.root / "checkpoints").iterdir()
                for n in os.listdir(sub)
                if n.endswith(".json") and _NAME.fullmatch(n[:-5])
            )
        return [i for i in ids if i.startswith(prefix)][:5]

    def sessions(self) -> list[str]:
        return sorted(self._heads())

    def _heads(self) -> dict[str, dict[str, str]]:
        heads: dict[str, dict[str, str]] = self._read_json("heads.json", {})
        return heads

    format_v1: bool | None = False
    ref_auth = True
    """Refs' ``auth`` strings live in ``heads.auth.json`` and ``labels.auth.json``, written in
    the same atomic batch as the refs (older versions ignore them; their ref writes then leave
    a stale ``auth`` behind, which a keyed store reports as a moved ref)."""

    def _head_auth_writes(self, session: str, branch: str, auth: str | None) -> tuple[str, bytes]:
        auths: dict[str, dict[str, str | None]] = self._read_json("heads.auth.json", {})
        auths.setdefault(session, {})[branch] = auth
        return "heads.auth.json", _pretty(auths)

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        heads = self._heads().get(session, {})
        auths = self._read_json("heads.auth.json", {}).get(session, {})
        return {b: (c, auths.get(b)) for b, c in heads.items()}

    def commit(self, commit: Commit) -> None:
        row = commit.row
        self._check_name("checkpoint id", row.id)
        with self._locked():
            self._check_fence(commit.fence, row.session)
            heads = self._heads()
            if commit.move_head and heads.get(row.session, {}).get(row.branch) != (
                commit.expected_head
            ):
                raise ConflictError(
                    f"branch {row.branch!r} of session {row.session!r} moved; "
                    "another writer checkpointed first"
                )
            a = commit.append
            info = self._check_append(a) if a is not None else None
            if self._doc_path(row.id) is not None:
                raise ConflictError(f"checkpoint {row.id} exists already")
            if commit.gc_epoch is not None and commit.gc_epoch != (
                self.get_meta(GC_EPOCH_KEY) or "0"
            ):
                raise GcEpochChanged(
                    f"a garbage collection began after checkpoint {row.id} checked which blobs "
                    "exist; snapshot again"
                )
            writes = self._store_blobs(commit.blobs)  # blobs first: §5 commit order
            if a is not None and info is not None:
                writes.update(self._append_writes(a, info))
            rel = f"{self._session_dir(row.session)}/{row.id}.json"
            writes[rel] = self._document(row)
            if commit.move_head:
                heads.setdefault(row.session, {})[row.branch] = row.id
                writes["heads.json"] = _pretty(heads)
                name, data = self._head_auth_writes(row.session, row.branch, commit.head_auth)
                writes[name] = data
            self._apply(writes)
            self._where[row.id] = self.root / rel
        self.writers.end()

    # -- heads, labels --------------------------------------------------------------------
    def branches(self, session: str) -> dict[str, str]:
        return dict(self._heads().get(session, {}))

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
        with self._locked():
            self._check_fence(fence, session)
            at = self.pruned(session).get(new)
            if at is not None:
                raise PrunedError(new, at)
            heads = self._heads()
            current = heads.get(session, {}).get(branch)
            if current != expected:
                raise ConflictError(
                    f"branch {branch!r} of session {session!r} moved to {current} "
                    f"(expected {expected}); another writer got there first"
                )
            heads.setdefault(session, {})[branch] = new
            name, data = self._head_auth_writes(session, branch, auth)
            self._apply({"heads.json": _pretty(heads), name: data})

    # -- leases (clock: this machine's; the file lock orders them) ------------------------
    def _leases(self) -> dict[str, list[Any]]:
        leases: dict[str, list[Any]] = self._read_json("leases.json", {})
        return leases

    def _check_fence(self, fence: Fence | None, session: str | None) -> None:
        """Under the lock, like every write: a takeover cannot slip in between."""
        leases = self._leases()
        if fence is not None:
            got = leases.get(fence.session)
            if got is None or int(got[1]) != fence.token:
                raise lease_lost(fence, None if got is None else int(got[1]))
        elif session is not None and (held := leases.get(session)) is not None:
            left = float(held[2]) - time.time()
            if left > 0:
                raise lease_held(session, str(held[0]), left)

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        with self._locked():
            leases = self._leases()
            got = leases.get(session)
            current = None if got is None else (str(got[0]), int(got[1]), float(got[2]))
            new = grant_lease(session, current, owner, ttl, time.time())
            leases[session] = list(new)
            self._apply({"leases.json": _pretty(leases)})
            return LeaseInfo(session, new[0], new[1], ttl)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        return self._set_expiry(fence, time.time() + ttl)

    def release_lease(self, fence: Fence) -> None:
        self._set_expiry(fence, 0.0)

    def _set_expiry(self, fence: Fence, expires: float) -> bool:
        with self._locked():
            leases = self._leases()
            got = leases.get(fence.session)
            if got is None or int(got[1]) != fence.token:
                return False
            if expires and float(got[2]) == 0.0:  # released: a late renewal must not revive it
                return False
            leases[fence.session] = [got[0], got[1], expires]
            self._apply({"leases.json": _pretty(leases)})
            return True

    def lease_info(self, session: str) -> LeaseInfo | None:
        got = self._leases().get(session)
        if got is None:
            return None
        return LeaseInfo(session, str(got[0]), int(got[1]), float(got[2]) - time.time())

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        with self._locked():
            labels = self._read_json("labels.json", {})
            auths = self._read_json("labels.auth.json", {})
            if label is None:
                labels.pop(ident, None)
                auths.pop(ident, None)
            else:
                labels[ident] = [session, label]
                auths[ident] = auth
            self._apply({"labels.json": _pretty(labels), "labels.auth.json": _pretty(auths)})

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        labels = self._read_json("labels.json", {})
        auths = self._read_json("labels.auth.json", {})
        return {i: (lab, auths.get(i)) for i, (s, lab) in labels.items() if s == session}

    def labels(self, session: str) -> dict[str, str]:
        labels = self._read_json("labels.json", {})
        return {i: lab for i, (s, lab) in labels.items() if s == session}

    # -- retention and garbage collection -------------------------------------------------
    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        with self._locked():
            self._check_fence(None, session)
            heads = set(self._heads().get(session, {}).values())
            labelled = self._read_json("labels.json", {})
            pruned = self._read_json("pruned.json", {})
            mine = pruned.setdefault(session, {})
            done = []
            for ident in ids:
                if ident in heads or ident in mine or ident in labelled:
                    continue
                row = self.get_checkpoint(ident)
                if row is None or row.session != session:
                    continue
                mine[ident] = at
                done.append(ident)
            if done:
                self._apply({"pruned.json": _pretty(pruned)})
            return done

    def pruned(self, session: str) -> dict[str, str]:
        return dict(self._read_json("pruned.json", {}).get(session, {}))

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        with self._locked():
            condemned = self._condemned()
            for d in digests:
                condemned.setdefault(d.hex(), at)
            writes: dict[str, bytes | None] = {"condemned.json": _pretty(condemned)}
            if epoch is not None:
                meta = self._read_json("meta.json", {})
                meta[GC_EPOCH_KEY] = epoch
                writes["meta.json"] = _pretty(meta)
            self._apply(writes)

    def condemned(self) -> dict[bytes, float]:
        return {bytes.fromhex(k): v for k, v in self._condemned().items()}

    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        condemned = self._condemned()
        return {d for d in digests if d.hex() in condemned}

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        with self._locked():
            condemned = self._condemned()
            back = {d for d in digests if condemned.pop(d.hex(), None) is not None}
            if back:
                self._apply({"condemned.json": _pretty(condemned)})
            return back

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        with self._locked():
            condemned = self._condemned()
            claimed = [d for d in digests if d.hex() in condemned and condemned[d.hex()] <= before]
            if not claimed:
                return []
            if unlink is not None:
                unlink(claimed)  # first: if it fails, nothing was deleted
            dirs = set()
            for d in claimed:
                del condemned[d.hex()]
                path = self.root / self._blob_rel(d)
                try:
                    path.unlink()
                    dirs.add(path.parent)
                except FileNotFoundError:
                    pass
            for parent in dirs:
                fsync_dir(parent)
            self._apply({"condemned.json": _pretty(condemned)})
            return claimed

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        moved = 0
        with self._locked():
            for digest, old, new in changes:
                row = self.get_blob(digest)
                if row is not None and row.data == old:
                    head = _HEADER.pack(_MAGIC, row.codec, row.size)
                    self._write(self._blob_rel(digest), head + new)
                    moved += 1
        return moved

    def close(self) -> None:
        with self._tlock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
