"""Making a directory match a tree: writes only what differs, never outside the root.

Every operation is relative to an open directory descriptor (``dir_fd``) and directories are
entered with ``O_NOFOLLOW``, so a symlink planted where a directory was expected cannot redirect
a write outside the workspace - not even one swapped in while the restore runs. Names come from
verified tree objects and are validated again (no ``/``, ``..``, NUL). Files are written to a
temporary name and renamed into place; directory modes are applied after their contents, so a
read-only directory can still be filled.

Paths that are not in the current tree (ignored files, the store) are never touched; a directory
that still holds such paths is left in place instead of being removed.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from .._fsutil import TMP_MARK, sweep_temp_files
from ..errors import StashpointError
from ..model import TreeEntry
from .tree import TreeReader, validate_name

__all__ = ["RestoreStats", "Restorer", "clean_temp_files"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_TMP = TMP_MARK.encode()


@dataclass
class RestoreStats:
    written: int = 0
    deleted: int = 0
    dirs_created: int = 0
    modes: int = 0
    kept_dirs: list[bytes] = field(default_factory=list)
    """Directories not removed because they hold ignored files (relative paths)."""


class Restorer:
    def __init__(self, reader: TreeReader) -> None:
        self.reader = reader
        self.blobs = reader.blobs
        self.stats = RestoreStats()
        self.touched: list[tuple[bytes, TreeEntry | None]] = []
        """Every path the restore changed, with what it should now be (None: gone)."""

    def apply(self, root: bytes, current: bytes | None, target: bytes) -> RestoreStats:
        """Turn ``root`` (whose content is tree ``current``) into tree ``target``."""
        fd = os.open(root, _DIR_FLAGS)
        try:
            self._sync(fd, current, target, b"")
        except OSError as exc:
            raise StashpointError(
                f"restore failed at {os.fsdecode(exc.filename or b'?')}: {exc.strerror}; "
                "run the command again to complete it"
            ) from exc
        finally:
            os.close(fd)
        return self.stats

    def _sync(self, dfd: int, current: bytes | None, target: bytes | None, rel: bytes) -> None:
        if current == target:
            return
        cur = self.reader.load(current) if current is not None else {}
        tgt = self.reader.load(target) if target is not None else {}
        for name in sorted(cur.keys() | tgt.keys()):
            c, t = cur.get(name), tgt.get(name)
            if c == t:
                continue
            crel = rel + b"/" + name if rel else name
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
                self._create(dfd, name, t, crel)
            elif t.kind == "d":
                if c.ref != t.ref:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                    try:
                        self._sync(sub, c.ref, t.ref, crel)
                    finally:
                        os.close(sub)
                if c.mode != t.mode:
                    self._chmod(dfd, name, t.mode)
            elif t.kind == "f":
                if c.ref != t.ref:
                    self._write_file(dfd, name, t)
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
        try:
            os.unlink(name, dir_fd=dfd)
            self.stats.deleted += 1
        except FileNotFoundError:
            pass

    def _create(self, dfd: int, name: bytes, entry: TreeEntry, rel: bytes) -> None:
        if entry.kind == "f":
            self._write_file(dfd, name, entry)
        elif entry.kind == "l":
            self._write_link(dfd, name, entry)
        else:
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)
                self.stats.dirs_created += 1
            except FileExistsError:
                pass
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            try:
                self._sync(sub, None, entry.ref, rel)
                os.fchmod(sub, entry.mode)
            finally:
                os.close(sub)

    def _write_file(self, dfd: int, name: bytes, entry: TreeEntry) -> None:
        tmp = _TMP + name[:200]
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            for part in self.blobs.iter_content(entry.ref):
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
            os.fchmod(fd, entry.mode)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        self.stats.written += 1

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
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        self.stats.modes += 1


def clean_temp_files(root: bytes) -> int:
    """Remove temp files an interrupted restore left behind; returns how many."""
    return sweep_temp_files(
        Path(os.fsdecode(root)),
        skip_dirs=frozenset({".git", ".stashpoint"}),
        only_dead_writers=False,  # restore temp names carry no pid; the journal says they are ours
    )
