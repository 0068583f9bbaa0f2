"""In-process metadata store: for tests, notebooks and short-lived agents that need no disk."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..errors import ConflictError, PrunedError
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

__all__ = ["MemoryStore"]


class MemoryStore(MetadataStore):
    ref_auth = True
    format_v1: bool | None = False  # never holds an older version's data

    def __init__(self) -> None:
        super().__init__()
        self.url = "memory://"
        self.durability = "none: in this process's memory only"
        self._lock = threading.RLock()
        self._meta: dict[str, str] = {}
        self._blobs: dict[bytes, BlobRow] = {}
        self._logs: dict[str, LogInfo] = {}
        self._messages: dict[tuple[str, int], MessageRow] = {}
        self._checkpoints: dict[str, CheckpointRow] = {}
        self._heads: dict[tuple[str, str], str] = {}
        self._labels: dict[str, tuple[str, str]] = {}
        self._head_auth: dict[tuple[str, str], str | None] = {}
        self._label_auth: dict[str, str | None] = {}
        self._pruned: dict[str, tuple[str, str]] = {}  # id -> (session, at)
        self._condemned: dict[bytes, float] = {}
        self._leases: dict[str, tuple[str, int, float]] = {}  # session -> owner, token, expires

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._meta.pop(key, None)
            else:
                self._meta[key] = value

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        with self._lock:
            if self._meta.get(key) != expected:
                return False
            self.set_meta(key, value)
            return True

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        with self._lock:
            return {d for d in digests if d in self._blobs and d not in self._condemned}

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        with self._lock:
            for b in blobs:
                self._condemned.pop(b.digest, None)
                self._blobs.setdefault(b.digest, b)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        return self._blobs.get(digest)

    def iter_blob_digests(self) -> Iterator[bytes]:
        yield from list(self._blobs)

    def log_info(self, log: str) -> LogInfo | None:
        return self._logs.get(log)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        out = []
        for i in range(start, stop):
            row = self._messages.get((log, i))
            if row is not None:
                out.append(row)
        return out

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        yield from list(self._logs.items())

    def append_log(self, append: LogAppend) -> None:
        with self._lock:
            self._check_fence(append.fence, append.session)
            self._apply_append(append, self._check_append(append))

    def _check_append(self, a: LogAppend) -> LogInfo:
        info = a.new if a.new is not None else self._logs.get(a.log)
        if info is None or info.length != a.start or (a.new is not None and a.log in self._logs):
            raise ConflictError(f"log {a.log} grew under us; another writer appended first")
        return info

    def _apply_append(self, a: LogAppend, info: LogInfo) -> None:
        self._logs[a.log] = info._replace(length=a.start + len(a.messages))
        for i, (chain, data) in enumerate(a.messages):
            self._messages[(a.log, a.start + i)] = MessageRow(a.start + i, chain, data)

    def commit(self, commit: Commit) -> None:
        row = commit.row
        with self._lock:
            self._check_fence(commit.fence, row.session)
            key = (row.session, row.branch)
            if commit.move_head and self._heads.get(key) != commit.expected_head:
                raise ConflictError(
                    f"branch {row.branch!r} of session {row.session!r} moved; "
                    "another writer checkpointed first"
                )
            a = commit.append
            info = self._check_append(a) if a is not None else None
            if row.id in self._checkpoints:
                raise ConflictError(f"checkpoint {row.id} exists already")
            if commit.gc_epoch is not None and commit.gc_epoch != self._meta.get(GC_EPOCH_KEY, "0"):
                raise GcEpochChanged(
                    f"a garbage collection began after checkpoint {row.id} checked which blobs "
                    "exist; snapshot again"
                )
            if a is not None and info is not None:
                self._apply_append(a, info)
            for b in commit.blobs:
                self._condemned.pop(b.digest, None)
                self._blobs.setdefault(b.digest, b)
            self._checkpoints[row.id] = row
            if commit.move_head:
                self._heads[key] = row.id
                self._head_auth[key] = commit.head_auth
        self.writers.end()

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        return self._checkpoints.get(ident)

    # -- leases (clock: this process's monotonic time) -------------------------------------
    def _check_fence(self, fence: Fence | None, session: str | None) -> None:
        if fence is not None:
            got = self._leases.get(fence.session)
            if got is None or got[1] != fence.token:
                raise lease_lost(fence, None if got is None else got[1])
        elif session is not None and (held := self._leases.get(session)) is not None:
            left = held[2] - time.monotonic()
            if left > 0:
                raise lease_held(session, held[0], left)

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        with self._lock:
            got = grant_lease(session, self._leases.get(session), owner, ttl, time.monotonic())
            self._leases[session] = got
            return LeaseInfo(session, got[0], got[1], ttl)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        with self._lock:
            got = self._leases.get(fence.session)
            if got is None or got[1] != fence.token or got[2] == 0.0:  # 0: released
                return False
            self._leases[fence.session] = (got[0], got[1], time.monotonic() + ttl)
            return True

    def release_lease(self, fence: Fence) -> None:
        with self._lock:
            got = self._leases.get(fence.session)
            if got is not None and got[1] == fence.token:
                self._leases[fence.session] = (got[0], got[1], 0.0)

    def lease_info(self, session: str) -> LeaseInfo | None:
        got = self._leases.get(session)
        if got is None:
            return None
        return LeaseInfo(session, got[0], got[1], got[2] - time.monotonic())

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        with self._lock:  # other threads commit meanwhile (the async API, the web UI)
            rows = [r for r in self._checkpoints.values() if r.session == session]
        rows.sort(key=lambda r: r.id, reverse=True)
        if before is not None:
            rows = [r for r in rows if r.id < before]
        return rows[:limit] if limit is not None else rows

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        with self._lock:
            found = [
                i
                for i, r in self._checkpoints.items()
                if i.startswith(prefix) and (session is None or r.session == session)
            ]
        return sorted(found)[:5]

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted({s for s, _ in self._heads})

    def branches(self, session: str) -> dict[str, str]:
        with self._lock:
            return {b: c for (s, b), c in self._heads.items() if s == session}

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
        with self._lock:
            self._check_fence(fence, session)
            if new in self._pruned:
                raise PrunedError(new, self._pruned[new][1])
            current = self._heads.get((session, branch))
            if current != expected:
                raise ConflictError(
                    f"branch {branch!r} of session {session!r} moved to {current} "
                    f"(expected {expected}); another writer got there first"
                )
            self._heads[(session, branch)] = new
            self._head_auth[(session, branch)] = auth

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        with self._lock:
            return {
                b: (c, self._head_auth.get((s, b)))
                for (s, b), c in self._heads.items()
                if s == session
            }

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        with self._lock:
            if label is None:
                self._labels.pop(ident, None)
                self._label_auth.pop(ident, None)
            else:
                self._labels[ident] = (session, label)
                self._label_auth[ident] = auth

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        with self._lock:
            return {
                i: (lab, self._label_auth.get(i))
                for i, (s, lab) in self._labels.items()
                if s == session
            }

    def labels(self, session: str) -> dict[str, str]:
        with self._lock:
            return {i: lab for i, (s, lab) in self._labels.items() if s == session}

    # -- maintenance ----------------------------------------------------------------------
    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        with self._lock:
            rows = sorted(self._checkpoints.values(), key=lambda r: r.id)
        yield from rows

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        with self._lock:
            items = sorted((k, v) for k, v in self._meta.items() if k.startswith(prefix))
        yield from items

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        with self._lock:
            rows = list(self._blobs.values())
        for b in rows:
            ref = b.data if b.codec in (2, 3) else None
            yield BlobInfo(b.digest, b.codec, b.size, len(b.data), ref)

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for (log, _i), row in self._messages.items():
                n, size = out.get(log, (0, 0))
                out[log] = (n + 1, size + len(row.data) + len(row.chain))
        return out

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        with self._lock:
            self._check_fence(None, session)
            heads = {c for (s, _b), c in self._heads.items() if s == session}
            done = []
            for ident in ids:
                row = self._checkpoints.get(ident)
                if row is None or row.session != session or ident in heads:
                    continue
                if ident in self._labels:  # labelled since the plan: kept
                    continue
                if ident not in self._pruned:
                    self._pruned[ident] = (session, at)
                    done.append(ident)
            return done

    def pruned(self, session: str) -> dict[str, str]:
        with self._lock:
            return {i: at for i, (s, at) in self._pruned.items() if s == session}

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        with self._lock:
            for d in digests:
                self._condemned.setdefault(d, at)
            if epoch is not None:
                self._meta[GC_EPOCH_KEY] = epoch

    def condemned(self) -> dict[bytes, float]:
        with self._lock:
            return dict(self._condemned)

    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        with self._lock:
            return {d for d in digests if d in self._condemned}

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        with self._lock:
            return {d for d in digests if self._condemned.pop(d, None) is not None}

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        with self._lock:
            claimed = []
            for d in digests:
                at = self._condemned.get(d)
                if at is not None and at <= before:
                    claimed.append(d)
            if unlink is not None and claimed:
                unlink(claimed)  # first: if it fails, nothing was deleted
            for d in claimed:
                del self._condemned[d]
                self._blobs.pop(d, None)
            return claimed

    def delete_logs(self, logs: Sequence[str]) -> None:
        with self._lock:
            gone = set(logs)
            for log in gone:
                self._logs.pop(log, None)
            for key in [k for k in self._messages if k[0] in gone]:
                del self._messages[key]

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        moved = 0
        with self._lock:
            for digest, old, new in changes:
                row = self._blobs.get(digest)
                if row is not None and row.data == old:
                    self._blobs[digest] = row._replace(data=new)
                    moved += 1
        return moved

    def close(self) -> None:
        pass
