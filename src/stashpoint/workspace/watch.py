"""Watch mode: Linux inotify tells which directories changed, so a snapshot skips the rest.

A scan must stat every file (~3 µs each here, ~35 ms for 10k files before any Python work);
with a watcher, a snapshot after one edit looks at the one name an event named (no directory is
listed again) and re-encodes its directory's tree and its ancestors'.

Correctness rests on three rules:
- a directory is watched *before* it is listed, so any change after the listing is an event;
- events are drained synchronously at snapshot time (no background thread between the kernel
  queue and us), so every change made before the snapshot call is seen by it;
- anything we cannot vouch for falls back to scanning: queue overflow, a failed watch, a changed
  ignore file, a directory moved or deleted, a mount made or removed below the root (which
  makes no event), or no inotify at all.
"""

from __future__ import annotations

import errno
import os
import select
import struct

from ._libc import libc as _lib
from .ignore import ALWAYS_EXCLUDED, IGNORE_FILES
from .mounts import MOUNT_TABLE, mount_points

__all__ = ["Watcher", "watch_supported"]

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_EVENT = struct.Struct("iIII")
_NO_NAMES: frozenset[bytes] = frozenset()
_TMP_PREFIX = b".stashpoint-tmp-"


def watch_supported() -> bool:
    lib = _lib()
    return lib is not None and hasattr(lib, "inotify_init1")


class Watcher:
    """Which directories of one root may have changed since the last :meth:`settle`."""

    def __init__(self, root: bytes) -> None:
        lib = _lib()
        if lib is None:
            raise OSError(errno.ENOSYS, "inotify is not available on this platform")
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._lib = lib
        self.fd: int = fd
        self.root = root
        self._wd_rel: dict[int, bytes] = {}
        self._rel_wd: dict[bytes, int] = {}
        self._dirty: set[bytes] = set()
        self._dirty_below: set[bytes] = set()
        self._names: dict[bytes, set[bytes]] = {}
        """Directory -> the names in it that had an event (created, written, removed...)."""
        self.everything = True
        """True until the first scan, and after anything that makes events untrustworthy."""
        self._relinked = False
        self._links: dict[bytes, frozenset[bytes]] = {}
        """Directory -> its files with more than one hard link. Writing through a link outside
        the watched directory names no watched path in any event, so these are never
        vouched for: every snapshot stats them again."""
        self._mounts: frozenset[bytes] | None = None
        """The mount points below the root, as last read (see :mod:`.mounts`)."""
        self._mount_fd = -1
        self._mount_table: select.poll | None = None
        """Polls the mount table, which reports a change (POLLPRI) once after each."""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._mount_fd >= 0:
            os.close(self._mount_fd)
            self._mount_fd = -1

    def __del__(self) -> None:
        self.close()

    # -- called by the scanner --------------------------------------------------------------
    def watch(self, rel: bytes) -> None:
        """Watch a directory; call before listing it."""
        if rel in self._rel_wd:
            return
        path = self.root + b"/" + rel if rel else self.root
        wd = self._lib.inotify_add_watch(self.fd, path, _MASK)
        if wd < 0:  # ENOSPC (watch limit) and friends: this directory is always scanned
            self._dirty.add(rel)
            return
        self._wd_rel[wd] = rel
        self._rel_wd[rel] = wd

    def mounts(self) -> frozenset[bytes]:
        """The mount points below the root. A mount made or removed changes what a path
        shows without an event in the directory above, so a change voids every promise. The
        table is read again only when a poll on it says it changed (one syscall a snapshot,
        not the ~30 µs of reading it)."""
        if self._mount_table is None:
            try:  # opened before the first read: a change after it is reported
                fd = os.open(MOUNT_TABLE, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._mount_fd = fd
            self._mount_table = select.poll()
            if fd >= 0:
                self._mount_table.register(fd, select.POLLPRI)
        if self._mounts is None or self._mount_fd < 0 or self._mount_table.poll(0):
            mounts = mount_points(self.root)
            if mounts != self._mounts:
                self.everything, self._mounts = True, mounts
        assert self._mounts is not None
        return self._mounts

    def is_clean(self, rel: bytes) -> bool:
        """No event in this directory itself since the last snapshot."""
        return not self.everything and rel in self._rel_wd and rel not in self._dirty

    def subtree_clean(self, rel: bytes) -> bool:
        """No event in this directory or anywhere below it."""
        return self.is_clean(rel) and rel not in self._dirty_below

    def dirty_names(self, rel: bytes) -> frozenset[bytes] | set[bytes] | None:
        """The names in this directory that had an event since the last snapshot; every other
        name it had then is still there, the same file with the same content and metadata
        (any change through this directory, a removal or a rename too, names the child in an
        event), and no other name was added: the scan looks at these names only, without
        listing the directory. None: no such promise (no watch, or events were lost), so
        every name must be looked at."""
        if self.everything or rel not in self._rel_wd:
            return None
        return self._names.get(rel, _NO_NAMES)

    def set_links(self, rel: bytes, names: list[bytes]) -> None:
        """The scanner saw these hard-linked files when it listed ``rel``."""
        if names:
            new = frozenset(names)
            if not self.everything and not new <= self._links.get(rel, _NO_NAMES):
                # A link just made here to a file of another directory: creating it changed
                # that file's link count, which no watched directory hears of, so nobody
                # knows yet that the other name must be stat-ed at every snapshot. The next
                # snapshot stats everything once, and finds it.
                self._relinked = True
            self._links[rel] = new
        else:
            self._links.pop(rel, None)

    # -- called around a snapshot -----------------------------------------------------------
    def drain(self) -> None:
        """Read every queued event (non-blocking) and mark what it touched."""
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                self.everything = True
                return
            if not buf:
                return
            self._parse(buf)

    def _parse(self, buf: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
            name = buf[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
            offset += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                self.everything = True
                continue
            rel = self._wd_rel.get(wd)
            if rel is None:
                continue
            if mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED):
                self._forget(wd, rel)
                self._mark(rel.rpartition(b"/")[0] if b"/" in rel else b"")
                continue
            if name in ALWAYS_EXCLUDED or name.startswith(_TMP_PREFIX):
                continue
            if name in IGNORE_FILES:
                self.everything = True  # ignore rules changed: decisions below may change
            self._mark(rel)
            if name:
                names = self._names.get(rel)
                if names is None:
                    names = self._names[rel] = set()
                names.add(name)
            if mask & (_IN_MOVED_FROM | _IN_DELETE | _IN_CREATE | _IN_MOVED_TO):
                child = rel + b"/" + name if rel else name
                wd_child = self._rel_wd.get(child)
                if wd_child is not None:  # a watched directory moved away or was replaced
                    self._forget(wd_child, child)

    def _forget(self, wd: int, rel: bytes) -> None:
        self._wd_rel.pop(wd, None)
        if self._rel_wd.get(rel) == wd:
            del self._rel_wd[rel]
        # everything below was reached through this directory's old path
        prefix = rel + b"/" if rel else b""
        for other in [r for r in self._rel_wd if r.startswith(prefix) and r != rel]:
            wd_other = self._rel_wd.pop(other)
            self._wd_rel.pop(wd_other, None)
            self._lib.inotify_rm_watch(self.fd, wd_other)

    def _mark(self, rel: bytes) -> None:
        self._dirty.add(rel)
        while rel:
            rel = rel.rpartition(b"/")[0] if b"/" in rel else b""
            if rel in self._dirty_below:
                break
            self._dirty_below.add(rel)

    def settle(self) -> None:
        """After a successful scan: what it saw is the new baseline."""
        self._dirty.clear()
        self._dirty_below.clear()
        self._names.clear()
        self.everything, self._relinked = self._relinked, False
        for rel, names in self._links.items():  # never clean: see _links
            self._mark(rel)
            self._names[rel] = set(names)
