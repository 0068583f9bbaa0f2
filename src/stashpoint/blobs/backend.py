"""The interface a place for blobs outside the metadata store implements (local dir, S3).

A Protocol, not a base class: :class:`~stashpoint.blobs.local.LocalBlobStore` predates it and
the two share no code, only these methods (chunks one object each, immutable packs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

__all__ = ["BlobBackend"]


class BlobBackend(Protocol):
    before_put: Callable[[bytes], None] | None

    def exclusive(self, attempts: int = 1, pause: float = 0.1) -> AbstractContextManager[bool]:
        """Hold the store alone if no other store object has it open; yields whether it did."""

    def close(self) -> None: ...
    def has(self, digest: bytes) -> bool: ...
    def put(
        self, digest: bytes, codec: int, size: int, data: bytes, *, revive: bool = True
    ) -> None:
        """Store a chunk; ``revive=False`` when the caller revived it already."""

    def get(self, digest: bytes) -> tuple[int, int, bytes] | None: ...
    def size(self, digest: bytes) -> int | None: ...
    def delete(self, digest: bytes) -> int: ...
    def iter_sizes(self) -> Iterator[tuple[bytes, int]]: ...
    def write_pack(self, name: str, parts: list[bytes]) -> list[tuple[int, int]]: ...
    def read_packed(self, name: str, offset: int, length: int) -> bytes: ...
    def packs(self) -> dict[str, tuple[int, float]]: ...
    def delete_pack(self, name: str) -> int: ...
