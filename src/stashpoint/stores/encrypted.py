"""Encrypted message logs: a wrapper that seals every log entry on its way into any backend.

Conversations and durable-execution journals are read and appended in many places (session,
durable runs, verify, bundles, the LangGraph saver); sealing them here, at the one interface they
all go through, means none of those places can forget to. Each entry is bound to its log id and
index (AES-GCM associated data), so an entry copied to another position fails to decrypt. The
running hash chain is computed over the plaintext above this layer, as without encryption.

Store meta values that carry application data - durable-run records, compensation plans,
LangGraph's pending writes - are sealed too (bound to their key, stored as ``sealed:<base64>``).
Other meta (``gc_epoch``, ``store_id``, checkouts, GC notes, the encryption marker) stays
plaintext: backends compare some of it inside transactions, and it holds no state.

Records and blobs are sealed elsewhere (:class:`stashpoint.integrity.ChainHasher`,
:class:`stashpoint.blobs.Blobs`), where their identity is known; everything else passes through.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..crypto import Cipher
from ..errors import IntegrityError
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

__all__ = ["EncryptedLogs"]


SEALED_META = ("run:", "compensate:", "langgraph:pending:")
"""Prefixes of meta keys whose values are application data, sealed in an encrypted store."""
_SEALED_PREFIX = "sealed:"


def _aad(log: str, idx: int) -> bytes:
    return f"log\0{log}\0{idx}".encode()


class EncryptedLogs(MetadataStore):
    """A :class:`MetadataStore` whose log entries are stored as AES-GCM ciphertext."""

    def __init__(self, inner: MetadataStore, cipher: Cipher) -> None:
        self.inner = inner
        self.cipher = cipher
        self.url = inner.url
        self.durability = inner.durability
        self.defers_commits = inner.defers_commits
        self.atomic_unlink = inner.atomic_unlink

    # -- the sealed part ------------------------------------------------------------------
    def _seal(self, append: LogAppend) -> LogAppend:
        msgs = [
            (chain, self.cipher.seal(data, _aad(append.log, append.start + i)))
            for i, (chain, data) in enumerate(append.messages)
        ]
        return dataclasses.replace(append, messages=msgs)

    def append_log(self, append: LogAppend) -> None:
        self.inner.append_log(self._seal(append))

    def commit(self, commit: Commit) -> None:
        if commit.append is not None:
            commit = dataclasses.replace(commit, append=self._seal(commit.append))
        self.inner.commit(commit)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        return [
            MessageRow(
                r.idx,
                r.chain,
                self.cipher.open(r.data, _aad(log, r.idx), f"message {r.idx} of log {log}"),
            )
            for r in self.inner.read_messages(log, start, stop)
        ]

    def set_meta(self, key: str, value: str | None) -> None:
        if value is not None and key.startswith(SEALED_META):
            sealed = self.cipher.seal(value.encode(), b"meta\0" + key.encode())
            value = _SEALED_PREFIX + base64.b64encode(sealed).decode("ascii")
        self.inner.set_meta(key, value)

    def get_meta(self, key: str) -> str | None:
        return self._open_meta(key, self.inner.get_meta(key))

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        for key, value in self.inner.iter_meta(prefix):
            opened = self._open_meta(key, value)
            assert opened is not None
            yield key, opened

    def _open_meta(self, key: str, value: str | None) -> str | None:
        if value is None or not key.startswith(SEALED_META):
            return value
        what = f"store setting {key!r}"
        if not value.startswith(_SEALED_PREFIX):
            raise IntegrityError(f"{what} is stored unencrypted in an encrypted store (refused)")
        try:
            raw = base64.b64decode(value[len(_SEALED_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise IntegrityError(f"{what} is corrupt: bad encoding") from None
        return self.cipher.open(raw, b"meta\0" + key.encode(), what).decode()

    # -- passed through -------------------------------------------------------------------
    def flush(self) -> None:
        self.inner.flush()

    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        return self.inner.has_blobs(digests)

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        self.inner.put_blobs(blobs)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        return self.inner.get_blob(digest)

    def iter_blob_digests(self) -> Iterator[bytes]:
        return self.inner.iter_blob_digests()

    def log_info(self, log: str) -> LogInfo | None:
        return self.inner.log_info(log)

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        return self.inner.iter_logs()

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

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        return self.inner.acquire_lease(session, owner, ttl)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        return self.inner.renew_lease(fence, ttl)

    def release_lease(self, fence: Fence) -> None:
        self.inner.release_lease(fence)

    def lease_info(self, session: str) -> LeaseInfo | None:
        return self.inner.lease_info(session)

    def read_gc_epoch(self, max_age: float = EPOCH_MAX_AGE) -> str:
        return self.inner.read_gc_epoch(max_age)

    def note_gc_epoch(self, value: str | None) -> None:
        self.inner.note_gc_epoch(value)

    def set_label(self, ident: str, session: str, label: str | None) -> None:
        self.inner.set_label(ident, session, label)

    def labels(self, session: str) -> dict[str, str]:
        return self.inner.labels(session)

    def close(self) -> None:
        self.inner.close()

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

    # Writers in flight are counted on the backend, which ends them on commit.
    def begin_write(self) -> None:
        self.inner.begin_write()

    def end_write(self) -> None:
        self.inner.end_write()

    def writers_in_flight(self) -> int:
        return self.inner.writers_in_flight()

    def get_head(self, session: str, branch: str) -> str | None:
        return self.inner.get_head(session, branch)
