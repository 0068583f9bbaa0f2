"""Reading a bundle file: every entry framed, bounded and checked against its digest, then
the whole checked, before an import writes anything.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import msgspec

from ..errors import UsageError
from ..integrity import ChainHasher
from .check import _Checked, _Checker, _Contents
from .format import (
    _ENTRY,
    _HEADER,
    _HEX,
    _IDENT,
    _PIECE,
    _TRAILER,
    BLOB,
    CHUNKS,
    END,
    LOG,
    MAGIC,
    MANIFEST,
    RAW,
    RECORD,
    TREE,
    VERSION,
    Manifest,
    _bytes_at,
    _damaged,
    _log_dec,
    _manifest_dec,
    _record_dec,
    _refused,
    decode_payload,
    iter_content,
)
from .limits import Limits


@dataclass(frozen=True)
class _Slot:
    kind: bytes
    codec: int
    size: int
    offset: int
    length: int
    sha: bytes


class BundleSource(Protocol):
    """What a bundle is read from: a file, or a file whose bytes are transformed on the way
    (``stashpoint copy`` reads its temporary bundle through a cipher: see
    :mod:`stashpoint.copy`)."""

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end)."""

    def pread(self, n: int, offset: int) -> bytes:
        """``n`` bytes at ``offset``, not moving the position ``read`` uses."""

    def close(self) -> None: ...


class _FileSource:
    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def read(self, n: int) -> bytes:
        return self._f.read(n)

    def pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._f.fileno(), n, offset)

    def close(self) -> None:
        self._f.close()


class Bundle:
    """A bundle file that passed every check that does not need the target store.

    Keeps the file open: blob payloads too large to cache are read again at import, each
    checked against the digest it had when it was validated.
    """

    def __init__(self, path: Path, f: BundleSource, size: int) -> None:
        self.path = path
        self._f = f
        self.size = size
        """Bytes of the file."""
        self.contents = _Contents()
        self.slots: dict[bytes, _Slot] = {}
        self.digest = ""
        """Bundle digest (hex), from the trailer."""
        self.bytes = 0
        """Decompressed bytes of all entries."""
        self._cache: dict[bytes, bytes] = {}
        self.checked: _Checked | None = None

    @property
    def manifest(self) -> Manifest:
        assert self.contents.manifest is not None
        return self.contents.manifest

    def payload(self, digest: bytes) -> bytes:
        slot = self.slots[digest]
        data = self._cache.get(digest)
        if data is None:
            data = self._f.pread(slot.length, slot.offset)
            if hashlib.sha256(data).digest() != slot.sha:
                raise _damaged(f"{self.path} changed while it was being imported")
        return data

    def content(self, digest: bytes) -> bytes:
        """A blob's whole content (its declared size in memory: for small blobs)."""
        return b"".join(self.iter_content(digest))

    def iter_content(self, digest: bytes) -> Iterator[bytes]:
        """A blob's content in pieces of at most 1 MiB, read from the file (or the cache)."""
        slot = self.slots[digest]
        cached = self._cache.get(digest)
        if cached is not None:
            read_at = _bytes_at(cached)
        else:
            f, base = self._f, slot.offset

            def read_at(pos: int, n: int) -> bytes:
                return f.pread(n, base + pos)

        return iter_content(read_at, slot.length, slot.codec, slot.size, f"blob {digest.hex()}")

    def _verify(self, progress: Callable[[int, int], None] | None) -> None:
        """Every blob's content against its digest, then every chunked file's whole digest:
        the expensive checks, run after everything cheap passed (sizes, counts, names and
        references, all checked against what the bundle declares), each in bounded memory."""
        checked = self.checked
        assert checked is not None
        done = nbytes = 0
        for digest, slot in sorted(self.slots.items(), key=lambda kv: kv[1].offset):
            if slot.kind != BLOB:
                continue
            h = hashlib.sha256()
            for piece in self.iter_content(digest):
                h.update(piece)
            if h.digest() != digest:
                raise _damaged(f"content of {digest.hex()[:16]} does not match its digest")
            done, nbytes = done + 1, nbytes + slot.size
            if progress is not None:
                progress(done, nbytes)
        for digest in checked.list_sizes:  # whole-file digests of chunked files
            whole = hashlib.sha256()
            lst = self.contents.lists[digest]
            for i in range(0, len(lst), 32):
                for piece in self.iter_content(lst[i : i + 32]):
                    whole.update(piece)
            if whole.digest() != digest:
                raise _damaged(f"chunked content {digest.hex()[:16]} does not match its digest")

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_bundle(
    path: str | os.PathLike[str],
    *,
    hasher: ChainHasher | None = None,
    limits: Limits | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Bundle:
    """Open and check a bundle completely (every digest, size, name, chain and reference).

    ``hasher`` must be the target store's (records are verified with its key, if any).
    Raises IntegrityError (damaged or forged) or UsageError (refused); writes nothing.
    """
    p, limits = Path(path), limits or Limits()
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {p}: {exc.strerror}") from None
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{p} is not a regular file")
    except BaseException:
        f.close()
        raise
    return read_bundle_from(
        _FileSource(f), st.st_size, p, hasher=hasher, limits=limits, progress=progress
    )


def read_bundle_from(
    source: BundleSource,
    size: int,
    name: str | os.PathLike[str],
    *,
    hasher: ChainHasher | None = None,
    limits: Limits | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Bundle:
    """:func:`read_bundle` of ``size`` bytes read from ``source`` (``name`` is what messages
    call it). The bundle owns ``source`` from here on: it is closed with it, or on an error."""
    p, limits = Path(name), limits or Limits()
    try:
        bundle = _Reader(p, source, size, limits, progress).read()
        bundle.checked = _Checker(
            bundle.contents, hasher or ChainHasher(), limits, file_size=size
        ).run()
        bundle._verify(progress)
        return bundle
    except BaseException:
        source.close()
        raise


class _Reader:
    def __init__(
        self,
        path: Path,
        f: BundleSource,
        size: int,
        limits: Limits,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.f = f
        self.limits = limits
        self.progress = progress
        self.size = size
        self.pos = 0
        self.bundle = Bundle(path, f, self.size)
        self.meta_bytes = 0
        self.cache_bytes = 0

    def take(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise _damaged("the file is truncated")
        data = self.f.read(n)
        if len(data) != n:
            raise _damaged("the file is truncated")
        self.pos += n
        return data

    def read(self) -> Bundle:
        b, lim = self.bundle, self.limits
        if self.size < _HEADER.size:
            raise UsageError(f"{b.path} is not a stashpoint bundle")
        head = self.take(_HEADER.size)
        magic, version = _HEADER.unpack(head)
        if magic != MAGIC:
            raise UsageError(f"{b.path} is not a stashpoint bundle")
        if version != VERSION:
            raise _refused(f"format version {version}; this stashpoint reads {VERSION}")
        overall = hashlib.sha256(head)
        cap = lim.expansion_cap(self.size)
        count = total = 0
        while True:
            header = self.take(_ENTRY.size)
            kind, codec, nlen, size, plen, sha = _ENTRY.unpack(header)
            raw_name = self.take(nlen)
            if kind == END:
                payload = self.take(plen)
                if (plen, size, codec, nlen) != (_TRAILER.size, _TRAILER.size, RAW, 0):
                    raise _damaged("malformed trailer")
                if hashlib.sha256(payload).digest() != sha:
                    raise _damaged("the trailer does not match its digest")
                digest, n, nbytes = _TRAILER.unpack(payload)
                if digest != overall.digest():
                    raise _damaged("the bundle digest does not match its entries")
                if (n, nbytes) != (count, total):
                    raise _damaged("the trailer's entry count or size does not match")
                if self.pos != self.size:
                    raise _damaged("there is data after the trailer")
                b.digest, b.bytes = digest.hex(), total
                return b
            overall.update(header + raw_name)
            count += 1
            name = self._name(kind, raw_name, count)
            if count > lim.max_entries:
                raise _refused(f"more than {lim.max_entries} entries")
            if size > lim.max_entry:
                raise _refused(f"entry {name} expands to {size} bytes (limit {lim.max_entry})")
            total += size
            if total > cap:
                rule = (
                    f"{lim.max_ratio}x its size of {self.size}, at most {lim.max_bytes}; "
                    "--max-size SIZE if you trust it"
                    if lim.max_ratio
                    else "--max-size"
                )
                raise _refused(
                    f"it expands to more than {cap} bytes ({rule}): a decompression bomb?"
                )
            if plen > size + (size >> 7) + (1 << 17):  # beyond zstd's worst-case expansion
                raise _damaged(f"entry {name} is larger than its content could compress to")
            offset = self.pos
            if kind == BLOB:  # its content is verified once everything cheap has passed
                self._blob(name, codec, size, offset, plen, sha)
                continue
            self._hold(size)  # before decompressing: what is held in memory is bounded
            payload = self.take(plen)
            if hashlib.sha256(payload).digest() != sha:
                raise _damaged(f"entry {kind.decode()} {name} does not match its digest")
            content = decode_payload(codec, size, payload, f"entry {kind.decode()} {name}")
            self._keep(kind, name, codec, size, offset, payload, sha, content)
            if self.progress is not None:
                self.progress(count, self.meta_bytes)

    def _name(self, kind: bytes, raw: bytes, count: int) -> str:
        if kind not in (MANIFEST, RECORD, LOG, TREE, BLOB, CHUNKS):
            raise _refused(f"unknown entry kind {kind!r}")
        if (count == 1) != (kind == MANIFEST):
            raise _damaged("the manifest must be the first entry, and only that")
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            raise _refused(f"entry name {raw[:80]!r} is not ASCII") from None
        ok = (
            name == "manifest"
            if kind == MANIFEST
            else _IDENT.fullmatch(name) is not None
            if kind in (RECORD, LOG)
            else _HEX.fullmatch(name) is not None
        )
        if not ok:
            raise _refused(f"invalid entry name {name[:80]!r} for kind {kind.decode()}")
        return name

    def _new_object(self, name: str) -> bytes:
        c = self.bundle.contents
        digest = bytes.fromhex(name)
        if digest in c.trees or digest in c.blobs or digest in c.lists:
            raise _refused(f"duplicate entry for {name[:16]}")
        return digest

    def _blob(self, name: str, codec: int, size: int, offset: int, plen: int, sha: bytes) -> None:
        """Read a blob's payload in pieces, checking it against the digest its entry header
        declares (which the bundle digest covers), keeping it only if the cache has room."""
        b = self.bundle
        digest = self._new_object(name)
        h = hashlib.sha256()
        keep = self.cache_bytes + plen <= self.limits.cache_bytes
        pieces = []
        left = plen
        while left:
            piece = self.take(min(left, _PIECE))
            h.update(piece)
            left -= len(piece)
            if keep:
                pieces.append(piece)
        if h.digest() != sha:
            raise _damaged(f"entry B {name} does not match its digest")
        b.contents.blobs[digest] = size
        b.slots[digest] = _Slot(BLOB, codec, size, offset, plen, sha)
        if keep:
            self.cache_bytes += plen
            b._cache[digest] = b"".join(pieces)

    def _hold(self, n: int) -> None:
        self.meta_bytes += n
        if self.meta_bytes > self.limits.max_meta:
            raise _refused(f"its records, logs and trees exceed {self.limits.max_meta} bytes")

    def _keep(
        self,
        kind: bytes,
        name: str,
        codec: int,
        size: int,
        offset: int,
        payload: bytes,
        sha: bytes,
        content: bytes,
    ) -> None:
        b, c = self.bundle, self.bundle.contents
        try:
            if kind == MANIFEST:
                c.manifest = _manifest_dec.decode(content)
            elif kind == RECORD:
                if name in c.records:
                    raise _refused(f"duplicate entry for checkpoint {name}")
                c.records[name] = _record_dec.decode(content)
            elif kind == LOG:
                if name in c.logs:
                    raise _refused(f"duplicate entry for log {name}")
                c.logs[name] = _log_dec.decode(content)
            else:
                digest = self._new_object(name)
                if kind == CHUNKS:
                    c.lists[digest] = content
                    return
                if hashlib.sha256(content).digest() != digest:
                    raise _damaged(f"content of {name[:16]} does not match its digest")
                c.trees[digest] = content
                b.slots[digest] = _Slot(kind, codec, size, offset, len(payload), sha)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a string not UTF-8
            raise _damaged(f"entry {kind.decode()} {name} is malformed: {exc}") from None
