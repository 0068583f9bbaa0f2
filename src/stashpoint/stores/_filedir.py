"""The file store's directory: one writer at a time (a lock across threads and processes), and
several files written all or nothing through a redo record (``txn.json``).

Why apart from :mod:`.files`: this is how files are written and recovered, whatever they hold;
the store there decides what they hold (documents, logs, heads). The protocol is described in
that module's docstring.
"""

from __future__ import annotations

import fcntl
import os
import threading
import warnings
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from .._fsutil import TMP_MARK, fsync_dir, mkdir_private
from ..errors import IntegrityError, StoreError

_plain = msgspec.json.Encoder()
_any = msgspec.json.Decoder()


def _safe_rel(rel: str) -> bool:
    """A path a redo record may name: relative, inside the store, no ``..``."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _pretty(obj: Any) -> bytes:
    return msgspec.json.format(_plain.encode(obj), indent=2) + b"\n"


class _NotApplied(StoreError):
    """A write failed before it replaced any file: the store is as it was."""


class FileDir:
    """The locked, crash-safe writing of a file store's directory; :class:`.files.FileStore`
    sets these attributes up in its ``__init__``."""

    root: Path
    _tlock: threading.RLock
    _depth: int
    _fd: int | None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time: a thread lock here, an ``flock`` across processes.

        The flock is taken on a descriptor opened for this hold and closed after it: a
        descriptor kept open would be shared by a forked child, whose flock would then be the
        parent's own lock and exclude nothing."""
        with self._tlock:
            if self._fd is None:
                raise StoreError(f"file store {self.root} is closed")
            held = None
            if self._depth == 0:
                try:
                    held = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                    fcntl.flock(held, fcntl.LOCK_EX)
                except OSError as exc:
                    if held is not None:
                        os.close(held)
                    raise StoreError(f"cannot lock file store {self.root}: {exc.strerror}") from exc
            self._depth += 1
            try:
                if self._depth == 1:
                    self._recover()
                yield
            finally:
                self._depth -= 1
                if held is not None:
                    os.close(held)  # releases the flock

    def _read(self, rel: str | Path) -> bytes | None:
        try:
            return (self.root / rel).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.root / rel}: {exc.strerror}") from exc

    def _read_json(self, rel: str, default: Any) -> Any:
        raw = self._read(rel)
        if raw is None:
            return default
        try:
            return _any.decode(raw)
        except msgspec.DecodeError as exc:
            raise IntegrityError(f"{self.root / rel} is corrupt: {exc}") from exc

    def _write(self, rel: str | Path, data: bytes) -> None:
        self._put_files({self.root / rel: data})

    def _put_files(self, files: Mapping[Path, bytes | None]) -> None:
        """Write (None: delete) files by the crash-safe write protocol, in two phases: every new
        content is first written to a temp file and fsynced (where a full disk or an I/O
        error strikes, :class:`_NotApplied`: nothing was replaced, the temps are gone), then
        all are renamed into place and each directory touched is fsynced once."""
        staged: list[tuple[Path, Path]] = []
        dirs: set[Path] = set()
        try:
            for path, data in files.items():
                if data is None:
                    continue
                if not path.parent.is_dir():
                    mkdir_private(path.parent)
                    dirs.add(path.parent.parent)  # its new entry must reach the disk too
                tmp = path.parent / f"{TMP_MARK}{path.name}.{os.getpid()}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                staged.append((tmp, path))
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)  # a failed fsync fails the write: never retried into success
                finally:
                    os.close(fd)
        except OSError as exc:
            for tmp, _path in staged:
                tmp.unlink(missing_ok=True)
            raise _NotApplied(f"cannot write to file store {self.root}: {exc}") from exc
        try:
            for path, data in files.items():
                if data is None:
                    try:
                        path.unlink()
                        dirs.add(path.parent)
                    except FileNotFoundError:
                        pass
            for tmp, path in staged:
                os.replace(tmp, path)
                dirs.add(path.parent)
            for d in sorted(dirs, key=lambda p: -len(p.parts)):
                if d.is_relative_to(self.root):
                    fsync_dir(d)
        except OSError as exc:
            raise StoreError(f"cannot write to file store {self.root}: {exc}") from exc

    def _apply(self, writes: dict[str, bytes | None]) -> None:
        """Write (or with None delete) several files all-or-nothing, through ``txn.json``.

        Failing before any file was replaced (a full disk, the usual case) rolls back: the
        redo record is removed and nothing changed. Only a failure after some renames (very
        rare: renames need no space) leaves the record, and the next writer completes it."""
        if len(writes) > 1:
            record = {k: None if v is None else v.decode() for k, v in writes.items()}
            self._write("txn.json", _plain.encode(record))
        try:
            self._replay(writes)
        except _NotApplied:
            if len(writes) > 1:
                self._unlink("txn.json")
            raise
        except StoreError as exc:
            if len(writes) == 1:
                raise
            # Some files were replaced: the write is decided and will be completed from
            # txn.json. Say so, so a caller does not write it a second time.
            raise StoreError(
                f"{exc}; the write was recorded in {self.root / 'txn.json'} and is completed "
                "by the next write or open of this store: check the history before writing "
                "it again"
            ) from exc
        if len(writes) > 1:
            self._unlink("txn.json")

    def _replay(self, writes: dict[str, bytes | None]) -> None:
        self._put_files({self.root / rel: data for rel, data in writes.items()})

    def _unlink(self, rel: str | Path) -> None:
        path = self.root / rel
        try:
            path.unlink()
            fsync_dir(path.parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreError(f"cannot delete {path}: {exc.strerror}") from exc

    def _recover(self) -> None:
        raw = self._read("txn.json")
        if raw is None:
            return
        try:
            record = _any.decode(raw)
            if not isinstance(record, dict) or not all(
                isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in record.items()
            ):
                raise msgspec.DecodeError("not a redo record")
            if any(not _safe_rel(k) for k in record):
                raise msgspec.DecodeError("a redo record naming a file outside the store")
        except msgspec.DecodeError as exc:
            # It was renamed into place whole, so this is damage, not a torn write: keep it
            # aside for inspection and go on (`verify` reports whatever it leaves missing).
            warnings.warn(f"{self.root / 'txn.json'} is damaged ({exc}); moved aside", stacklevel=2)
            try:
                os.replace(self.root / "txn.json", self.root / "txn.json.damaged")
                fsync_dir(self.root)
            except OSError as err:
                raise StoreError(f"cannot move damaged {self.root / 'txn.json'}: {err}") from err
            return
        self._replay({k: None if v is None else v.encode() for k, v in record.items()})
        self._unlink("txn.json")


_OPEN: weakref.WeakSet[FileDir] = weakref.WeakSet()


def _reset_in_child() -> None:
    """A forked child holds none of its parent's locks, whatever the parent was doing."""
    for store in list(_OPEN):
        store._tlock = threading.RLock()
        store._depth = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
