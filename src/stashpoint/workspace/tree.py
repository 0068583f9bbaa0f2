"""Reading tree objects back: validation of every name, walking, and tree-to-tree diffs.

Diffs descend only into subtrees whose digests differ, so comparing two snapshots of a 50k-file
workspace that differ in one file reads a handful of tree objects.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from ..blobs.objects import Blobs
from ..errors import IntegrityError
from ..model import TreeEntry

__all__ = ["Change", "TreeReader", "shared_reader", "validate_name"]

_tree_decoder = msgspec.msgpack.Decoder(list[TreeEntry])
_KINDS = frozenset({"f", "d", "l"})


def validate_name(name: bytes) -> bool:
    """A single path component that cannot escape its directory."""
    return bool(name) and name not in (b".", b"..") and b"/" not in name and b"\0" not in name


def _valid(entries: dict[bytes, TreeEntry], count: int) -> bool:
    """Every name is a valid, distinct path component (see :func:`validate_name`), every
    kind known, every file and directory reference a 32-byte digest: checked in bulk, as
    a restore loads a hundred trees of thirty names."""
    if len(entries) != count or b"" in entries or b"." in entries or b".." in entries:
        return False
    joined = b"/".join(entries)
    if b"\0" in joined or joined.count(b"/") != max(count - 1, 0):
        return False
    for e in entries.values():
        kind = e.kind
        if kind != "l" and (len(e.ref) != 32 or kind not in _KINDS):
            return False
    return True


class Change(NamedTuple):
    path: bytes
    """Relative path, '/'-separated bytes."""
    status: str
    """``added``, ``deleted``, ``modified``, ``mode`` or ``type``."""
    old: TreeEntry | None
    new: TreeEntry | None


_MAX_CACHED = 4096
"""Trees kept per reader (a full cache is emptied: trees are ~30 entries, cheap to reload)."""


class TreeReader:
    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs
        self._cache: dict[bytes, dict[bytes, TreeEntry]] = {}
        self._primed: dict[bytes, list[TreeEntry]] = {}

    def prime(self, digest: bytes, entries: list[TreeEntry]) -> None:
        """Remember a tree this process just encoded (a scan), so that a restore diffing
        against that snapshot does not read it back. ``entries`` come from listing a real
        directory (valid, distinct names) and ``digest`` is the hash of their encoding."""
        if len(self._primed) >= _MAX_CACHED:
            self._primed.clear()
        self._primed[digest] = entries

    def load(self, digest: bytes) -> dict[bytes, TreeEntry]:
        """Name -> entry of one verified tree object."""
        got = self._cache.get(digest)
        if got is not None:
            return got
        primed = self._primed.pop(digest, None)
        if primed is not None:
            got = {e.name: e for e in primed}
            self._remember(digest, got)
            return got
        data = self.blobs.read(digest)
        try:
            entries = _tree_decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise IntegrityError(f"tree {digest.hex()} is malformed: {exc}") from exc
        out = {e.name: e for e in entries}
        if not _valid(out, len(entries)):
            seen: set[bytes] = set()
            for e in entries:  # the slow way, to name the culprit
                if not validate_name(e.name) or e.name in seen or e.kind not in _KINDS:
                    raise IntegrityError(f"tree {digest.hex()} has an invalid entry {e.name!r}")
                if e.kind != "l" and len(e.ref) != 32:
                    raise IntegrityError(f"tree {digest.hex()} has a malformed reference")
                seen.add(e.name)
            raise IntegrityError(f"tree {digest.hex()} is malformed")  # pragma: no cover
        self._remember(digest, out)
        return out

    def _remember(self, digest: bytes, entries: dict[bytes, TreeEntry]) -> None:
        if len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
        self._cache[digest] = entries

    def walk(self, digest: bytes, prefix: bytes = b"") -> Iterator[tuple[bytes, TreeEntry]]:
        """Every (relpath, entry) below a tree, parents before children."""
        for name, e in sorted(self.load(digest).items()):
            rel = prefix + b"/" + name if prefix else name
            yield rel, e
            if e.kind == "d":
                yield from self.walk(e.ref, rel)

    def diff(self, a: bytes | None, b: bytes | None, prefix: bytes = b"") -> Iterator[Change]:
        """Changes that turn tree ``a`` into tree ``b`` (None is the empty tree)."""
        if a == b:
            return
        old = self.load(a) if a is not None else {}
        new = self.load(b) if b is not None else {}
        for name in sorted(old.keys() | new.keys()):
            o, n = old.get(name), new.get(name)
            rel = prefix + b"/" + name if prefix else name
            if o is None and n is not None:
                yield Change(rel, "added", None, n)
                if n.kind == "d":
                    yield from self.diff(None, n.ref, rel)
            elif n is None and o is not None:
                if o.kind == "d":
                    yield from self.diff(o.ref, None, rel)
                yield Change(rel, "deleted", o, None)
            elif o is not None and n is not None:
                if o.kind != n.kind:
                    if o.kind == "d":
                        yield from self.diff(o.ref, None, rel)
                    yield Change(rel, "type", o, n)
                    if n.kind == "d":
                        yield from self.diff(None, n.ref, rel)
                elif o.kind == "d":
                    if o.mode != n.mode:
                        yield Change(rel, "mode", o, n)
                    yield from self.diff(o.ref, n.ref, rel)
                elif o.ref != n.ref:
                    yield Change(rel, "modified", o, n)
                elif o.mode != n.mode:
                    yield Change(rel, "mode", o, n)


_shared: weakref.WeakKeyDictionary[Blobs, TreeReader] = weakref.WeakKeyDictionary()


def shared_reader(blobs: Blobs) -> TreeReader:
    """One reader for every workspace of a store in this process (tree objects are immutable
    and verified once, so sessions opened one after another reuse each other's trees)."""
    reader = _shared.get(blobs)
    if reader is None:
        reader = _shared[blobs] = TreeReader(blobs)
    return reader
