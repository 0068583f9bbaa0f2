"""Making a directory match a tree: writes only what differs, never outside the root.

Every operation is relative to an open directory descriptor (``dir_fd``) and directories are
entered with ``O_NOFOLLOW``, so a symlink planted where a directory was expected cannot redirect
a write outside the workspace - not even one swapped in while the restore runs. Names come from
verified tree objects and are validated again (no ``/``, ``..``, NUL). Files are written to a
temporary name and renamed into place; directory modes are applied after their contents, so a
read-only directory can still be filled.

Paths that are not in the current tree (ignored files, the store) are never touched; a directory
that still holds such paths is left in place instead of being removed. A mount point (another
filesystem: see :mod:`.mounts`) is left in place as well: nothing in it or at it is deleted,
written or chmodded, whatever either tree says is there.

Durability: restored files are *not* fsynced, one by one or at the end. Both versions of every
file are already durable in the store (the target snapshot, and the safety checkpoint taken
before the restore), and the restore journal, written before the first file is touched, makes
the next command complete an interrupted restore and re-verify the whole tree: a kill -9 at any
instant is covered. What is not covered is a power loss in the seconds after a restore returned
(the page cache not yet written back): some restored files may then come back old or empty, as
after ``git checkout``, which does not fsync the working tree either; running the rewind again
repairs it. An fsync per file would cost 110 x 0.2-2 ms for the benchmark workload, and a ``syncfs``
flushes every other writer's data on the filesystem too. Files are still written under a temp
name and renamed (a file replaced: exchanged with it, see :meth:`Restorer._swap_in`), never
rewritten in place: a reader sees the old or the new file, never a torn one, a hard link to a
file outside the workspace is replaced rather than written through, and a process that has the
old file mapped keeps its pages.
"""

from __future__ import annotations

import errno
import os
import queue
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._fsutil import TMP_MARK, sweep_temp_files
from ..errors import (
    RestoreBlocked,
    RestoreImpossible,
    StashpointError,
)
from ..model import TreeEntry
from ._libc import libc
from .mounts import mount_points
from .tree import TreeReader, validate_name

__all__ = ["RestoreBlocked", "RestoreImpossible", "RestoreStats", "Restorer", "clean_temp_files"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_TMP = TMP_MARK.encode()
_O_PATH = getattr(os, "O_PATH", 0)  # Linux: a reference to an inode that opens nothing
_HOLD_FLAGS = _O_PATH | os.O_NOFOLLOW | _CLOEXEC
_HOLD_BATCH = 64


class _Releaser:
    """Frees the inodes of replaced and deleted files off the restore's critical path.

    Freeing a file's blocks is most of what replacing it costs on ext4 (~0.1-0.3 ms a file,
    more when the journal is busy). Holding an ``O_PATH`` descriptor on the old file while it
    is renamed over or unlinked defers that work to the descriptor's close, which a background
    thread does. Nothing is opened for reading or writing (``O_PATH``, ``O_NOFOLLOW``: no
    device or FIFO side effect) and nothing on disk depends on it: a crash only frees the
    inodes at exit, as the kernel does for any deleted file still open.
    """

    def __init__(self) -> None:
        self._fds: list[int] = []

    def hold(self, dfd: int, name: bytes) -> None:
        if not _O_PATH:
            return
        try:
            self._fds.append(os.open(name, _HOLD_FLAGS, dir_fd=dfd))
        except OSError:
            return  # absent or unreachable: then there is nothing to defer
        if len(self._fds) >= _HOLD_BATCH:  # bounded: never near the descriptor limit
            self.release()

    def release(self) -> None:
        if self._fds:
            _close_later(self._fds)
            self._fds = []


_closer_lock = threading.Lock()
_closing: queue.SimpleQueue[list[int]] | None = None


def _close_later(fds: list[int]) -> None:
    global _closing
    with _closer_lock:
        if _closing is None:
            _closing = queue.SimpleQueue()
            threading.Thread(
                target=_close_loop, args=(_closing,), name="stashpoint-release", daemon=True
            ).start()
        _closing.put(fds)


def _close_loop(q: queue.SimpleQueue[list[int]]) -> None:
    while True:
        for fd in q.get():
            try:
                os.close(fd)
            except OSError:
                pass


def _after_fork() -> None:  # the closer thread does not exist in a child process
    global _closer_lock, _closing
    _closer_lock = threading.Lock()
    _closing = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_PREFETCH_BYTES = 64 << 20
"""Content read ahead by one restore, at most."""
_PREFETCH_MAX_FILE = 1 << 20


_PERMANENT = frozenset(
    {errno.ENAMETOOLONG, errno.ELOOP, errno.EILSEQ, errno.EINVAL, errno.EMLINK, errno.EFBIG}
)


@dataclass
class RestoreStats:
    written: int = 0
    deleted: int = 0
    dirs_created: int = 0
    modes: int = 0
    kept_dirs: list[bytes] = field(default_factory=list)
    """Directories not removed because they hold ignored files (relative paths)."""
    mounts: list[bytes] = field(default_factory=list)
    """Mount points left as they were (relative paths)."""


class Restorer:
    def __init__(self, reader: TreeReader) -> None:
        self.reader = reader
        self.blobs = reader.blobs
        self.stats = RestoreStats()
        self.touched: list[tuple[bytes, TreeEntry | None]] = []
        """Every path the restore changed, with what it should now be (None: gone)."""
        self._releaser = _Releaser()
        self._exchange = sys.platform.startswith("linux")
        """Whether replacing a file exchanges it for the new one (see :meth:`_swap_in`)."""
        self._prefetched: dict[bytes, bytes] = {}
        self._at = b""
        """The path being restored now (named by an error that names none)."""
        self._mounts: frozenset[bytes] = frozenset()
        """Mount points below the root (relative paths), never entered or replaced."""
        self._dev = 0
        """The root's device: a directory found on another one is a mount point too."""

    def _plan(self, root: int, current: bytes | None, target: bytes) -> None:
        """One walk over what differs, before anything is written, that

        - refuses (RestoreBlocked) a restore that would have to write over a path no snapshot
          holds: a file where the current tree has none, or a directory of the current tree,
          to become a file or link, that holds such paths. Checked first, not on the way: by
          then an ignore file may be gone, and the rollback's scan would count the ignored
          file as the workspace's and delete it;
        - reads the small files it will write in one batch: one query for all their rows
          instead of one per file (a rewind of 110 files spent ~0.1 ms a file fetching).
          Bounded: what does not fit is read file by file."""
        wanted: list[bytes] = []
        budget = _PREFETCH_BYTES

        def walk(cur_ref: bytes | None, tgt_ref: bytes, rel: bytes, check: bool = True) -> None:
            # check=False below a directory that replaces a file or symlink of the current
            # tree: it is made anew, so nothing can be in its way, and a path through the old
            # symlink would look at (and blame) files outside the workspace.
            nonlocal budget
            cur = self.reader.load(cur_ref) if cur_ref is not None else {}
            for name, t in self.reader.load(tgt_ref).items():
                c = cur.get(name)
                if c == t:
                    continue
                crel = rel + b"/" + name if rel else name
                if self._mounts and crel in self._mounts:
                    continue
                if c is None and check:
                    self._refuse_if_present(root, crel, crel, t.kind)
                elif c is not None and c.kind == "d" and t.kind != "d":
                    self._refuse_untracked_below(root, c.ref, crel, t.kind)
                if t.kind == "d":
                    if c is None or c.kind != "d":
                        walk(None, t.ref, crel, check and c is None)
                    elif c.ref != t.ref:  # (only its mode differs otherwise)
                        walk(c.ref, t.ref, crel, check)
                elif (
                    t.kind == "f"
                    and (c is None or c.kind != "f" or c.ref != t.ref)
                    and t.size <= min(_PREFETCH_MAX_FILE, budget)
                ):
                    wanted.append(t.ref)
                    budget -= t.size

        if current != target:
            walk(current, target, b"")
        if wanted:
            self._prefetched = self.blobs.read_many(list(dict.fromkeys(wanted)))

    def apply(
        self,
        root: bytes,
        current: bytes | None,
        target: bytes,
        mounts: frozenset[bytes] | None = None,
    ) -> RestoreStats:
        """Turn ``root`` (whose content is tree ``current``) into tree ``target``
        (``mounts``: the mount points below it, when the caller has them already)."""
        fd = os.open(root, _DIR_FLAGS)
        try:
            self._dev = os.fstat(fd).st_dev
            self._mounts = mount_points(root) if mounts is None else mounts
            self._plan(fd, current, target)
            self._sync(fd, current, target, b"")
        except OSError as exc:
            # A write's error names no file (a full disk): the path being restored does.
            where = os.fsdecode(self._at) if self._at else os.fsdecode(exc.filename or b"?")
            if exc.errno in _PERMANENT:
                shown = where if len(where) <= 160 else f"{where[:80]}...{where[-60:]}"
                raise RestoreImpossible(
                    f"cannot restore {shown} ({len(os.fsencode(where))} bytes): "
                    f"{exc.strerror or exc}; this filesystem cannot hold it, so the restore "
                    "was undone"
                ) from exc
            raise StashpointError(
                f"restore failed at {where}: {exc.strerror or exc}; "
                "run the command again to complete it"
            ) from exc
        finally:
            os.close(fd)
            self._releaser.release()
        return self.stats

    def _refuse_untracked_below(self, root: int, tree: bytes, rel: bytes, kind: str) -> None:
        try:
            fd = os.open(rel, _DIR_FLAGS, dir_fd=root)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            names = [os.fsencode(n) for n in os.listdir(fd)]
        finally:
            os.close(fd)
        known = self.reader.load(tree)
        for name in names:
            entry = known.get(name)
            if name.startswith(_TMP):
                continue
            if entry is None:
                raise _holds_ignored(rel, os.fsdecode(name), kind)
            if entry.kind == "d":
                self._refuse_untracked_below(root, entry.ref, rel + b"/" + name, kind)

    def _sync(self, dfd: int, current: bytes | None, target: bytes | None, rel: bytes) -> None:
        if current == target:
            return
        cur = self.reader.load(current) if current is not None else {}
        tgt = self.reader.load(target) if target is not None else {}
        # Entries are hashable: the names that differ come from one set operation in C.
        for name in sorted({name for name, _e in cur.items() ^ tgt.items()}):
            c, t = cur.get(name), tgt.get(name)
            crel = rel + b"/" + name if rel else name
            if self._mounts and crel in self._mounts:
                self._leave_mount(crel)
                continue
            self._at = crel
            self.touched.append((crel, t))
            if not validate_name(name):  # pragma: no cover - TreeReader already refuses these
                raise StashpointError(f"refusing unsafe name {name!r}")
            if t is None:
                assert c is not None
                self._remove(dfd, name, c, crel)
            elif c is None:
                self._create(dfd, name, t, crel)
            elif c.kind != t.kind:
                self._remove(dfd, name, c, crel)
                if c.kind == "d" and self.stats.kept_dirs[-1:] == [crel]:
                    # (made after _plan looked: it refuses this case before any write)
                    raise _holds_ignored(crel, _some_names(dfd, name), t.kind)
                self._create(dfd, name, t, crel)
            elif t.kind == "d":
                if c.ref != t.ref:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                    try:
                        if self._foreign(sub, crel):
                            continue
                        self._sync(sub, c.ref, t.ref, crel)
                    finally:
                        os.close(sub)
                if c.mode != t.mode:
                    self._chmod(dfd, name, t.mode)
            elif t.kind == "f":
                if c.ref != t.ref or (c.mode != t.mode and _linked(dfd, name)):
                    # A file with other hard links is replaced, never chmodded: its inode may
                    # be a file outside the workspace, whose mode is not the restore's to set.
                    self._write_file(dfd, name, t, replaces=True)
                elif c.mode != t.mode:
                    self._chmod(dfd, name, t.mode)
            elif c.ref != t.ref:
                self._write_link(dfd, name, t)

    def _remove(self, dfd: int, name: bytes, entry: TreeEntry, rel: bytes) -> None:
        if entry.kind == "d":
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except FileNotFoundError:
                return
            try:
                if self._foreign(sub, rel):
                    return
                os.fchmod(sub, 0o700)  # a read-only directory must still be emptied
                self._sync(sub, entry.ref, None, rel)
            finally:
                os.close(sub)
            try:
                os.rmdir(name, dir_fd=dfd)
                self.stats.deleted += 1
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                self.stats.kept_dirs.append(rel)  # holds ignored files: never touched
            return
        if entry.kind == "f":
            self._releaser.hold(dfd, name)
        try:
            os.unlink(name, dir_fd=dfd)
            self.stats.deleted += 1
        except FileNotFoundError:
            pass

    def _create(self, dfd: int, name: bytes, entry: TreeEntry, rel: bytes) -> None:
        """Make a path the current tree does not have. Something already there is not ours
        (an ignored file, the store's own files, a file made since the snapshot): it is never
        overwritten, as git refuses to overwrite untracked files; a directory is entered."""
        if entry.kind != "d":
            self._refuse_if_present(dfd, name, rel, entry.kind)
        if entry.kind == "f":
            self._write_file(dfd, name, entry)
        elif entry.kind == "l":
            self._write_link(dfd, name, entry)
        else:
            existed = False
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                self.stats.dirs_created += 1
            except FileExistsError:
                self._refuse_if_present(dfd, name, rel, "d")
                existed = True
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            try:
                if existed and self._foreign(sub, rel):
                    return
                self._sync(sub, None, entry.ref, rel)
                os.fchmod(sub, entry.mode)
            finally:
                os.close(sub)

    @staticmethod
    def _refuse_if_present(dfd: int, name: bytes, rel: bytes, kind: str) -> None:
        """RestoreBlocked if ``name`` exists (as anything but a directory, when the target is
        one): its content is in no snapshot, so writing over it would lose it for good."""
        try:
            st = os.lstat(name, dir_fd=dfd)
        except (FileNotFoundError, NotADirectoryError):  # (a file where a parent will be)
            return
        if kind == "d" and stat.S_ISDIR(st.st_mode):
            return
        what = {"f": "file", "l": "symlink", "d": "directory"}[kind]
        raise RestoreBlocked(
            f"{os.fsdecode(rel)} exists but is not in the snapshot of this workspace (an ignored "
            f"file, or the store's own), where the checkpoint has a {what}; a rewind never "
            "overwrites what no checkpoint holds: move it away, then run it again"
        )

    def _write_file(
        self, dfd: int, name: bytes, entry: TreeEntry, *, replaces: bool = False
    ) -> None:
        tmp = _TMP + name[:200]
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        except FileExistsError:  # left by an interrupted restore: ours to replace
            os.unlink(tmp, dir_fd=dfd)
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        try:
            try:
                got = self._prefetched.get(entry.ref)
                parts = (got,) if got is not None else self.blobs.iter_content(entry.ref)
                for part in parts:
                    view = memoryview(part)
                    while view:
                        view = view[os.write(fd, view) :]
                os.fchmod(fd, entry.mode)
            finally:
                os.close(fd)
            if replaces:
                self._releaser.hold(dfd, name)
                self._swap_in(dfd, tmp, name)
            else:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        self.stats.written += 1

    def _swap_in(self, dfd: int, tmp: bytes, name: bytes) -> None:
        """Put the written temp file in the place of the file ``name``: exchanged with it
        (one atomic step: ``name`` is the old file, then the new one), then the old one,
        now under the temp name, unlinked. Not a rename over it: ext4 (``auto_da_alloc``)
        answers a rename over an existing file by allocating the new file's blocks and
        starting its writeback inside the rename, which an exchange does not do (measured
        here, 110 files of ~8 KB: 10-18 ms renamed over, 6-10 ms exchanged). Durability is
        as documented above either way: restored files are not fsynced. Where exchanging
        is not supported, the rename."""
        if self._exchange:
            err = _exchange(dfd, tmp, name)
            if not err:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except FileNotFoundError:
                    pass
                except OSError:
                    # Not a file any more (a directory put there meanwhile, which a rename
                    # would have refused): put it back, and fail as the rename would have.
                    _exchange(dfd, tmp, name)
                    raise
                return
            if err in _CANNOT_EXCHANGE:
                self._exchange = False  # (this file system: not again in this restore)
        # Any other failure (the file gone meanwhile...) is the rename's to report or mend.
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)

    def _write_link(self, dfd: int, name: bytes, entry: TreeEntry) -> None:
        tmp = _TMP + name[:200]
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        os.symlink(entry.ref, tmp, dir_fd=dfd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        self.stats.written += 1

    def _chmod(self, dfd: int, name: bytes, mode: int) -> None:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            if self._foreign(fd, self._at):
                return
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        self.stats.modes += 1

    def _foreign(self, fd: int, rel: bytes) -> bool:
        """Whether ``fd`` (a directory about to be entered or changed) is on another device
        than the root: a mount point the mount table did not list. Left in place."""
        if os.fstat(fd).st_dev == self._dev:
            return False
        self._leave_mount(rel)
        return True

    def _leave_mount(self, rel: bytes) -> None:
        if self.touched and self.touched[-1][0] == rel:
            self.touched.pop()  # (not changed: the check after the restore skips it)
        if rel not in self.stats.mounts:
            self.stats.mounts.append(rel)


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_CANNOT_EXCHANGE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
_renameat2: Any = None
"""libc's ``renameat2`` (glibc 2.28+), looked up on first use; False where there is none."""


def _exchange(dfd: int, a: bytes, b: bytes) -> int:
    """Exchange the names ``a`` and ``b`` of directory ``dfd`` atomically (Linux 3.15+:
    ``renameat2(RENAME_EXCHANGE)``); 0, or the errno of the failure."""
    global _renameat2
    if _renameat2 is None:
        lib = libc()
        _renameat2 = getattr(lib, "renameat2", False) if lib is not None else False
    if _renameat2 is False:
        return errno.ENOSYS
    if _renameat2(dfd, a, dfd, b, _RENAME_EXCHANGE) == 0:
        return 0
    import ctypes

    return ctypes.get_errno() or errno.EIO


def _holds_ignored(rel: bytes, names: str, kind: str) -> RestoreBlocked:
    what = "file" if kind == "f" else "symlink"
    return RestoreBlocked(
        f"{os.fsdecode(rel)} is a directory holding ignored files ({names}) where the "
        f"checkpoint has a {what}; a rewind never touches ignored files: move them away, "
        "then run it again"
    )


def _linked(dfd: int, name: bytes) -> bool:
    try:
        return os.lstat(name, dir_fd=dfd).st_nlink > 1
    except FileNotFoundError:
        return False


def _some_names(dfd: int, name: bytes) -> str:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
        try:
            found = sorted(os.listdir(fd))
        finally:
            os.close(fd)
    except OSError:
        return "?"
    shown = ", ".join(os.fsdecode(n) for n in found[:3])
    return shown + (" …" if len(found) > 3 else "")


def clean_temp_files(root: bytes) -> int:
    """Remove temp files an interrupted restore left behind; returns how many. Never in a
    mount point: a restore writes none there."""
    return sweep_temp_files(
        Path(os.fsdecode(root)),
        skip_dirs=frozenset({".git", ".stashpoint"}),
        only_dead_writers=False,  # restore temp names carry no pid; the journal says they are ours
        mounts=frozenset(os.fsdecode(root + b"/" + m) for m in mount_points(root)),
    )
