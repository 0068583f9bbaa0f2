"""The crash-safe write protocol: temp file in the same directory, fsync, replace, fsync dir."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "TMP_MARK",
    "atomic_file",
    "atomic_write",
    "empty_directory",
    "fsync_dir",
    "mkdir_private",
    "write_parts",
]

TMP_MARK = ".stashpoint-tmp-"
"""Every temporary file stashpoint creates has this in its name, so leftovers can be found."""


def mkdir_private(path: Path) -> None:
    """Create ``path`` and its missing parents, each 0700 (``Path.mkdir(parents=True)`` gives
    the parents the umask's mode: a blob fan-out directory came out 0755)."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except FileNotFoundError:
        if path.parent == path:
            raise
        mkdir_private(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(
    path: Path, *, mode: int = 0o600, durable: bool = True, replace: bool = True
) -> Iterator[int]:
    """A descriptor to write ``path``'s new content to, so that a crash leaves either the old
    file or the new one: a temp file beside it, fsynced, renamed over it, directory fsynced.
    On an error the temp file is removed and ``path`` is left as it was.

    Without ``replace`` the new file only takes a free name: anything found at ``path`` when
    it is published (created after the caller looked) raises FileExistsError and stays as
    it is. A look before the write cannot promise that: a file made in between was replaced.

    A failed fsync raises: it is never retried into a false success.
    """
    tmp = path.parent / f"{TMP_MARK}{path.name}.{os.getpid()}"
    # O_NOFOLLOW: a symlink planted at the temp name fails the write instead of truncating
    # the file it points to.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        yield fd
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    if replace:
        os.replace(tmp, path)
    else:
        _publish_new(tmp, path)
    if durable:
        fsync_dir(path.parent)


# link() cannot make a second name for the file here (FAT, some FUSE and network mounts).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV})


def _publish_new(tmp: Path, path: Path) -> None:
    """Give the finished temp file the name ``path`` only if nothing has it: ``link`` fails
    with EEXIST on anything there (a dangling symlink too) and never replaces, then the temp
    name goes. Where the file system has no hard links, the name is claimed by an exclusive
    create and the temp file renamed over that claim (a writer that opens the claimed name
    meanwhile, without O_EXCL, loses its write: the best such a file system allows)."""
    try:
        try:
            os.link(tmp, path, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            try:
                os.replace(tmp, path)
            except BaseException:
                os.unlink(path)  # our empty claim, not left as if it were the file
                raise
            return
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.unlink(tmp)


def atomic_write(
    path: Path,
    data: bytes | Sequence[bytes],
    *,
    mode: int = 0o600,
    durable: bool = True,
    replace: bool = True,
) -> None:
    """Write ``data`` (or the concatenation of its parts, gathered by ``writev`` without
    joining them in memory first) to ``path`` by :func:`atomic_file`'s protocol."""
    with atomic_file(path, mode=mode, durable=durable, replace=replace) as fd:
        if isinstance(data, bytes):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        else:
            write_parts(fd, data)


_IOV_MAX = 1024  # POSIX guarantees at least 16; Linux and macOS allow 1024


def write_parts(fd: int, parts: Sequence[bytes]) -> None:
    """Write every part, in order, with as few syscalls as ``writev`` allows."""
    pending = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(pending):
        batch = pending[i : i + _IOV_MAX]
        n = os.writev(fd, batch)
        if n <= 0:
            raise OSError(f"writev wrote {n} bytes")
        for view in batch:  # skip what was written; a partial part is resumed
            if n >= len(view):
                n -= len(view)
                i += 1
            else:
                pending[i] = view[n:]
                break


def empty_directory(path: Path, *, remove: bool) -> None:
    """Delete what ``path`` holds (and, with ``remove``, the directory itself, if it can)."""
    import shutil  # here: it imports bz2, lzma and zlib, which a checkpoint never needs

    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if remove:
        with contextlib.suppress(OSError):
            path.rmdir()


def sweep_temp_files(
    root: Path,
    *,
    recursive: bool = True,
    skip_dirs: frozenset[str] = frozenset(),
    only_dead_writers: bool = True,
    mounts: frozenset[str] | None = None,
) -> int:
    """Remove temp files left by writers that died (kill -9) before renaming them.

    With ``only_dead_writers``, a temp file whose name ends in the pid of a live process is
    left alone, so this is safe to run while other processes write. With ``mounts`` (paths
    of mount points), the walk stays on ``root``'s filesystem: it enters neither those nor
    a directory on another device.
    """
    removed = 0
    if not root.is_dir():
        return 0
    dev = root.stat().st_dev if mounts is not None else None
    walker = os.walk(root) if recursive else [(str(root), [], os.listdir(root))]
    for dirpath, dirs, files in walker:
        dirs[:] = [d for d in dirs if d not in skip_dirs]
        if dev is not None:
            dirs[:] = [d for d in dirs if _same_fs(os.path.join(dirpath, d), dev, mounts or ())]
        for name in files:
            if not name.startswith(TMP_MARK):
                continue
            pid_text = name.rsplit(".", 1)[-1]
            if only_dead_writers and pid_text.isdigit() and _alive(int(pid_text)):
                continue
            try:
                os.unlink(os.path.join(dirpath, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _same_fs(path: str, dev: int, mounts: Collection[str]) -> bool:
    try:
        return path not in mounts and os.lstat(path).st_dev == dev
    except OSError:
        return False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
