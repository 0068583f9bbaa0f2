"""The metadata-store interface every backend implements.

Backends store opaque rows: sealing, verifying and decoding records happens above them, in the
session engine, so a backend cannot weaken integrity by accident and a new backend is a few
hundred lines of I/O. The one operation that needs care is :meth:`MetadataStore.commit`: it must
apply everything in a :class:`Commit` atomically, after checking the branch head and the
conversation log tip it was computed against (compare-and-set), or apply nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "BlobRow",
    "CheckpointRow",
    "Commit",
    "LogAppend",
    "LogInfo",
    "MessageRow",
    "MetadataStore",
]


class BlobRow(NamedTuple):
    digest: bytes
    """SHA-256 of the uncompressed content (32 bytes)."""
    codec: int
    """How ``data`` is encoded; see :mod:`stashpoint.blobs`."""
    size: int
    """Uncompressed size."""
    data: bytes


class CheckpointRow(NamedTuple):
    id: str
    session: str
    branch: str
    parent: str | None
    body: bytes
    """Canonical encoding of the record (see :mod:`stashpoint.integrity`)."""
    digest: str


class MessageRow(NamedTuple):
    idx: int
    chain: bytes
    """Running hash after this message (32 bytes)."""
    data: bytes


class LogInfo(NamedTuple):
    session: str
    parent: str | None
    parent_len: int
    """The log continues the first ``parent_len`` messages of ``parent``."""
    length: int
    """Total conversation length at the log's tip (parent prefix included)."""


@dataclass(frozen=True)
class LogAppend:
    log: str
    start: int
    """Index of the first new message; must equal the log's current length."""
    messages: Sequence[tuple[bytes, bytes]]
    """(chain, data) pairs."""
    new: LogInfo | None = None
    """Set when the log is created by this commit."""


@dataclass(frozen=True)
class Commit:
    """Everything one checkpoint adds, applied atomically by :meth:`MetadataStore.commit`."""

    row: CheckpointRow
    expected_head: str | None
    """The branch head the record was built on (its parent), or None for a new branch."""
    append: LogAppend | None = None
    blobs: Sequence[BlobRow] = field(default_factory=tuple)
    move_head: bool = True


class MetadataStore(ABC):
    """Rows for checkpoints, heads, labels, message logs and small (inline) blobs."""

    url: str
    durability: str = "unknown"
    """What a committed checkpoint survives, in words (``stashpoint show`` prints it)."""

    # -- store-level settings -------------------------------------------------------------
    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str | None) -> None:
        """Set (or with None delete) a store-level setting, durably."""

    # -- inline blobs ---------------------------------------------------------------------
    @abstractmethod
    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]: ...

    @abstractmethod
    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        """Store blobs durably; existing digests are left as they are."""

    @abstractmethod
    def get_blob(self, digest: bytes) -> BlobRow | None: ...

    @abstractmethod
    def iter_blob_digests(self) -> Iterator[bytes]: ...

    # -- conversation logs ----------------------------------------------------------------
    @abstractmethod
    def log_info(self, log: str) -> LogInfo | None: ...

    @abstractmethod
    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        """The log's own rows with ``start <= idx < stop``, in order."""

    @abstractmethod
    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]: ...

    @abstractmethod
    def append_log(self, append: LogAppend) -> None:
        """Append to a log (creating it when ``append.new`` is set) if its tip is still
        ``append.start``; else raise ConflictError and write nothing. Durable on return: the
        durable-execution journal records each step's result this way, between checkpoints."""

    # -- checkpoints ----------------------------------------------------------------------
    @abstractmethod
    def commit(self, commit: Commit) -> None:
        """Apply a commit atomically or raise ConflictError and apply nothing."""

    @abstractmethod
    def get_checkpoint(self, ident: str) -> CheckpointRow | None: ...

    @abstractmethod
    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        """A session's checkpoints, newest first (ids sort by time)."""

    @abstractmethod
    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        """Ids starting with ``prefix`` (for abbreviated ids), at most a few."""

    @abstractmethod
    def sessions(self) -> list[str]: ...

    # -- heads, labels, checkouts ---------------------------------------------------------
    @abstractmethod
    def branches(self, session: str) -> dict[str, str]:
        """Branch name -> head checkpoint id."""

    @abstractmethod
    def set_head(self, session: str, branch: str, new: str, expected: str | None) -> None:
        """Compare-and-set a branch head; ConflictError when it is not ``expected``."""

    @abstractmethod
    def set_label(self, ident: str, session: str, label: str | None) -> None: ...

    @abstractmethod
    def labels(self, session: str) -> dict[str, str]:
        """Checkpoint id -> current label."""

    @abstractmethod
    def close(self) -> None: ...

    # -- concrete defaults ----------------------------------------------------------------
    def get_head(self, session: str, branch: str) -> str | None:
        return self.branches(session).get(branch)

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
