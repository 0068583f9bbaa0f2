"""Blobs as files in a local directory, two-level fan-out, written atomically.

Only large chunks live here; small blobs are packed into the metadata database, because ten
thousand fsynced tiny files cost far more than one transaction (SPEC §4 first-snapshot bar).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from .._fsutil import TMP_MARK, atomic_write
from ..errors import IntegrityError

__all__ = ["LocalBlobStore"]

_NAME = re.compile(r"[0-9a-f]{64}")
_MAGIC = b"SPB1"


class LocalBlobStore:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, digest: bytes) -> Path:
        h = digest.hex()
        return self.root / h[:2] / h[2:4] / h

    def has(self, digest: bytes) -> bool:
        return self._path(digest).exists()

    def put(self, digest: bytes, codec: int, size: int, data: bytes) -> None:
        path = self._path(digest)
        if path.exists():
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        header = _MAGIC + bytes([codec]) + size.to_bytes(8, "big")
        atomic_write(path, header + data, durable=self.durable)

    def get(self, digest: bytes) -> tuple[int, int, bytes] | None:
        """(codec, size, data), or None when absent; a malformed file is an IntegrityError."""
        try:
            raw = self._path(digest).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) < 13 or raw[:4] != _MAGIC:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad header")
        return raw[4], int.from_bytes(raw[5:13], "big"), raw[13:]

    def delete(self, digest: bytes) -> None:
        try:
            self._path(digest).unlink()
        except FileNotFoundError:
            pass

    def __iter__(self) -> Iterator[bytes]:
        for _dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if _NAME.fullmatch(name):
                    yield bytes.fromhex(name)
                elif TMP_MARK in name:
                    continue
