"""Forwarding by capability: the base of wrappers around a metadata store.

Wrappers change a few operations and must pass on all the others - encryption seals meta values
and log entries (:mod:`stashpoint.stores.encrypted`), mirrored writes copy commits to a second
store (:mod:`stashpoint.mirror`). Each capability protocol of :mod:`.base` has a forwarder here
that passes its methods to ``inner``; :class:`ForwardingStore` is all of them. A method added to
a protocol is added to its forwarder, so it is forwarded everywhere at once, never silently
left to a default. Explicit methods, not ``__getattr__``: every call stays typed.

State a backend keeps for its process - writers in flight, the cached GC epoch - is shared,
not copied: the wrapper's ``writers`` is the backend's registry.
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

__all__ = [
    "ForwardBlobRows",
    "ForwardCheckpointRecords",
    "ForwardCollection",
    "ForwardLeases",
    "ForwardLifecycle",
    "ForwardLogRows",
    "ForwardMetaKV",
    "ForwardRefs",
    "ForwardRetention",
    "ForwardingStore",
]


class _Forwarder:
    inner: MetadataStore


class ForwardMetaKV(_Forwarder):
    def get_meta(self, key: str) -> str | None:
        return self.inner.get_meta(key)

    def set_meta(self, key: str, value: str | None) -> None:
        self.inner.set_meta(key, value)

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        return self.inner.iter_meta(prefix)

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        return self.inner.swap_meta(key, expected, value)


class ForwardBlobRows(_Forwarder):
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

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        return self.inner.iter_blob_info()

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        return self.inner.repoint_blobs(changes)


class ForwardLogRows(_Forwarder):
    def log_info(self, log: str) -> LogInfo | None:
        return self.inner.log_info(log)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        return self.inner.read_messages(log, start, stop)

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        return self.inner.iter_logs()

    def append_log(self, append: LogAppend) -> None:
        self.inner.append_log(append)

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        return self.inner.log_sizes()

    def delete_logs(self, logs: Sequence[str]) -> None:
        self.inner.delete_logs(logs)


class ForwardCheckpointRecords(_Forwarder):
    def commit(self, commit: Commit) -> None:
        self.inner.commit(commit)

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

    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        return self.inner.iter_checkpoints()

    def check_id(self, what: str, name: str) -> None:
        self.inner.check_id(what, name)


class ForwardRefs(_Forwarder):
    def branches(self, session: str) -> dict[str, str]:
        return self.inner.branches(session)

    def get_head(self, session: str, branch: str) -> str | None:
        return self.inner.get_head(session, branch)

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        return self.inner.head_rows(session)

    def head_row(self, session: str, branch: str) -> tuple[str, str | None] | None:
        return self.inner.head_row(session, branch)

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

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        self.inner.set_label(ident, session, label, auth)

    def labels(self, session: str) -> dict[str, str]:
        return self.inner.labels(session)

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        return self.inner.label_rows(session)


class ForwardLeases(_Forwarder):
    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        return self.inner.acquire_lease(session, owner, ttl)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        return self.inner.renew_lease(fence, ttl)

    def release_lease(self, fence: Fence) -> None:
        self.inner.release_lease(fence)

    def lease_info(self, session: str) -> LeaseInfo | None:
        return self.inner.lease_info(session)


class ForwardCollection(_Forwarder):
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

    def vacuum(self) -> None:
        self.inner.vacuum()

    # The epoch cache lives on the backend, which refreshes it as it commits and condemns.
    def read_gc_epoch(self, max_age: float = EPOCH_MAX_AGE) -> str:
        return self.inner.read_gc_epoch(max_age)

    def note_gc_epoch(self, value: str | None) -> None:
        self.inner.note_gc_epoch(value)


class ForwardRetention(_Forwarder):
    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        return self.inner.mark_pruned(session, ids, at)

    def pruned(self, session: str) -> dict[str, str]:
        return self.inner.pruned(session)


class ForwardLifecycle(_Forwarder):
    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


class ForwardingStore(
    ForwardMetaKV,
    ForwardBlobRows,
    ForwardLogRows,
    ForwardCheckpointRecords,
    ForwardRefs,
    ForwardLeases,
    ForwardCollection,
    ForwardRetention,
    ForwardLifecycle,
    MetadataStore,
):
    """A :class:`MetadataStore` that hands every call to ``inner``; subclasses override the
    operations they change."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.durability = inner.durability
        self.defers_commits = inner.defers_commits
        self.atomic_unlink = inner.atomic_unlink
        self.capabilities = inner.capabilities
        self.ref_auth = inner.ref_auth
        self.format_v1 = inner.format_v1
        self.writers = inner.writers  # shared: the backend's commit ends a write begun here
