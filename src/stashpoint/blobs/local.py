"""Blobs as files in a local directory: large chunks one file each, small blobs in packs.

Large chunks get one file each (two-level fan-out, written atomically). Small blobs written in
bulk (a first snapshot: thousands of 1-20 KB files) go into a *pack*: one append-only file
written sequentially and fsynced once, indexed by pointer rows in the metadata database. Ten
thousand fsynced tiny files, or 50 MB pushed through SQLite's WAL (written twice), cost several
times more. Packs are immutable once written; a crash before the
index commits leaves an unreferenced pack that GC removes.

Every open store holds a shared ``flock`` on ``gc.lock``; GC takes it exclusively (without
waiting) to learn that no other store object, in any process, is open, and so no writer can be
between checking that a blob exists and committing the checkpoint that relies on it.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .._fsutil import atomic_write, fsync_dir, mkdir_private
from ..errors import (
    IntegrityError,
    PackMissing,
    StoreError,
)

__all__ = ["LocalBlobStore", "PackMissing"]

_LOCK_WAIT_S = 600.0


_NAME = re.compile(r"[0-9a-f]{64}")
_MAGIC = b"SPB1"
_PACK_MAGIC = b"SPPACK1\n"
_PACK_NAME = re.compile(r"[0-9A-Z]{26}")


class LocalBlobStore:
    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable
        mkdir_private(root)
        self.before_put: Callable[[bytes], None] | None = None
        """Called with a digest before it is stored (revives a condemned chunk first)."""
        self._lock_fd: int | None = os.open(
            root / "gc.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        self._finalizer = weakref.finalize(self, os.close, self._lock_fd)
        self._lock(fcntl.LOCK_SH)

    def _lock(self, how: int) -> None:
        """Take the store lock, waiting while a GC holds it exclusively (it does so briefly)."""
        assert self._lock_fd is not None
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock_fd, how | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"{self.root} stayed locked by a garbage collection for "
                        f"{_LOCK_WAIT_S:.0f} s; is a `stashpoint gc` stuck?"
                    ) from None
                time.sleep(0.02)

    @contextmanager
    def exclusive(self, attempts: int = 1, pause: float = 0.1) -> Iterator[bool]:
        """Hold the store lock exclusively if no other store object has it (tries
        ``attempts`` times); yields whether it did. Other openers wait meanwhile."""
        assert self._lock_fd is not None
        got = False
        for i in range(max(1, attempts)):
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                # The conversion may have dropped our shared lock: take it back.
                self._lock(fcntl.LOCK_SH)
                if i + 1 < attempts:
                    time.sleep(pause)
        try:
            yield got
        finally:
            if got:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH)

    def close(self) -> None:
        """Release the store lock (also done when the object is garbage collected)."""
        self._finalizer()
        self._lock_fd = None

    def _path(self, digest: bytes) -> Path:
        h = digest.hex()
        return self.root / h[:2] / h[2:4] / h

    def has(self, digest: bytes) -> bool:
        return self._path(digest).exists()

    def put(
        self, digest: bytes, codec: int, size: int, data: bytes, *, revive: bool = True
    ) -> None:
        """Store a chunk file. ``revive=False`` when the caller revived it already (writer
        threads, which must not touch the metadata connection)."""
        if revive and self.before_put is not None:
            self.before_put(digest)  # revive first: a GC then cannot delete what we reuse
        path = self._path(digest)
        if path.exists():
            return
        header = _MAGIC + bytes([codec]) + size.to_bytes(8, "big")
        self._write(path, header + data)

    def _write(self, path: Path, data: bytes | list[bytes]) -> None:
        """The crash-safe write protocol; a full or failing disk is a clear StoreError (the
        temp file is gone, nothing refers to the path yet: retry once there is space)."""
        try:
            mkdir_private(path.parent)
            atomic_write(path, data, durable=self.durable)
        except OSError as exc:
            raise StoreError(
                f"cannot write to the blob directory {self.root}: {exc.strerror or exc}"
            ) from exc

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
        spans = []
        offset = len(_PACK_MAGIC)
        for part in parts:
            spans.append((offset, len(part)))
            offset += len(part)
        self._write(path, [_PACK_MAGIC, *parts])  # gathered, not joined: no copy of the pack
        return spans

    def read_packed(self, name: str, offset: int, length: int) -> bytes:
        try:
            with open(self._pack_path(name), "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except FileNotFoundError:
            raise PackMissing(f"pack {name} is missing") from None
        if len(data) != length:
            raise IntegrityError(f"pack {name} is truncated")
        return data

    def read_packed_many(self, name: str, spans: list[tuple[int, int]]) -> list[bytes]:
        """Several entries of one pack, with one open (a restore reads many files per pack)."""
        try:
            fd = os.open(self._pack_path(name), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise PackMissing(f"pack {name} is missing") from None
        try:
            out = [os.pread(fd, length, offset) for offset, length in spans]
        finally:
            os.close(fd)
        if any(len(data) != length for data, (_o, length) in zip(out, spans, strict=True)):
            raise IntegrityError(f"pack {name} is truncated")
        return out

    def packs(self) -> dict[str, tuple[int, float]]:
        """Pack name -> (file size, mtime) of every pack file."""
        out: dict[str, tuple[int, float]] = {}
        try:
            entries = list(os.scandir(self.root / "packs"))
        except FileNotFoundError:
            return out
        for e in entries:
            stem, _, ext = e.name.partition(".")
            if ext == "pack" and _PACK_NAME.fullmatch(stem):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out[stem] = (st.st_size, st.st_mtime)
        return out

    def delete_pack(self, name: str) -> int:
        """Remove a pack file durably; returns the bytes freed (0 if it was gone)."""
        path = self._pack_path(name)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        if self.durable:
            fsync_dir(path.parent)
        return size

    def size(self, digest: bytes) -> int | None:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def delete(self, digest: bytes) -> int:
        """Remove a chunk file; returns the bytes freed (0 if it was gone)."""
        path = self._path(digest)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def iter_sizes(self) -> Iterator[tuple[bytes, int]]:
        """(digest, file size) of every chunk file."""
        for dirpath, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d != "packs"]
            for name in files:
                if _NAME.fullmatch(name):
                    try:
                        size = os.stat(os.path.join(dirpath, name)).st_size
                    except FileNotFoundError:
                        continue
                    yield bytes.fromhex(name), size

    def __iter__(self) -> Iterator[bytes]:
        for digest, _size in self.iter_sizes():
            yield digest
