"""Blobs as files in a local directory: large chunks one file each, small blobs in packs.

Large chunks get one file each (two-level fan-out, written atomically). Small blobs written in
bulk (a first snapshot: thousands of 1-20 KB files) go into a *pack*: one append-only file
written sequentially and fsynced once, indexed by pointer rows in the metadata database. Ten
thousand fsynced tiny files, or 50 MB pushed through SQLite's WAL (written twice), cost several
times more (SPEC §4 first-snapshot bar). Packs are immutable once written; a crash before the
index commits leaves an unreferenced pack that GC removes.
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
_PACK_MAGIC = b"SPPACK1\n"
_PACK_NAME = re.compile(r"[0-9A-Z]{26}")


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

    # -- packs ----------------------------------------------------------------------------
    def _pack_path(self, name: str) -> Path:
        if not _PACK_NAME.fullmatch(name):
            raise IntegrityError(f"invalid pack name {name!r}")
        return self.root / "packs" / f"{name}.pack"

    def write_pack(self, name: str, parts: list[bytes]) -> list[tuple[int, int]]:
        """Write ``parts`` into a new pack; returns (offset, length) of each."""
        path = self._pack_path(name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        spans = []
        offset = len(_PACK_MAGIC)
        for part in parts:
            spans.append((offset, len(part)))
            offset += len(part)
        atomic_write(path, b"".join([_PACK_MAGIC, *parts]), durable=self.durable)
        return spans

    def read_packed(self, name: str, offset: int, length: int) -> bytes:
        try:
            with open(self._pack_path(name), "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except FileNotFoundError:
            raise IntegrityError(f"pack {name} is missing") from None
        if len(data) != length:
            raise IntegrityError(f"pack {name} is truncated")
        return data

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
