"""A metadata store that hands every call to another one: the base of wrappers.

Wrappers change a few operations and must pass on all the others - encryption seals log
entries (:mod:`stashpoint.stores.encrypted`), mirrored writes copy commits to a second store
(:mod:`stashpoint.mirror`). Subclassing this instead of :class:`MetadataStore` means a method
added to the interface is forwarded everywhere at once, never silently left to a default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from .base import (
    EPOCH_MAX_AGE,
    BlobInfo,
    BlobRow,
    CheckpointRow,
    Commit,
    Fence,
    LeaseInfo,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
)

__all__ = ["ForwardingStore"]


class ForwardingStore(MetadataStore):
    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.durability = inner.durability
        self.defers_commits = inner.defers_commits
        self.atomic_unlink = inner.atomic_unlink

    def get_meta(self, key: str) -> str | None:
        return self.inner.get_meta(key)

    def set_meta(self, key: str, value: str | None) -> None:
        self.inner.set_meta(key, value)

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        return self.inner.iter_meta(prefix)

    def check_id(self, what: str, name: str) -> None:
        self.inner.check_id(what, name)

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        return self.inner.has_blobs(digests)

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        self.inner.put_blobs(blobs)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        return self.inner.get_blob(digest)

    def get_blobs(self, digests: Sequence[bytes]) -> dict[bytes, BlobRow]:
        return self.inner.get_blobs(digests)

    def iter_blob_digests(self) -> Iterator[bytes]:
        return self.inner.iter_blob_digests()

    def log_info(self, log: str) -> LogInfo | None:
        return self.inner.log_info(log)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        return self.inner.read_messages(log, start, stop)

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        return self.inner.iter_logs()

    def append_log(self, append: LogAppend) -> None:
        self.inner.append_log(append)

    def commit(self, commit: Commit) -> None:
        self.inner.commit(commit)

    def flush(self) -> None:
        self.inner.flush()

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        return self.inner.get_checkpoint(ident)

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        return self.inner.list_checkpoints(session, before=before, limit=limit)

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        return self.inner.find_ids(prefix, session)

    def sessions(self) -> list[str]:
        return self.inner.sessions()

    def branches(self, session: str) -> dict[str, str]:
        return self.inner.branches(session)

    def set_head(
        self,
        session: str,
        branch: str,
        new: str,
        expected: str | None,
        *,
        fence: Fence | None = None,
    ) -> None:
        self.inner.set_head(session, branch, new, expected, fence=fence)

    def set_label(self, ident: str, session: str, label: str | None) -> None:
        self.inner.set_label(ident, session, label)

    def labels(self, session: str) -> dict[str, str]:
        return self.inner.labels(session)

    def close(self) -> None:
        self.inner.close()

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        return self.inner.acquire_lease(session, owner, ttl)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        return self.inner.renew_lease(fence, ttl)

    def release_lease(self, fence: Fence) -> None:
        self.inner.release_lease(fence)

    def lease_info(self, session: str) -> LeaseInfo | None:
        return self.inner.lease_info(session)

    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        return self.inner.iter_checkpoints()

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        return self.inner.iter_blob_info()

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        return self.inner.log_sizes()

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        return self.inner.mark_pruned(session, ids, at)

    def pruned(self, session: str) -> dict[str, str]:
        return self.inner.pruned(session)

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        self.inner.condemn(digests, at, epoch)

    def condemned(self) -> dict[bytes, float]:
        return self.inner.condemned()

    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        return self.inner.condemned_among(digests)

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        return self.inner.revive(digests)

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        return self.inner.sweep_blobs(digests, before, unlink)

    def delete_logs(self, logs: Sequence[str]) -> None:
        self.inner.delete_logs(logs)

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        return self.inner.repoint_blobs(changes)

    def vacuum(self) -> None:
        self.inner.vacuum()

    # Writers in flight and the GC epoch cache live on the backend, which ends a write on
    # commit and refreshes the epoch: a wrapper keeps no copy of either.
    def begin_write(self) -> None:
        self.inner.begin_write()

    def end_write(self) -> None:
        self.inner.end_write()

    def writers_in_flight(self) -> int:
        return self.inner.writers_in_flight()

    def read_gc_epoch(self, max_age: float = EPOCH_MAX_AGE) -> str:
        return self.inner.read_gc_epoch(max_age)

    def note_gc_epoch(self, value: str | None) -> None:
        self.inner.note_gc_epoch(value)
