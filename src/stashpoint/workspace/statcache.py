"""Persistent stat cache: which files are unchanged since the last scan, without reading them.

An entry is trusted only when size, mtime_ns, ctime_ns, inode and mode all match, and only if the
file was not "racy" when cached: a file modified within ``RACY_WINDOW_NS`` of the scan that
cached it could be modified again within the same timestamp tick without its stat changing, so
such files are simply not cached and get re-hashed next time (git's racy-git rule, simplified).
ctime catches tools that restore mtime after an edit.

The cache is a hint: a missing, stale or corrupt cache file only costs a re-hash, never
correctness. It records the store id and GC epoch, so blobs it vouches for are known to exist.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from .._fsutil import atomic_write

__all__ = ["RACY_WINDOW_NS", "StatCache", "TreeCacheEntry"]

RACY_WINDOW_NS = 50_000_000
_VERSION = 3

TreeCacheEntry = tuple[int, int, int, bytes, bytes, int, int]


class _Disk(msgspec.Struct, array_like=True):
    version: int
    store_id: str
    epoch: str
    root: str
    paths: list[bytes]
    entries: list[tuple[int, int, int, int, int, bytes]]
    dirs: list[bytes]
    dir_sigs: list[bytes]
    tree_dirs: list[bytes]
    trees: list[TreeCacheEntry]


class StatCache:
    def __init__(self, store_id: str, epoch: str, root: str) -> None:
        self.store_id = store_id
        self.epoch = epoch
        self.root = root
        self.files: dict[bytes, tuple[int, int, int, int, int, bytes]] = {}
        self.dirs: dict[bytes, bytes] = {}
        """Directory relpath -> signature of the ignore rules it was scanned under."""
        self.trees: dict[bytes, TreeCacheEntry] = {}
        """Directory relpath -> (mtime_ns, ctime_ns, inode, ignore signature, tree digest,
        files below, bytes below)."""

    @classmethod
    def load(cls, path: Path | None, store_id: str, epoch: str, root: str) -> StatCache:
        cache = cls(store_id, epoch, root)
        if path is None:
            return cache
        try:
            disk = msgspec.msgpack.decode(path.read_bytes(), type=_Disk)
        except (OSError, msgspec.DecodeError, ValueError):
            return cache
        if (disk.version, disk.store_id, disk.epoch, disk.root) != (
            _VERSION,
            store_id,
            epoch,
            root,
        ):
            return cache
        cache.files = dict(zip(disk.paths, disk.entries, strict=False))
        cache.dirs = dict(zip(disk.dirs, disk.dir_sigs, strict=False))
        cache.trees = dict(zip(disk.tree_dirs, disk.trees, strict=False))
        return cache

    def save(self, path: Path) -> None:
        disk = _Disk(
            _VERSION,
            self.store_id,
            self.epoch,
            self.root,
            list(self.files),
            list(self.files.values()),
            list(self.dirs),
            list(self.dirs.values()),
            list(self.trees),
            list(self.trees.values()),
        )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Not fsynced: losing the cache costs a re-hash, never a wrong snapshot.
        atomic_write(path, msgspec.msgpack.encode(disk), durable=False)
