"""Blob encoding and placement: compression, chunking, verification on every read.

A blob is named by the SHA-256 of its *uncompressed* content, so dedup works across codecs and a
read can always be verified. Files larger than ``CHUNK_SIZE`` are stored as fixed-size chunks
plus a chunk list named by the whole file's digest: a small edit to a big file stores one chunk,
and a file of any size is streamed, never loaded whole.

Where blobs live: chunks go to the local blob directory when there is one; everything else
(file contents up to one chunk, trees, state values) is packed into the metadata database.

Garbage collection may *condemn* unreferenced blobs (see :mod:`stashpoint.stores.base`): a
condemned blob counts as absent for every existence check here, and storing it again revives it
before it is reused, so GC never deletes something a new checkpoint relies on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from enum import IntEnum
from typing import NamedTuple

import zstandard

from ..errors import IntegrityError, NotFoundError
from ..stores.base import BlobRow, MetadataStore
from .local import LocalBlobStore, PackMissing

__all__ = ["CHUNK_SIZE", "BlobCodec", "BlobWriter", "Blobs", "PackPointer", "parse_pointer"]

CHUNK_SIZE = 1 << 20
_FLUSH_BYTES = 32 << 20
_BATCH_BYTES = 1 << 20  # blobs go to the compression thread in batches of about this size
_MIN_SAVING = 0.9  # store raw unless zstd saves at least 10 %


class BlobCodec(IntEnum):
    RAW = 0
    ZSTD = 1
    CHUNKS = 2
    """Data is the concatenation of 32-byte chunk digests; content is their concatenation."""
    PACKED = 3
    """Data points into a pack file: inner codec (1 byte), offset (8), length (4), pack name."""


_POINTER = struct.Struct(">BQI")
_PACK_MIN_BYTES = 1 << 20  # smaller batches stay inline: one transaction beats an extra fsync


class PackPointer(NamedTuple):
    codec: int
    """Codec of the bytes inside the pack (RAW or ZSTD)."""
    offset: int
    length: int
    pack: str


def parse_pointer(data: bytes) -> PackPointer | None:
    """The parts of a PACKED row's data, or None if it is malformed."""
    if len(data) < _POINTER.size:
        return None
    codec, offset, length = _POINTER.unpack_from(data)
    return PackPointer(codec, offset, length, data[_POINTER.size :].decode("ascii", "replace"))


def make_pointer(codec: int, offset: int, length: int, pack: str) -> bytes:
    return _POINTER.pack(codec, offset, length) + pack.encode("ascii")


def _revive_loose(meta: MetadataStore, digest: bytes) -> None:
    if meta.condemned_among([digest]):
        meta.revive([digest])


class Blobs:
    def __init__(self, meta: MetadataStore, local: LocalBlobStore | None, level: int = 1) -> None:
        self.meta = meta
        self.local = local
        if local is not None:
            local.before_put = functools.partial(_revive_loose, meta)
        self._level = level
        self._tls = threading.local()
        self._dctx = zstandard.ZstdDecompressor()
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Release the local directory's store lock (GC waits for every open store)."""
        if self.local is not None:
            self.local.close()

    def _cctx(self) -> zstandard.ZstdCompressor:
        cctx = getattr(self._tls, "cctx", None)
        if cctx is None:  # compressors are not thread-safe: one per thread
            cctx = self._tls.cctx = zstandard.ZstdCompressor(level=self._level)
        return cctx

    def encode_later(self, items: list[tuple[bytes, bytes]]) -> Future[list[BlobRow]]:
        """Compress a batch on a worker thread while the caller goes on reading and hashing.

        zstd releases the GIL, so a first snapshot keeps both cores busy: one walking,
        reading and hashing, the other compressing (wall time ~ the larger of the two).
        Batches, not single blobs: a future per 10 KB file costs more than it saves.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        return self._pool.submit(lambda: [self.encode(d, data) for d, data in items])

    # -- encoding -------------------------------------------------------------------------
    def encode(self, digest: bytes, data: bytes) -> BlobRow:
        if len(data) >= 64:
            packed = self._cctx().compress(data)
            if len(packed) < len(data) * _MIN_SAVING:
                return BlobRow(digest, BlobCodec.ZSTD, len(data), packed)
        return BlobRow(digest, BlobCodec.RAW, len(data), data)

    def _decode(self, digest: bytes, codec: int, size: int, data: bytes) -> bytes:
        if codec == BlobCodec.PACKED:
            codec, data = self._unpack(digest, data)
        if codec == BlobCodec.RAW:
            out = data
        elif codec == BlobCodec.ZSTD:
            try:
                out = self._dctx.decompress(data, max_output_size=size)
            except zstandard.ZstdError as exc:
                raise IntegrityError(f"blob {digest.hex()} is corrupt: {exc}") from exc
        else:
            raise IntegrityError(f"blob {digest.hex()} has unknown codec {codec}")
        if len(out) != size or hashlib.sha256(out).digest() != digest:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: content does not match digest")
        return out

    def _unpack(self, digest: bytes, pointer: bytes) -> tuple[int, bytes]:
        p = parse_pointer(pointer)
        if self.local is None or p is None:
            raise IntegrityError(f"blob {digest.hex()} points into a pack that is not here")
        if p.codec not in (BlobCodec.RAW, BlobCodec.ZSTD):
            raise IntegrityError(f"blob {digest.hex()} has a bad pack pointer")
        return p.codec, self.local.read_packed(p.pack, p.offset, p.length)

    def decode_packed_entry(self, digest: bytes, codec: int, size: int, data: bytes) -> bytes:
        """Verified content of one entry read out of a pack (GC checks before repacking)."""
        return self._decode(digest, codec, size, data)

    def pack(self, rows: list[BlobRow]) -> list[BlobRow]:
        """Move a large batch of encoded rows into one pack file; returns pointer rows."""
        if self.local is None or sum(len(r.data) for r in rows) < _PACK_MIN_BYTES:
            return rows
        from .._ids import new_id

        name = new_id()
        spans = self.local.write_pack(name, [r.data for r in rows])
        return [
            BlobRow(r.digest, BlobCodec.PACKED, r.size, make_pointer(r.codec, off, n, name))
            for r, (off, n) in zip(rows, spans, strict=True)
        ]

    # -- reading --------------------------------------------------------------------------
    def _fetch(self, digest: bytes) -> tuple[int, int, bytes]:
        row = self.meta.get_blob(digest)
        if row is not None:
            return row.codec, row.size, row.data
        if self.local is not None:
            found = self.local.get(digest)
            if found is not None:
                return found
        raise NotFoundError(f"blob {digest.hex()} is missing from the store")

    def iter_content(self, digest: bytes) -> Iterator[bytes]:
        """Yield the verified content of a blob, chunk by chunk."""
        codec, size, data = self._fetch(digest)
        if codec != BlobCodec.CHUNKS:
            try:
                yield self._decode(digest, codec, size, data)
            except PackMissing:
                # A GC may have repacked it after we read the row: read the row again.
                again = self._fetch(digest)
                if again == (codec, size, data):
                    raise
                yield self._decode(digest, *again)
            return
        if len(data) % 32:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad chunk list")
        whole = hashlib.sha256()
        total = 0
        for i in range(0, len(data), 32):
            part = self.read(data[i : i + 32])
            whole.update(part)
            total += len(part)
            yield part
        if total != size or whole.digest() != digest:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: chunks do not match digest")

    def read(self, digest: bytes) -> bytes:
        return b"".join(self.iter_content(digest))

    def has(self, digests: Iterable[bytes]) -> set[bytes]:
        """Which blobs exist and may be relied on (condemned ones count as absent)."""
        self.meta.begin_write()
        wanted = set(digests)
        found = self.meta.has_blobs(wanted)
        if self.local is not None:
            loose = {d for d in wanted - found if self.local.has(d)}
            if loose:
                found.update(loose - self.meta.condemned_among(loose))
        return found

    def has_loose(self, digest: bytes) -> bool:
        """Whether a chunk file exists and may be relied on."""
        assert self.local is not None
        return self.local.has(digest) and not self.meta.condemned_among([digest])

    def writer(self) -> BlobWriter:
        self.meta.begin_write()
        return BlobWriter(self)


class BlobWriter:
    """Batches small blobs into few transactions; streams large files as chunks.

    Commit order (SPEC §5): everything written here is durable before :meth:`flush` returns,
    and the checkpoint that references it is committed only after that.
    """

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs
        self._batch: list[tuple[bytes, bytes]] = []  # not yet handed to the worker
        self._batch_bytes = 0
        self._jobs: list[Future[list[BlobRow]]] = []
        self._pending_bytes = 0
        self._seen: set[bytes] = set()
        self._chunk_lists: list[BlobRow] = []

    def add(self, data: bytes, digest: bytes | None = None) -> bytes:
        """Queue a small blob; returns its digest. Encoding waits until we know it is new."""
        if digest is None:
            digest = hashlib.sha256(data).digest()
        if digest in self._seen:
            return digest
        self._seen.add(digest)
        self._batch.append((digest, data))
        self._batch_bytes += len(data)
        self._pending_bytes += len(data)
        if self._batch_bytes >= _BATCH_BYTES:
            self._jobs.append(self.blobs.encode_later(self._batch))
            self._batch, self._batch_bytes = [], 0
        if self._pending_bytes >= _FLUSH_BYTES:
            self.flush()
        return digest

    def add_file(self, fd: int, size_hint: int) -> tuple[bytes, int]:
        """Store an open file's content; returns (digest, size). Chunked when large."""
        if size_hint <= CHUNK_SIZE:
            data = _read_all(fd, size_hint)
            if len(data) <= CHUNK_SIZE:
                return self.add(data), len(data)
            first = [data]
        else:
            first = []
        whole = hashlib.sha256()
        chunks: list[bytes] = []
        total = 0

        def pieces() -> Iterator[bytes]:
            for piece in first:
                for i in range(0, len(piece), CHUNK_SIZE):
                    yield piece[i : i + CHUNK_SIZE]
            while True:
                piece = _read_all(fd, CHUNK_SIZE)
                if not piece:
                    return
                yield piece

        for piece in pieces():
            whole.update(piece)
            total += len(piece)
            chunks.append(self._put_chunk(piece))
        digest = whole.digest()
        if digest not in self._seen:
            self._seen.add(digest)
            self._chunk_lists.append(BlobRow(digest, BlobCodec.CHUNKS, total, b"".join(chunks)))
        return digest, total

    def _put_chunk(self, piece: bytes) -> bytes:
        digest = hashlib.sha256(piece).digest()
        local = self.blobs.local
        if local is None:  # no blob directory (memory, PostgreSQL): chunks go with the rest
            return self.add(piece, digest)
        if digest in self._seen:
            return digest
        self._seen.add(digest)
        if not self.blobs.has_loose(digest):
            row = self.blobs.encode(digest, piece)
            local.put(digest, row.codec, row.size, row.data)  # revives it if condemned
        return digest

    def _encode_new(self) -> list[BlobRow]:
        """The queued blobs the store does not have yet, encoded (one existence query)."""
        rows = [r for job in self._jobs for r in job.result()]
        rows += [self.blobs.encode(d, data) for d, data in self._batch]
        lists = self._chunk_lists
        self._jobs, self._batch, self._chunk_lists = [], [], []
        self._batch_bytes = self._pending_bytes = 0
        if not rows and not lists:
            return []
        have = self.blobs.meta.has_blobs([r.digest for r in rows] + [r.digest for r in lists])
        rows = [r for r in rows if r.digest not in have]
        rows = self.blobs.pack(rows)
        rows += [r for r in lists if r.digest not in have]
        return rows

    def flush(self) -> None:
        """Write queued blobs now, in their own transaction (large snapshots stream out)."""
        rows = self._encode_new()
        if rows:
            self.blobs.meta.put_blobs(rows)

    def take_pending(self) -> list[BlobRow]:
        """Hand the queued rows to a checkpoint commit instead of writing them separately."""
        return self._encode_new()


def _read_all(fd: int, n: int) -> bytes:
    parts = []
    while n > 0:
        part = os.read(fd, min(n, CHUNK_SIZE))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)
