"""The workspace layer: a directory on disk <-> a Merkle tree in the store."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

from .. import config
from ..blobs.objects import Blobs
from ..errors import IntegrityError, StashpointWarning, UsageError
from ..model import TreeEntry
from ..stores.base import BlobRow
from .restore import Restorer, RestoreStats, clean_temp_files
from .scan import Progress, Scanner, ScanResult
from .statcache import CacheSeal, StatCache, load_shared, save_later
from .tree import Change, TreeReader, shared_reader
from .watch import Watcher, watch_supported

__all__ = [
    "Change",
    "RestoreStats",
    "ScanResult",
    "TreeReader",
    "Workspace",
    "check_root",
    "restoring",
]


@contextlib.contextmanager
def restoring(root: Path, lock_dir: Path | None, *, wait: bool = True) -> Iterator[bool]:
    """Hold the workspace's restore lock while a rewind or fork writes into it; yields
    whether it is held. ``wait=False`` (completing an interrupted restore) does not wait: a
    restore that holds it is alive, not interrupted, and its journal and temp files are its
    own. Best effort: where no lock file can be made, restores are not serialised.

    The lock file lives beside the store (``lock_dir``), else in the user's cache directory,
    named by the workspace root, never in the workspace itself."""
    import fcntl

    if lock_dir is None:
        base = config.value(config.CACHE_HOME) or os.path.join(Path.home(), ".cache")
        lock_dir = Path(base) / "stashpoint" / "locks"
    name = hashlib.sha256(os.fsencode(root)).hexdigest()[:32]
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(
            lock_dir / f"restore-{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        except OSError:
            yield True  # a file system without locks
            return
        yield True
    finally:
        os.close(fd)


def check_root(root: Path, *, force: bool = False) -> Path:
    """Refuse roots that are almost certainly a mistake."""
    root = root.resolve()
    if not root.is_dir():
        raise UsageError(f"workspace {root} is not a directory")
    if force:
        return root
    risky = {Path("/").resolve(), Path.home().resolve()}
    if root in risky:
        raise UsageError(
            f"refusing to snapshot {root}: it is the filesystem root or your home directory, "
            "which would scan everything below it; choose a project directory or pass --force"
        )
    return root


class Workspace:
    """A directory whose snapshots go into ``blobs``; ``cache_dir`` holds its stat cache."""

    def __init__(
        self,
        root: Path,
        blobs: Blobs,
        *,
        store_id: str,
        epoch: str,
        cache_dir: Path | None,
        exclude: tuple[Path, ...] = (),
        watch: bool = False,
        seal: CacheSeal | None = None,
    ) -> None:
        self.root = root
        self._seal = seal
        """Protects the stat cache file in a keyed or encrypted store (see statcache)."""
        self.watcher: Watcher | None = None
        if watch and watch_supported():
            self.watcher = Watcher(os.fsencode(root))
        self.blobs = blobs
        self._store_id = store_id
        self._epoch = epoch
        key = hashlib.sha256(os.fsencode(root)).hexdigest()[:24]
        self._cache_path = cache_dir / f"stat-{key}.bin" if cache_dir is not None else None
        self._exclude = frozenset(os.fsencode(p) for p in exclude)
        self.reader = shared_reader(blobs)
        self._pending_cache: StatCache | None = None
        self._scanned: StatCache | None = None
        self._mem_cache: StatCache | None = None

    def _cache(self) -> StatCache:
        # Under a watcher the baseline is this object's own last scan, in memory: a cache
        # file another process wrote meanwhile may describe an older moment than the one the
        # watcher's events are relative to.
        if self._cache_path is None or (self.watcher is not None and self._mem_cache is not None):
            if self._mem_cache is None:
                self._mem_cache = StatCache(self._store_id, self._epoch, str(self.root), self._seal)
            return self._mem_cache
        return load_shared(
            self._cache_path, self._store_id, self._epoch, str(self.root), self._seal
        )

    def scan(self, *, progress: Progress | None = None) -> tuple[ScanResult, list[BlobRow]]:
        """Snapshot the directory; returns the result and the blob rows still to commit."""
        epoch = self.blobs.meta.read_gc_epoch()
        if epoch != self._epoch:  # a GC condemned blobs: cached digests may name them
            self._epoch, self._mem_cache = epoch, None
            if self.watcher is not None:
                self.watcher.everything = True  # the new baseline is a full scan
        writer = self.blobs.writer()
        if self.watcher is not None:
            self.watcher.drain()  # every change made before this call is in the queue now
        scanner = Scanner(
            os.fsencode(self.root),
            writer,
            self._cache(),
            exclude=self._exclude,
            progress=progress,
            watcher=self.watcher,
            reader=self.reader,
        )
        result = scanner.run()
        pending = writer.take_pending()
        self._scanned = scanner.new
        self._pending_cache = scanner.new if scanner.cache_changed else None
        return result, pending

    def take_over(self, old: Workspace) -> None:
        """Continue ``old``'s watch of the same root (its store was closed and opened again):
        its watcher, and the scan its events are relative to."""
        if old.root != self.root:
            raise ValueError(f"{old.root} is not {self.root}")
        if self.watcher is not None and self.watcher is not old.watcher:
            self.watcher.close()
        self.watcher, old.watcher = old.watcher, None
        self._mem_cache = old._mem_cache
        self._epoch = old._epoch

    def save_cache(self) -> None:
        """Persist the stat cache of the last scan (call after its checkpoint committed).

        Only now does the scan become the baseline the watcher's events are relative to.
        """
        if self._scanned is not None:
            self._mem_cache = self._scanned
            self._scanned = None
            if self.watcher is not None:
                self.watcher.settle()
        cache = self._pending_cache
        if cache is not None and self._cache_path is not None:
            save_later(self._cache_path, cache)  # written on a thread: see statcache
            self._pending_cache = None

    def restore(self, current: bytes | None, target: bytes) -> RestoreStats:
        """Make the directory (now tree ``current``) match ``target``, then check every path
        the restore touched. Paths it did not touch were equal in both trees."""
        restorer = Restorer(self.reader)
        mounts = self.watcher.mounts() if self.watcher is not None else None
        stats = restorer.apply(os.fsencode(self.root), current, target, mounts)
        self._check_touched(restorer.touched, set(stats.kept_dirs))
        if stats.mounts:
            shown = ", ".join(os.fsdecode(p) for p in stats.mounts[:5])
            warnings.warn(
                f"left {len(stats.mounts)} mount point(s) in {self.root} as they are: {shown}"
                f"{' …' if len(stats.mounts) > 5 else ''}; another filesystem mounted in the "
                "workspace is not restored (unmount it first to restore what is under it)",
                StashpointWarning,
                stacklevel=2,
            )
        return stats

    def _check_touched(
        self, touched: list[tuple[bytes, TreeEntry | None]], kept: set[bytes]
    ) -> None:
        root = os.fsencode(self.root)
        for rel, want in touched:
            path = root + b"/" + rel
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                st = None
            if want is None:
                ok = st is None or (rel in kept and stat.S_ISDIR(st.st_mode))
            elif st is None:
                ok = False
            elif want.kind == "f":
                ok = stat.S_ISREG(st.st_mode) and st.st_size == want.size
                ok = ok and st.st_mode & 0o7777 == want.mode
            elif want.kind == "d":
                ok = stat.S_ISDIR(st.st_mode) and st.st_mode & 0o7777 == want.mode
            else:
                ok = stat.S_ISLNK(st.st_mode) and os.readlink(path) == want.ref
            if not ok:
                raise IntegrityError(
                    f"{os.fsdecode(rel)} in {self.root} is not what the restore wrote "
                    "(was it modified while the restore ran?); run the command again"
                )

    def verify_equals(self, target: bytes, kept_dirs: list[bytes] | None = None) -> None:
        """Re-scan and check the directory now matches ``target``.

        The only differences allowed are ``kept_dirs``, directories the restore could not
        remove because they hold ignored files (which it never touches), and whatever is at
        or below a mount point (which it leaves as it is).
        """
        result, pending = self.scan()
        if pending:
            self.blobs.meta.put_blobs(pending)
        allowed = set(kept_dirs or ())
        mounts = {os.fsencode(m) for m in result.mounts}
        extra = [
            c
            for c in self.reader.diff(target, result.tree)
            if not (
                c.status == "added"
                and c.new is not None
                and c.new.kind == "d"
                and (c.path in allowed or c.path.rpartition(b"/")[0] in allowed)
            )
            and not (mounts and _at_or_below(c.path, mounts))
        ]
        if extra:
            raise IntegrityError(
                f"workspace {self.root} does not match the restored snapshot after restoring "
                "(was it modified while the restore ran?); run the command again"
            )
        self.save_cache()

    def clean_temp_files(self) -> int:
        return clean_temp_files(os.fsencode(self.root))


def _at_or_below(path: bytes, tops: set[bytes]) -> bool:
    while path:
        if path in tops:
            return True
        path = path.rpartition(b"/")[0]
    return False
