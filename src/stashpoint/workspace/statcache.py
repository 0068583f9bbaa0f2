"""Persistent stat cache: which files are unchanged since the last scan, without reading them.

An entry is trusted only when size, mtime_ns, ctime_ns, inode and mode all match, and only if the
file was not "racy" when cached: a file modified within one timestamp tick of the scan that
cached it could be modified again within the same tick without its stat changing, so such files
are cached with an mtime that never matches and get re-hashed next time (git's racy-git rule).
The tick is the kernel's coarse clock (file times come from it), with a margin, unless the
file's mtime is a whole second: then it may live on a filesystem that keeps only seconds
(ext3, HFS+, FAT's two), and the window is seconds wide. ctime catches tools that restore mtime
after an edit.

Linux's multigrain timestamps (6.13+: a change after a stat gets a later ctime) do not make the
window unnecessary: a write stamps the inode before it copies its bytes, so a scan can see the
final ctime, read the old bytes, and see the same ctime again after the read. Only the window
sends such a file back for a second read (measured: a 64 MiB in-place write read mid-copy),
which is why it grows with the file's size (:data:`COPY_NS_PER_BYTE`).

The cache is a hint: a missing, stale or corrupt cache file only costs a re-hash, never
correctness. It records the store id and GC epoch, so blobs it vouches for are known to exist.

It is also a way in: an entry says "this unchanged file has this content digest", and the next
checkpoint records that digest without reading the file. Someone who can write the cache could
point an unchanged file at an older or planted blob, and the victim's next checkpoint would
seal it with the victim's key. So in a keyed store the cache file carries an HMAC (over all of
it: every path, stat tuple and digest) and in an encrypted store it is AES-GCM ciphertext (no
path's content digest readable either); a cache that does not verify is ignored, which costs
one re-hash (:class:`CacheSeal`). An unkeyed store's cache is plain: nothing there can tell the
user's cache from an attacker's.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._fsutil import atomic_write, mkdir_private
from ..errors import IntegrityError

if TYPE_CHECKING:
    from ..crypto import Cipher

__all__ = [
    "COPY_NS_PER_BYTE",
    "RACY_WINDOW_NS",
    "WHOLE_SECOND_RACY_WINDOW_NS",
    "CacheSeal",
    "FileCacheEntry",
    "StatCache",
    "TreeCacheEntry",
    "flush_saves",
    "is_racy",
    "load_shared",
    "racy_after",
    "save_later",
]


_FILE_CLOCK: int | None = getattr(
    time, "CLOCK_REALTIME_COARSE", 5 if sys.platform.startswith("linux") else None
)
"""The clock the kernel stamps file times with: Linux's CLOCK_REALTIME_COARSE (id 5, which
Python's ``time`` does not name), the time of the last scheduler tick. None elsewhere."""


def _file_clock_ns() -> int | None:
    if _FILE_CLOCK is None:
        return None
    try:
        return time.clock_gettime_ns(_FILE_CLOCK)
    except OSError:
        return None


RACY_WINDOW_NS = 20_000_000
"""Where the file clock cannot be read: a file modified this recently is racy (two 10 ms ticks:
a time read now can be up to a tick ahead of the stamp of a write made now). Was 50 ms: every
file of an agent that checkpoints more often than that was re-read at every snapshot."""
WHOLE_SECOND_RACY_WINDOW_NS = 3_000_000_000
"""The window for an mtime with no sub-second part (a 1 s or 2 s filesystem, or a chance of
one in a billion on a nanosecond one)."""
_SECOND = 1_000_000_000


def racy_after() -> tuple[int, int]:
    """(mtime from which a file is racy, the same for a whole-second mtime) for a scan that
    starts now; see :func:`is_racy`.

    On Linux "now" is the kernel's file clock itself: a write from now on is stamped at least
    this value (a multigrain fine-grained stamp only later), so a file stamped earlier is
    racy only while one write could still be copying it. The 20 ms this replaced (a 10 ms
    guess at the tick, Python has no name for the coarse clock) kept every file an agent
    rewrote within 20 ms racy: 8 agents checkpointing every 3 ms re-read all 4 of their
    files at every snapshot, where 1-2 changed."""
    now = _file_clock_ns()
    wall = time.time_ns()
    return (
        wall - RACY_WINDOW_NS if now is None else now,
        wall - WHOLE_SECOND_RACY_WINDOW_NS,
    )


COPY_NS_PER_BYTE = 10
"""How long one ``write()`` may still be copying a file's bytes after stamping its times, per
byte: 100 MB/s, a tenth of a loaded machine's page-cache copy rate. A single 64 MiB write
stays racy for ~0.7 s, a 2 KiB file for 20 us more than the tick window."""


def is_racy(mtime_ns: int, after: tuple[int, int], size: int = 0) -> bool:
    """Whether a stat with this mtime cannot vouch for the content read with it.

    ``size`` widens the window: a ``write()`` stamps the file before it copies, and one large
    call can copy for longer than a tick, so a scan could read it half-written with times
    that no longer change; racy, it is read again at the next scan."""
    return mtime_ns >= (after[0] if mtime_ns % _SECOND else after[1]) - size * COPY_NS_PER_BYTE


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


_MAC_LEN = 32


class CacheSeal:
    """How a store's stat cache files are protected: AES-GCM with the store's cipher, an
    HMAC-SHA256 prefix with its integrity key, or (unkeyed) nothing. One MAC or seal per file,
    not per entry: a whole-file check costs ~1 ms per 10k entries, on the writer thread."""

    def __init__(self, key: bytes | None = None, cipher: Cipher | None = None) -> None:
        self.cipher = cipher
        self._key = (
            hmac.new(key, b"stashpoint stat cache v1", hashlib.sha256).digest()
            if key is not None and cipher is None
            else None
        )
        self.ident = (
            f"aead:{cipher.key_id}"
            if cipher is not None
            else "plain"
            if self._key is None
            else "mac:" + hashlib.sha256(self._key).hexdigest()[:16]
        )
        """Which protection: caches kept in memory are shared only under the same one."""

    def wrap(self, data: bytes, aad: bytes) -> bytes:
        if self.cipher is not None:
            return self.cipher.seal(data, b"statcache\0" + aad)
        if self._key is not None:
            return hmac.new(self._key, aad + b"\0" + data, hashlib.sha256).digest() + data
        return data

    def unwrap(self, raw: bytes, aad: bytes) -> bytes | None:
        """The cache bytes, or None when they do not verify (ignored: a re-hash)."""
        if self.cipher is not None:
            try:
                return self.cipher.open(raw, b"statcache\0" + aad, "stat cache")
            except IntegrityError:
                return None
        if self._key is not None:
            mac, data = raw[:_MAC_LEN], raw[_MAC_LEN:]
            good = hmac.new(self._key, aad + b"\0" + data, hashlib.sha256).digest()
            return data if hmac.compare_digest(mac, good) else None
        return raw


_PLAIN = CacheSeal()


class StatCache:
    def __init__(self, store_id: str, epoch: str, root: str, seal: CacheSeal | None = None) -> None:
        self.store_id = store_id
        self.epoch = epoch
        self.root = root
        self.seal = seal or _PLAIN
        """Applied when the cache is written; a cache read through it verified."""
        self.files: dict[bytes, FileCacheEntry] = {}
        self.dirs: dict[bytes, bytes] = {}
        """Directory relpath -> signature of the ignore rules it was scanned under."""
        self.trees: dict[bytes, TreeCacheEntry] = {}
        """Directory relpath -> (mtime_ns, ctime_ns, inode, ignore signature, tree digest,
        files below, bytes below)."""

    @classmethod
    def load(
        cls, path: Path | None, store_id: str, epoch: str, root: str, seal: CacheSeal | None = None
    ) -> StatCache:
        cache = cls(store_id, epoch, root, seal)
        if path is None:
            return cache
        try:
            data = cache.seal.unwrap(path.read_bytes(), os.fsencode(root))
            if data is None:
                return cache  # altered, or written under another key: rescan
            disk = msgspec.msgpack.decode(data, type=_Disk)
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
            mkdir_private(path.parent)
        # Not fsynced: losing the cache costs a re-hash, never a wrong snapshot.
        data = self.seal.wrap(msgspec.msgpack.encode(disk), os.fsencode(self.root))
        atomic_write(path, data, durable=False)


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
_work = threading.Condition(_lock)
"""Notified when a cache is queued."""
_done = threading.Condition(_lock)
"""Notified when the queue is empty and nothing is being written."""
_busy = False
_hurry = 0
"""Callers of flush_saves waiting now: while any is, pending caches skip the quiet wait."""
_last_save = 0.0
_IDLE_S = 5.0
"""The writer thread ends after this long without work."""
_QUIET_S = 0.05
"""A cache is written once no new one came for this long: encoding 10k entries holds the GIL
for ~3 ms, which a rewind's next commit (right after its safety checkpoint) waited for; and an
agent checkpointing in a burst gets one write, not one per checkpoint. Exit writes at once."""
_made: set[Path] = set()
"""Cache directories this process created or found (mkdir is a syscall per checkpoint)."""
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


def load_shared(
    path: Path, store_id: str, epoch: str, root: str, seal: CacheSeal | None = None
) -> StatCache:
    """The stat cache in ``path``: the one in memory if the file has not changed since this
    process read or wrote it (or its write is still pending), else decoded from disk."""
    with _lock:
        got = _shared.get(path)
    if (
        got is not None
        and (got[0].store_id, got[0].epoch, got[0].root) == (store_id, epoch, root)
        and got[0].seal.ident == (seal or _PLAIN).ident
        and (got[1] is None or got[1] == _stamp(path))
    ):
        return got[0]
    stamp = _stamp(path)  # before reading: a file replaced meanwhile only looks stale
    cache = StatCache.load(path, store_id, epoch, root, seal)
    if stamp is not None and (cache.files or cache.dirs):
        with _lock:
            if path not in _queue:
                _remember(path, cache, stamp)
    return cache


def save_later(path: Path, cache: StatCache) -> None:
    """Write ``cache`` to ``path`` on a background thread (a later save of the same path
    replaces a pending one); this process uses the in-memory cache meanwhile. Pending writes
    are finished at interpreter exit. The directory is created now (once per process and
    path): the thread never re-creates a store directory removed in the meantime."""
    global _writer, _last_save
    if path.parent not in _made:
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            return  # the store is gone or read-only: the cache is only a hint
        _made.add(path.parent)
    with _lock:
        _remember(path, cache, None)
        idle = not _queue
        _queue[path] = cache
        _last_save = time.monotonic()
        if _writer is None:
            # One thread that waits for work, not one per checkpoint: starting a thread
            # (and waiting for it to run) cost ~0.05 ms of every checkpoint.
            _writer = threading.Thread(target=_write_pending, name="stashpoint-statcache")
            _writer.daemon = True  # it idles; atexit (below) waits for its pending writes
            _writer.start()
        elif idle:
            # Only a writer waiting for work needs waking: one in its quiet wait re-reads
            # _last_save when that wait ends, and one busy writing comes back to the queue.
            # Waking it at every save cost a thread switch per checkpoint.
            _work.notify()


def _write_pending() -> None:
    global _writer, _busy
    while True:
        with _lock:
            while not _queue:
                _done.notify_all()
                if not _work.wait(_IDLE_S) and not _queue:
                    if _writer is threading.current_thread():
                        _writer = None
                    return
            while not _hurry:  # quiet first (see _QUIET_S); a newer save restarts the wait
                left = _last_save + _QUIET_S - time.monotonic()
                if left <= 0:
                    break
                _work.wait(left)
            path, cache = _queue.popitem()
            _busy = True
        try:
            cache.save(path, make_dirs=False)
            stamp = _stamp(path)
        except OSError as exc:
            stamp = None  # a hint: failing to write it only costs a re-hash later
            if isinstance(exc, FileNotFoundError):  # its directory went: the next
                with _lock:  # save_later makes it again, if the store is still there
                    _made.discard(path.parent)
        with _lock:
            _busy = False
            got = _shared.get(path)
            if stamp is not None and got is not None and got[0] is cache and path not in _queue:
                _shared[path] = (cache, stamp)


def flush_saves(timeout: float | None = None) -> None:
    """Write every cache handed to :func:`save_later` now, and wait until they are written."""
    global _hurry
    with _lock:
        if _writer is None or _writer is threading.current_thread():
            return
        _hurry += 1  # a count: one flush finishing must not slow down another still waiting
        _work.notify()
        try:
            _done.wait_for(lambda: not _queue and not _busy, timeout)
        finally:
            _hurry -= 1


atexit.register(flush_saves, 10.0)


def _after_fork() -> None:  # the writer thread does not exist in a child process
    global _lock, _writer, _work, _done, _busy, _hurry
    _lock = threading.Lock()
    _hurry = 0
    _work = threading.Condition(_lock)
    _done = threading.Condition(_lock)
    _writer = None
    _busy = False
    _queue.clear()
    _shared.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
