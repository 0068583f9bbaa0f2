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

import os
import threading
from pathlib import Path

import msgspec

from .._fsutil import atomic_write

__all__ = [
    "RACY_WINDOW_NS",
    "FileCacheEntry",
    "StatCache",
    "TreeCacheEntry",
    "flush_saves",
    "load_shared",
    "save_later",
]

RACY_WINDOW_NS = 50_000_000
_VERSION = 3

FileCacheEntry = tuple[int, int, int, int, int, bytes]
"""(size, mtime_ns, ctime_ns, inode, st_mode, content digest)."""
TreeCacheEntry = tuple[int, int, int, bytes, bytes, int, int]


class _Disk(msgspec.Struct, array_like=True):
    version: int
    store_id: str
    epoch: str
    root: str
    paths: list[bytes]
    entries: list[FileCacheEntry]
    dirs: list[bytes]
    dir_sigs: list[bytes]
    tree_dirs: list[bytes]
    trees: list[TreeCacheEntry]


class StatCache:
    def __init__(self, store_id: str, epoch: str, root: str) -> None:
        self.store_id = store_id
        self.epoch = epoch
        self.root = root
        self.files: dict[bytes, FileCacheEntry] = {}
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

    def save(self, path: Path, *, make_dirs: bool = True) -> None:
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
        if make_dirs:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Not fsynced: losing the cache costs a re-hash, never a wrong snapshot.
        atomic_write(path, msgspec.msgpack.encode(disk), durable=False)


# -- sharing within a process ----------------------------------------------------------------
# Decoding 10k entries costs ~7 ms and writing them ~3-5 ms, of a ~50 ms incremental snapshot.
# So a process keeps the last cache of each file in memory (every session on that workspace
# reuses it while the file is the one it read or wrote: same mtime, size and inode), and
# writes new caches on a background thread, newest first, after the checkpoint committed.
# StatCache objects are never modified once scanned, so sharing them is safe.

Stamp = tuple[int, int, int]

_lock = threading.Lock()
_shared: dict[Path, tuple[StatCache, Stamp | None]] = {}
"""Path -> (cache, stamp of the file holding it; None while our write of it is pending)."""
_queue: dict[Path, StatCache] = {}
_writer: threading.Thread | None = None
_KEEP = 16
"""Caches kept in memory (the most recently used workspaces of this process)."""


def _remember(path: Path, cache: StatCache, stamp: Stamp | None) -> None:
    """Record under ``_lock``; the least recently used entries beyond ``_KEEP`` go."""
    _shared.pop(path, None)
    _shared[path] = (cache, stamp)
    for old in list(_shared)[: max(0, len(_shared) - _KEEP)]:
        if old not in _queue:
            del _shared[old]


def _stamp(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def load_shared(path: Path, store_id: str, epoch: str, root: str) -> StatCache:
    """The stat cache in ``path``: the one in memory if the file has not changed since this
    process read or wrote it (or its write is still pending), else decoded from disk."""
    with _lock:
        got = _shared.get(path)
    if (
        got is not None
        and (got[0].store_id, got[0].epoch, got[0].root) == (store_id, epoch, root)
        and (got[1] is None or got[1] == _stamp(path))
    ):
        return got[0]
    stamp = _stamp(path)  # before reading: a file replaced meanwhile only looks stale
    cache = StatCache.load(path, store_id, epoch, root)
    if stamp is not None and (cache.files or cache.dirs):
        with _lock:
            if path not in _queue:
                _remember(path, cache, stamp)
    return cache


def save_later(path: Path, cache: StatCache) -> None:
    """Write ``cache`` to ``path`` on a background thread (a later save of the same path
    replaces a pending one); this process uses the in-memory cache meanwhile. The thread is
    not a daemon, so a process that exits normally writes its last cache first. The directory
    is created now: the thread never re-creates a store directory removed in the meantime."""
    global _writer
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return  # the store is gone or read-only: the cache is only a hint
    with _lock:
        _remember(path, cache, None)
        _queue[path] = cache
        if _writer is None:
            _writer = threading.Thread(target=_write_pending, name="stashpoint-statcache")
            _writer.start()


def _write_pending() -> None:
    global _writer
    while True:
        with _lock:
            if not _queue:
                _writer = None
                return
            path, cache = _queue.popitem()
        try:
            cache.save(path, make_dirs=False)
            stamp = _stamp(path)
        except OSError:
            stamp = None  # a hint: failing to write it only costs a re-hash later
        with _lock:
            got = _shared.get(path)
            if stamp is not None and got is not None and got[0] is cache and path not in _queue:
                _shared[path] = (cache, stamp)


def flush_saves() -> None:
    """Wait until every cache handed to :func:`save_later` is written."""
    with _lock:
        writer = _writer
    if writer is not None and writer is not threading.current_thread():
        writer.join()


def _after_fork() -> None:  # the writer thread does not exist in a child process
    global _lock, _writer
    _lock = threading.Lock()
    _writer = None
    _queue.clear()
    _shared.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
