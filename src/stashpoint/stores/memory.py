"""In-process metadata store: for tests, notebooks and short-lived agents that need no disk."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence

from ..errors import ConflictError
from .base import (
    BlobRow,
    CheckpointRow,
    Commit,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
)

__all__ = ["MemoryStore"]


class MemoryStore(MetadataStore):
    def __init__(self) -> None:
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

    def get_meta(self, key: str) -> str | None:
        return self._meta.get(key)

    def set_meta(self, key: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._meta.pop(key, None)
            else:
                self._meta[key] = value

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        return {d for d in digests if d in self._blobs}

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        with self._lock:
            for b in blobs:
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
            if a is not None and info is not None:
                self._apply_append(a, info)
            for b in commit.blobs:
                self._blobs.setdefault(b.digest, b)
            self._checkpoints[row.id] = row
            if commit.move_head:
                self._heads[key] = row.id

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        return self._checkpoints.get(ident)

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        rows = sorted(
            (r for r in self._checkpoints.values() if r.session == session),
            key=lambda r: r.id,
            reverse=True,
        )
        if before is not None:
            rows = [r for r in rows if r.id < before]
        return rows[:limit] if limit is not None else rows

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        return sorted(
            i
            for i, r in self._checkpoints.items()
            if i.startswith(prefix) and (session is None or r.session == session)
        )[:5]

    def sessions(self) -> list[str]:
        return sorted({s for s, _ in self._heads})

    def branches(self, session: str) -> dict[str, str]:
        return {b: c for (s, b), c in self._heads.items() if s == session}

    def set_head(self, session: str, branch: str, new: str, expected: str | None) -> None:
        with self._lock:
            current = self._heads.get((session, branch))
            if current != expected:
                raise ConflictError(
                    f"branch {branch!r} of session {session!r} moved to {current} "
                    f"(expected {expected}); another writer got there first"
                )
            self._heads[(session, branch)] = new

    def set_label(self, ident: str, session: str, label: str | None) -> None:
        with self._lock:
            if label is None:
                self._labels.pop(ident, None)
            else:
                self._labels[ident] = (session, label)

    def labels(self, session: str) -> dict[str, str]:
        return {i: lab for i, (s, lab) in self._labels.items() if s == session}

    def close(self) -> None:
        pass
