"""Scanning a workspace into a Merkle tree of content-addressed blobs.

One pass, top-down: list a directory, apply ignore rules, reuse the stat cache for unchanged
files, read and store only what changed, and emit one tree object per directory (bottom-up
digests). An unchanged subtree produces the same digest, so it is stored once for all checkpoints.

Any error fails the scan: a snapshot is complete and consistent or it is not recorded (a
failed add must never leave the old tree recorded as the new snapshot).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import operator
import os
import stat
from collections.abc import Callable, Iterator

import msgspec

from .._fsutil import TMP_MARK
from ..blobs.objects import BlobWriter
from ..errors import StashpointError
from ..model import TreeEntry
from .ignore import ALWAYS_EXCLUDED, IGNORE_FILES, IgnoreContext
from .mounts import mount_points
from .statcache import FileCacheEntry, StatCache, TreeCacheEntry, is_racy, racy_after
from .tree import TreeReader
from .watch import Watcher

__all__ = ["ScanResult", "Scanner", "encode_tree", "gc_paused"]

_tree_encoder = msgspec.msgpack.Encoder()
_TMP = TMP_MARK.encode()
# O_NOATIME avoids an inode write per file read; it needs ownership, which root and the usual
# case (an agent's own workspace) have.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NOATIME", 0)
_DOT = ord(".")  # every always-excluded name and every temp name starts with a dot
_S_IFMT, _S_IFREG, _S_IFDIR = stat.S_IFMT(0o177777), stat.S_IFREG, stat.S_IFDIR


_by_name = operator.attrgetter("name")
_MAX_RETRIES = 5


def _open_for_read(path: bytes) -> int:
    try:  # O_NOFOLLOW: a file swapped for a link under us fails instead of being followed
        return os.open(path, _OPEN_FLAGS)
    except PermissionError:  # O_NOATIME on a file we do not own
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def _unchanged(before: os.stat_result, size: int, after: os.stat_result) -> bool:
    """Same size, mtime, ctime and inode from before the read to after it: the bytes read
    are the file's content at one moment, not a torn mix."""
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns, before.st_ino) == (
        size,
        after.st_mtime_ns,
        after.st_ctime_ns,
        after.st_ino,
    ) and size == after.st_size


def _kept_changing(rel: bytes) -> StashpointError:
    return StashpointError(
        f"snapshot failed: {os.fsdecode(rel)} kept changing while it was read; "
        "stop the writer or ignore the file in .stashpointignore"
    )


Progress = Callable[[int, int], None]
"""Called with (files read so far, bytes read so far)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: the caller's setting comes back after, also on
    an error (nested pauses end with the outermost).

    A scan makes no reference cycles, but what it keeps until its checkpoint commits (a
    cache entry per file, a row per blob, ~3 objects a file) made collections traverse them
    all again and again while they piled up: ~170 ms of a 50k-file first snapshot.

    When the pause ends, what it allocated goes straight to the oldest generation
    (:func:`_promote_young`) instead of being traversed by the young collection the next
    allocation would start: that one collection visited ~110k objects of a 50k-file first
    snapshot (a stat cache tuple and a pack row per file, none of them garbage): ~40 ms of
    the scanning thread's CPU, on the critical path, then another ~15 ms in the commit."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            _promote_young()
            gc.enable()


def _promote_young() -> None:
    """Move every tracked object to the oldest generation without traversing any.

    ``gc.freeze()`` moves all of them to the permanent generation and ``gc.unfreeze()`` back
    into the oldest one: two list splices, whatever their number. They are looked at by the
    next full collection, as they would have been once promoted (their count does not make
    that one come sooner; a cycle among them waits for it; the stat cache's tuples of
    numbers and bytes, which the young collection used to untrack, are untracked by it
    instead: one visit each, off the snapshot's path). Skipped when the program froze
    objects itself (say before a fork, to keep their pages shared): unfreezing would undo
    that."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def encode_tree(entries: list[TreeEntry]) -> bytes:
    return _tree_encoder.encode(entries)


class ScanResult:
    __slots__ = ("bytes", "files", "mounts", "read_bytes", "read_files", "skipped", "tree")

    def __init__(
        self,
        tree: bytes,
        files: int = 0,
        bytes: int = 0,
        read_files: int = 0,
        read_bytes: int = 0,
        skipped: list[str] | None = None,
        mounts: list[str] | None = None,
    ) -> None:
        self.tree = tree
        self.files = files
        self.bytes = bytes
        self.read_files = read_files
        self.read_bytes = read_bytes
        self.skipped: list[str] = [] if skipped is None else skipped
        """Paths left out because they are neither file, directory nor symlink."""
        self.mounts: list[str] = [] if mounts is None else mounts
        """Mount points left out: another filesystem, not the workspace's (see mounts)."""

    def __repr__(self) -> str:
        return (
            f"ScanResult(tree={self.tree!r}, files={self.files!r}, bytes={self.bytes!r}, "
            f"read_files={self.read_files!r}, read_bytes={self.read_bytes!r}, "
            f"skipped={self.skipped!r}, mounts={self.mounts!r})"
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _scan_fields(self) == _scan_fields(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq is


_scan_fields = operator.attrgetter(*ScanResult.__slots__)


class _Named:
    """A name in a directory that is not listed again (watch mode): what the scan loop uses
    of an :class:`os.DirEntry`, with its ``lstat`` made when asked for."""

    __slots__ = ("name", "path")

    def __init__(self, path: bytes, name: bytes) -> None:
        self.path, self.name = path, name

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return os.lstat(self.path) if not follow_symlinks else os.stat(self.path)


class Scanner:
    """Scans one workspace root; ``exclude`` holds absolute paths never to descend into."""

    def __init__(
        self,
        root: bytes,
        writer: BlobWriter,
        cache: StatCache,
        *,
        exclude: frozenset[bytes] = frozenset(),
        progress: Progress | None = None,
        watcher: Watcher | None = None,
        reader: TreeReader | None = None,
    ) -> None:
        self.root = root
        self.writer = writer
        self.old = cache
        self.new = StatCache(cache.store_id, cache.epoch, cache.root, cache.seal)
        self.watcher = watcher
        if watcher is not None and not watcher.everything:
            # Skipped subtrees keep their entries; scanned directories overwrite theirs.
            self.new.files = dict(cache.files)
            self.new.dirs = dict(cache.dirs)
            self.new.trees = dict(cache.trees)
        self._reader = reader if reader is not None else TreeReader(writer.blobs)
        """Reads stored trees (watch mode) and remembers the trees this scan encodes."""
        self.exclude = exclude
        self._mounts: frozenset[bytes] = frozenset()
        """Absolute paths of the mount points below the root (also in ``exclude``)."""
        self._dev = 0
        """The root's device: a directory on another one is a mount point."""
        self.progress = progress
        self._racy = racy_after()
        self._racy_after = self._racy[0]  # the hot loop's test; whole seconds: see is_racy
        self._result = ScanResult(b"")

    @property
    def cache_changed(self) -> bool:
        """Whether the new stat cache differs from the old one (else skip rewriting it)."""
        return (
            self._result.read_files > 0
            or len(self.new.files) != len(self.old.files)
            or self.new.dirs != self.old.dirs
            or self.new.trees != self.old.trees
        )

    def run(self) -> ScanResult:
        try:
            with gc_paused():
                root_st = os.stat(self.root)
                self._dev = root_st.st_dev
                w = self.watcher
                mounts = w.mounts() if w is not None else mount_points(self.root)
                if mounts:
                    self._mounts = frozenset(self.root + b"/" + m for m in mounts)
                    self.exclude = self.exclude | self._mounts
                digest, nfiles, nbytes, _c = self._scan_dir(
                    self.root, b"", IgnoreContext.root(), root_st
                )
        except OSError as exc:
            raise StashpointError(
                f"snapshot failed at {os.fsdecode(exc.filename or self.root)}: {exc.strerror}"
            ) from exc
        self._result.tree, self._result.files, self._result.bytes = digest, nfiles, nbytes
        return self._result

    def _scan_dir(
        self, path: bytes, rel: bytes, ctx: IgnoreContext, dst: os.stat_result
    ) -> tuple[bytes, int, int, bool]:
        """(tree digest, files, bytes, changed since the cached scan)."""
        w = self.watcher
        known: dict[bytes, TreeEntry] | None = None
        dirty: frozenset[bytes] | set[bytes] | None = None
        if w is not None:
            cached = self.old.trees.get(rel)
            if cached is not None and w.subtree_clean(rel):
                self.new.trees[rel] = cached
                return cached[4], cached[5], cached[6], False
            if cached is not None and w.is_clean(rel):
                return self._scan_partial(path, rel, ctx, cached)
            if cached is not None:
                dirty = w.dirty_names(rel)
                if dirty is not None:
                    try:
                        known = self._reader.load(cached[4])
                    except StashpointError:  # not readable (any more): look at every name
                        known = None
            w.watch(rel)  # before listing: a change after the listing becomes an event
        listed: list[os.DirEntry[bytes]] = []
        here = self._events_context(path, rel, ctx, known) if dirty is not None else None
        if here is not None:
            ctx = here  # the listing is not needed: the events say which names changed
        else:
            with os.scandir(path) as it:
                listed = list(it)
            rules: dict[bytes, bytes] = {}
            for de in listed:
                if de.name in IGNORE_FILES and de.is_file(follow_symlinks=False):
                    with open(de.path, "rb") as f:
                        rules[de.name] = f.read()
            # .gitignore, then .stashpointignore (its patterns decide last), whatever order
            # the file system lists them in: the same files make the same snapshot anywhere.
            ctx = ctx.child(rel, [rules[n] for n in IGNORE_FILES if n in rules])
        old = self.old
        trusted = ctx.empty or old.dirs.get(rel) == ctx.signature
        self.new.dirs[rel] = ctx.signature
        # The directory's tree can be reused without re-encoding when its listing cannot have
        # changed (same mtime/ctime/inode, not racy), the ignore rules are the same, no file in
        # it had to be read and no subdirectory changed.
        dkey = (dst.st_mtime_ns, dst.st_ctime_ns, dst.st_ino, ctx.signature)
        cached = old.trees.get(rel)
        reusable = cached is not None and cached[:4] == dkey
        reads_before = self._result.read_files
        # Per included name, in listing order: a stat-cache hit (an unchanged file: its
        # TreeEntry is only built if this tree has to be re-encoded) or a TreeEntry.
        names: list[bytes] = []
        found: list[TreeEntry | FileCacheEntry] = []
        nfiles = nbytes = 0
        prefix = rel + b"/" if rel else b""
        cached_file = old.files.get
        new_files = self.new.files
        racy_after = self._racy_after
        check_ignores = not ctx.empty
        exclude = self.exclude
        dev = self._dev
        mounted = False
        links: list[bytes] | None = [] if w is not None else None
        listing: list[os.DirEntry[bytes]] | list[_Named] = listed
        if here is not None:
            # Watch mode, not listed: every name the events name is looked at (created,
            # written, removed, replaced: the loop below finds out which), every other name
            # is the file or link the stored tree has, and its subdirectories are entered.
            assert known is not None and dirty is not None
            sep = path if path.endswith(b"/") else path + b"/"
            named = [_Named(sep + name, name) for name in dirty]
            for name, entry in known.items():
                if name in dirty:
                    continue
                if entry.kind == "d":
                    named.append(_Named(sep + name, name))
                    continue
                names.append(name)
                found.append(entry)
                nfiles += 1
                if entry.kind == "f":
                    nbytes += entry.size
            listing = named
        elif known is not None and dirty is not None:
            # Watch mode: a name without an event since the last snapshot, still listed with
            # the same type, is the file (or link) the stored tree has: no stat needed.
            rest = []
            for de in listed:
                k = known.get(de.name)
                if k is None or de.name in dirty:
                    rest.append(de)
                elif k.kind == "f" and de.is_file(follow_symlinks=False):
                    names.append(de.name)
                    found.append(k)
                    nfiles += 1
                    nbytes += k.size
                elif k.kind == "l" and de.is_symlink():
                    names.append(de.name)
                    found.append(k)
                    nfiles += 1
                else:
                    rest.append(de)
            listing = rest
        for e in listing:  # the hot loop of every snapshot: keep it lean
            name = e.name
            if name[0] == _DOT and (name in ALWAYS_EXCLUDED or name.startswith(_TMP)):
                continue
            crel = prefix + name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we looked: it is not part of this moment
            mode = st.st_mode
            if mode & _S_IFMT == _S_IFREG:
                if exclude and e.path in exclude:
                    if e.path in self._mounts:  # (a file bind-mounted here)
                        mounted = True
                        self._leave_out_mount(crel, ctx, False)
                    continue  # the store's own database, kept in the workspace
                if links is not None and st.st_nlink > 1:
                    links.append(name)
                hit = cached_file(crel)
                if check_ignores and not (trusted and hit) and ctx.ignored(crel, False):
                    continue
                if (
                    hit is not None
                    and hit[0] == st.st_size
                    and hit[1] == st.st_mtime_ns
                    and hit[2] == st.st_ctime_ns
                    and hit[3] == st.st_ino
                    and hit[4] == mode
                    and hit[1] < racy_after  # a racy entry was cached with mtime -1 anyway
                ):
                    new_files[crel] = hit
                    names.append(name)
                    found.append(hit)
                    nbytes += hit[0]
                else:
                    had = hit[5] if hit is not None and hit[0] == st.st_size else None
                    digest, size = self._read_file(e.path, crel, st, had)
                    names.append(name)
                    found.append(TreeEntry(name, "f", mode & 0o7777, size, digest))
                    nbytes += size
                nfiles += 1
            elif mode & _S_IFMT == _S_IFDIR:
                if e.path in exclude or st.st_dev != dev:
                    if st.st_dev != dev or e.path in self._mounts:
                        mounted = True
                        self._leave_out_mount(crel, ctx, True)
                    continue
                if check_ignores and not (trusted and crel in old.dirs) and ctx.ignored(crel, True):
                    continue
                sub, n, b, changed = self._scan_dir(e.path, crel, ctx, st)
                reusable = reusable and not changed
                names.append(name)
                found.append(TreeEntry(name, "d", mode & 0o7777, 0, sub))
                nfiles += n
                nbytes += b
            elif check_ignores and ctx.ignored(crel, False):
                continue
            elif stat.S_ISLNK(mode):
                target = os.readlink(e.path)
                names.append(name)
                found.append(TreeEntry(name, "l", 0o777, len(target), target))
                nfiles += 1
                reusable = False  # links are not in the stat cache: always re-encode
            else:
                self._result.skipped.append(os.fsdecode(crel))
        if w is not None and links is not None:
            w.set_links(rel, links)
        if (
            reusable
            and not mounted
            and cached is not None
            and self._result.read_files == reads_before
        ):
            self.new.trees[rel] = cached
            return cached[4], nfiles, nbytes, False
        entries = [
            v if isinstance(v, TreeEntry) else TreeEntry(n, "f", v[4] & 0o7777, v[0], v[5])
            for n, v in zip(names, found, strict=True)
        ]
        digest = self._store_tree(entries, cached[4] if cached is not None else None)
        if not mounted and not is_racy(dst.st_mtime_ns, self._racy):
            self.new.trees[rel] = (*dkey, digest, nfiles, nbytes)
        else:
            # Racy: a scan may not infer "listing unchanged" from this stat (mtime -1 never
            # matches), but watch mode, which relies on events instead, may reuse the tree.
            # So with a mount point left out: mounting or unmounting does not change the
            # directory's stat, and the next scan must look at that name again.
            self.new.trees[rel] = (-1, -1, -1, ctx.signature, digest, nfiles, nbytes)
        # "Changed" for the parent: new content, or this directory's own inode changed (a
        # chmod changes only its ctime and its mode, which the parent's tree records).
        changed = cached is None or cached[4] != digest or cached[:3] != dkey[:3]
        return digest, nfiles, nbytes, changed

    def _leave_out_mount(self, rel: bytes, ctx: IgnoreContext, is_dir: bool) -> None:
        """A mount point is not the workspace's: left out of the snapshot (named in the
        result for a warning, unless the ignore rules leave it out anyway)."""
        if ctx.empty or not ctx.ignored(rel, is_dir):
            self._result.mounts.append(os.fsdecode(rel))

    def _store_tree(self, entries: list[TreeEntry], had: bytes | None = None) -> bytes:
        """Encode one directory's tree object, queue it for storing, return its digest
        (``had``: the digest the cache had for this directory, stored already)."""
        entries.sort(key=_by_name)
        data = encode_tree(entries)
        digest = hashlib.sha256(data).digest()
        if digest != had:
            self.writer.add(data, digest)
        self._reader.prime(digest, entries)
        return digest

    def _events_context(
        self,
        path: bytes,
        rel: bytes,
        ctx: IgnoreContext,
        known: dict[bytes, TreeEntry] | None,
    ) -> IgnoreContext | None:
        """Watch mode, a directory with events: its ignore context when the scan may skip
        listing it (its stored tree, the events since, and the same ignore rules as the
        scan that stored it vouch for every name); None when it must be listed.

        Its ignore files are unchanged (an event on one makes the watcher distrust every
        directory), but are read again, as the listing would: a hard-linked one may have
        changed through another name, and one that ignores itself is in no stored tree.
        Either way the rules then differ from the stored scan's, and the directory is
        listed."""
        if known is None:
            return None
        sig = self.old.dirs.get(rel)
        if sig is None:
            return None
        texts = []
        for name in IGNORE_FILES:
            e = known.get(name)
            if e is not None and e.kind == "f":
                try:
                    with open(path + b"/" + name, "rb") as f:
                        texts.append(f.read())
                except OSError:
                    return None
        here = ctx.child(rel, texts)
        return here if here.signature == sig else None

    def _scan_partial(
        self, path: bytes, rel: bytes, ctx: IgnoreContext, cached: TreeCacheEntry
    ) -> tuple[bytes, int, int, bool]:
        """Watch mode: this directory's own entries are unchanged (no event), but something
        below it changed. Reuse its stored tree and descend only into its subdirectories."""
        entries = self._reader.load(cached[4])
        texts = []
        for name in IGNORE_FILES:
            e = entries.get(name)
            if e is not None and e.kind == "f":
                with open(path + b"/" + name, "rb") as f:
                    texts.append(f.read())
        ctx = ctx.child(rel, texts)
        prefix = rel + b"/" if rel else b""
        out: list[TreeEntry] = []
        nfiles = nbytes = 0
        changed = False
        w = self.watcher
        assert w is not None  # (only watch mode scans partially)
        trees = self.old.trees
        for name, e in entries.items():
            if e.kind == "d":
                crel = prefix + name
                got = trees.get(crel)
                if got is not None and w.subtree_clean(crel):  # no event below: as cached,
                    self.new.trees[crel] = got  # without the lstat _scan_dir would not use
                    out.append(TreeEntry(name, "d", e.mode, 0, got[4]))
                    nfiles += got[5]
                    nbytes += got[6]
                    changed = changed or got[4] != e.ref
                    continue
                sub_path = path + b"/" + name
                sub, n, b, sub_changed = self._scan_dir(sub_path, crel, ctx, os.lstat(sub_path))
                changed = changed or sub_changed
                e = TreeEntry(name, "d", e.mode, 0, sub)
                nfiles += n
                nbytes += b
            else:
                nfiles += 1
                nbytes += e.size if e.kind == "f" else 0
            out.append(e)
        if not changed:
            self.new.trees[rel] = cached
            return cached[4], nfiles, nbytes, False
        digest = self._store_tree(out, cached[4])
        self.new.trees[rel] = (*cached[:4], digest, nfiles, nbytes)
        return digest, nfiles, nbytes, True

    def _read_file(
        self, path: bytes, rel: bytes, st: os.stat_result, known: bytes | None = None
    ) -> tuple[bytes, int]:
        """Read, hash and store a file the stat cache could not vouch for (``known``: the
        digest it had cached, stored already: unchanged content is not stored again)."""
        before = st  # the lstat from the directory listing: one syscall fewer per file
        for _ in range(_MAX_RETRIES):
            fd = _open_for_read(path)
            try:
                digest, size = self.writer.add_file(fd, before.st_size, known)
                after = os.fstat(fd)
            finally:
                os.close(fd)
            if _unchanged(before, size, after):
                self._record(rel, size, after, digest)
                return digest, size
            before = after
        raise _kept_changing(rel)

    def _record(self, rel: bytes, size: int, after: os.stat_result, digest: bytes) -> None:
        """Count a file read and cache its stat."""
        self._result.read_files += 1
        self._result.read_bytes += size
        if self.progress is not None:
            self.progress(self._result.read_files, self._result.read_bytes)
        racy = is_racy(after.st_mtime_ns, self._racy, size)
        # A racy file is re-read next time (its stat may not change with its content:
        # mtime -1 never matches), but its entry still says the name is not ignored.
        self.new.files[rel] = (
            after.st_size,
            -1 if racy else after.st_mtime_ns,
            -1 if racy else after.st_ctime_ns,
            after.st_ino,
            after.st_mode,
            digest,
        )
