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

Encryption (:mod:`stashpoint.crypto`): with a cipher, each RAW or ZSTD frame is compressed, then
sealed with AES-GCM bound to the blob's digest, and its codec gets the ``SEALED`` bit; this
happens here, below inline rows, pack files and loose chunk files alike, so every backend and
GC's repacking carry ciphertext without knowing it. Names stay plaintext digests (dedup keeps
working); chunk lists and pack pointers stay plaintext, as they only hold digests and offsets.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol

import zstandard

from ..errors import IntegrityError, NotFoundError, PackMissing, UpgradeRequired
from ..stores.base import BlobRow, MetadataStore
from .backend import BlobBackend

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from ..crypto import Cipher

__all__ = ["CHUNK_SIZE", "BlobCodec", "BlobWriter", "Blobs", "PackPointer", "parse_pointer"]

CHUNK_SIZE = 1 << 20
_FLUSH_BYTES = 32 << 20
_BATCH_BYTES = 1 << 20  # blobs go to the compression thread in batches of about this size
_MIN_SAVING = 0.9  # store raw unless zstd saves at least 10 %
_SAMPLED_FROM = 128 << 10  # blobs this large are sampled before zstd sees them whole
_SAMPLE = 8 << 10  # bytes per sample slice
_SAMPLES = 8  # slices, spread over the blob
_SAMPLE_SAVING = 0.98  # a sample that saves less than 2 %: the blob is stored raw
_IN_FLIGHT = 8  # chunks queued for writer threads (artifacts), each at most a few MB
_IO_THREADS = 3  # threads writing packs and chunk files (mostly waiting for fsync)
_PACKS_IN_FLIGHT = 2  # 32 MiB packs being compressed and written while the scan goes on


class BlobCodec(IntEnum):
    RAW = 0
    ZSTD = 1
    CHUNKS = 2
    """Data is the concatenation of 32-byte chunk digests; content is their concatenation."""
    PACKED = 3
    """Data points into a pack file: inner codec (1 byte), offset (8), length (4), pack name."""


SEALED = 0x10
"""Codec bit: the RAW or ZSTD frame is AES-GCM ciphertext (see :mod:`stashpoint.crypto`)."""


_POINTER = struct.Struct(">BQI")
_PACK_MIN_BYTES = 1 << 20
_PROBE_MIN_ROWS = 64  # smaller batches skip the existence query (see BlobWriter._encode_new)
_PROBE_MIN_BYTES = 64 << 10  # smaller batches stay inline: one transaction beats an extra fsync


class PackPointer(NamedTuple):
    codec: int
    """Codec of the bytes inside the pack (RAW or ZSTD)."""
    offset: int
    length: int
    pack: str


class _Frame(Protocol):
    def tobytes(self) -> bytes: ...


class _Frames(Protocol):
    """zstd frames of a batch: python-zstandard's segments, or memoryviews."""

    def __len__(self) -> int: ...
    def __getitem__(self, i: int, /) -> _Frame: ...


_Compressed = tuple[_Frames, frozenset[int]]
"""A compressed batch: the frames, and the positions (among blobs of 64 bytes or more) of
those left uncompressed."""


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
    def __init__(
        self,
        meta: MetadataStore,
        local: BlobBackend | None,
        level: int = 1,
        cipher: Cipher | None = None,
    ) -> None:
        self.meta = meta
        self.cipher = cipher
        self.local = local
        if local is not None:
            local.before_put = functools.partial(_revive_loose, meta)
        self._level = level
        self._tls = threading.local()
        self._dctx = zstandard.ZstdDecompressor()
        self._pool: ThreadPoolExecutor | None = None
        self._io_pool: ThreadPoolExecutor | None = None
        self._hash_pool: ThreadPoolExecutor | None = None
        self.read_only: str | None = None
        """Why no blob may be written (a store in an older format), or None: checked before
        a snapshot writes its first chunk or pack, so a refused one leaves no file behind."""

    def close(self) -> None:
        """Release the local directory's store lock (GC waits for every open store)."""
        if self.local is not None:
            self.local.close()

    def _cctx(self) -> zstandard.ZstdCompressor:
        cctx = getattr(self._tls, "cctx", None)
        if cctx is None:  # compressors are not thread-safe: one per thread
            cctx = self._tls.cctx = zstandard.ZstdCompressor(level=self._level)
        return cctx

    def encode_later(self, items: list[tuple[bytes, bytes]]) -> Future[_Compressed]:
        """Compress a batch on a worker thread while the caller goes on walking, reading and
        hashing; :meth:`rows_of` turns the result into rows.

        zstd releases the GIL, so a first snapshot keeps both cores busy: one walking,
        reading and hashing, the other compressing (wall time ~ the larger of the two). The
        whole batch is one call into zstd (python-zstandard's ``multi_compress_to_buffer``;
        the same frames as ``compress``), so the worker takes the GIL twice per batch, not
        twice per blob: the scanning thread, which gives it up at every syscall, would
        otherwise wait for the worker to hand it back ten thousand times per 10k files.
        Batches, not single blobs: a future per 10 KB file costs more than it saves.
        """
        return self._workers().submit(self._compress_many, [d for _k, d in items if len(d) >= 64])

    def _compress_many(self, datas: list[bytes]) -> _Compressed:
        """The zstd frames of ``datas`` (on a worker thread: one GIL release for all), but
        for those :meth:`incompressible` judges so: their positions come back instead."""
        raw: frozenset[int] = frozenset()
        if any(len(d) >= _SAMPLED_FROM for d in datas):
            raw = frozenset(
                i for i, d in enumerate(datas) if len(d) >= _SAMPLED_FROM and self.incompressible(d)
            )
            if raw:
                datas = [d for i, d in enumerate(datas) if i not in raw]
        if not datas:
            return (), raw
        cctx = self._cctx()
        many = getattr(cctx, "multi_compress_to_buffer", None)
        if many is None:  # (only the C backend has it)
            return [memoryview(cctx.compress(d)) for d in datas], raw
        frames: _Frames = many(datas, threads=1)
        return frames, raw

    def rows_of(self, items: list[tuple[bytes, bytes]], compressed: _Compressed) -> list[BlobRow]:
        """The rows of a batch :meth:`encode_later` compressed: each as :meth:`encode` makes
        it (RAW unless zstd saves 10 %, sealed in an encrypted store)."""
        frames, skip = compressed
        out = []
        at = i = 0
        raw, zstd, cipher = BlobCodec.RAW, BlobCodec.ZSTD, self.cipher
        for digest, data in items:
            size = len(data)
            codec: int = raw
            frame = data
            if size >= 64:
                if not skip or i not in skip:
                    packed = frames[at].tobytes()
                    at += 1
                    if len(packed) < size * _MIN_SAVING:
                        codec, frame = zstd, packed
                i += 1
            if cipher is not None:
                codec, frame = self.seal_frame(digest, codec, frame)
            out.append(BlobRow(digest, codec, size, frame))
        return out

    def _workers(self) -> ThreadPoolExecutor:
        """Threads that compress (CPU-bound: one per core, at most four)."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # ~5 ms: only when work comes

            self._pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)))
        return self._pool

    def _hasher(self) -> ThreadPoolExecutor:
        """The thread that hashes large files' pieces, in the order they are read: the file's
        digest takes them one after the other (SHA-256 releases the GIL for each 1 MiB)."""
        if self._hash_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._hash_pool = ThreadPoolExecutor(max_workers=1)
        return self._hash_pool

    def _writers(self) -> ThreadPoolExecutor:
        """Threads that write and fsync packs and chunk files: apart from the compressing
        ones, which would otherwise sit idle behind an fsync while the scan queues batches."""
        if self._io_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._io_pool = ThreadPoolExecutor(max_workers=_IO_THREADS)
        return self._io_pool

    # -- encoding -------------------------------------------------------------------------
    def incompressible(self, data: bytes) -> bool:
        """Whether slices spread over ``data`` (a large blob) show zstd would not save the 10 %
        it takes to store a blob compressed: media, archives and random bytes (a workspace's
        binaries) are then stored raw at the cost of compressing 64 KiB, not all of it (at
        level 1, zstd spends about as long per byte on random bytes as on text). A blob
        compressible only where no slice looked is stored raw too: larger, never wrong."""
        n = len(data)
        step = (n - _SAMPLE) // (_SAMPLES - 1)
        sample = b"".join(data[i * step : i * step + _SAMPLE] for i in range(_SAMPLES))
        return len(self._cctx().compress(sample)) >= len(sample) * _SAMPLE_SAVING

    def encode(self, digest: bytes, data: bytes) -> BlobRow:
        codec: int = BlobCodec.RAW
        out = data
        if len(data) >= 64 and not (len(data) >= _SAMPLED_FROM and self.incompressible(data)):
            packed = self._cctx().compress(data)
            if len(packed) < len(data) * _MIN_SAVING:
                codec, out = BlobCodec.ZSTD, packed
        codec, out = self.seal_frame(digest, codec, out)
        return BlobRow(digest, codec, len(data), out)

    def seal_frame(self, digest: bytes, codec: int, frame: bytes) -> tuple[int, bytes]:
        """Encrypt a RAW or ZSTD frame when the store is encrypted (AAD: the digest)."""
        if self.cipher is None:
            return codec, frame
        return codec | SEALED, self.cipher.seal(frame, b"blob\0" + digest)

    def open_frame(self, digest: bytes, codec: int, frame: bytes) -> tuple[int, bytes]:
        """The RAW or ZSTD frame inside a stored one; a plaintext frame in an encrypted store,
        or a frame sealed for another digest, is an IntegrityError."""
        if self.cipher is None:
            if codec & SEALED:
                raise IntegrityError(
                    f"blob {digest.hex()} is encrypted; open the store with its key"
                )
            return codec, frame
        if not codec & SEALED:
            raise IntegrityError(
                f"blob {digest.hex()} is stored unencrypted in an encrypted store (refused)"
            )
        return codec & ~SEALED, self.cipher.open(frame, b"blob\0" + digest, f"blob {digest.hex()}")

    def _decode(self, digest: bytes, codec: int, size: int, data: bytes) -> bytes:
        if codec == BlobCodec.PACKED:
            codec, data = self._unpack(digest, data)
        codec, data = self.open_frame(digest, codec, data)
        return self.inflate(digest, codec, size, data)

    def inflate(self, digest: bytes, codec: int, size: int, data: bytes) -> bytes:
        """Verified content of a plaintext RAW or ZSTD frame (see :meth:`open_frame`)."""
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
        if p.codec & ~SEALED not in (BlobCodec.RAW, BlobCodec.ZSTD):
            raise IntegrityError(f"blob {digest.hex()} has a bad pack pointer")
        return p.codec, self.local.read_packed(p.pack, p.offset, p.length)

    def decode_packed_entry(self, digest: bytes, codec: int, size: int, data: bytes) -> bytes:
        """Verified content of one entry read out of a pack (GC checks before repacking)."""
        return self._decode(digest, codec, size, data)

    def pack(self, rows: list[BlobRow], min_bytes: int = _PACK_MIN_BYTES) -> list[BlobRow]:
        """Move a large batch of encoded rows into one pack file; returns pointer rows (or
        ``rows`` as they are, when they are fewer than ``min_bytes``)."""
        if self.local is None or not rows:
            return rows
        datas = [r[3] for r in rows]  # (r.data: a namedtuple's field by name is slower)
        if min_bytes and sum(map(len, datas)) < min_bytes:
            return rows
        from .._ids import new_id

        name = new_id()
        spans = self.local.write_pack(name, datas)
        packed, tail, pointer = BlobCodec.PACKED, name.encode("ascii"), _POINTER.pack
        return [
            BlobRow(digest, packed, size, pointer(codec, off, n) + tail)
            for (digest, codec, size, _data), (off, n) in zip(rows, spans, strict=True)
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
        prev, part = b"", b""
        for i in range(0, len(data), 32):
            chunk = data[i : i + 32]
            if chunk != prev:  # a run of one chunk (a sparse file's zeros) is read once
                part, prev = self.read(chunk), chunk
            whole.update(part)
            total += len(part)
            yield part
        if total != size or whole.digest() != digest:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: chunks do not match digest")

    def read(self, digest: bytes) -> bytes:
        return b"".join(self.iter_content(digest))

    def read_many(self, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        """Verified contents of many blobs, the inline ones fetched in one query (what a
        reader of many small state values wants); others are read one by one."""
        rows = self.meta.get_blobs(digests)
        out: dict[bytes, bytes] = {}
        self._read_packs(rows, out)
        for d in digests:
            if d in out:
                continue
            row = rows.get(d)
            if row is not None and row.codec != BlobCodec.CHUNKS:
                try:  # inline, sealed or packed: decoded from the row already fetched
                    out[d] = self._decode(d, row.codec, row.size, row.data)
                    continue
                except PackMissing:  # repacked by a GC since: read its row again
                    pass
            out[d] = self.read(d)
        return out

    def _read_packs(self, rows: Mapping[bytes, BlobRow], out: dict[bytes, bytes]) -> None:
        """Decode the packed rows among ``rows`` into ``out``, one open per pack file (where
        the blob directory can); what cannot be read this way is left to the caller."""
        many = getattr(self.local, "read_packed_many", None)
        if many is None:
            return
        by_pack: dict[str, list[tuple[BlobRow, PackPointer]]] = {}
        for row in rows.values():
            if row.codec == BlobCodec.PACKED:
                p = parse_pointer(row.data)
                if p is not None and p.codec & ~SEALED in (BlobCodec.RAW, BlobCodec.ZSTD):
                    by_pack.setdefault(p.pack, []).append((row, p))
        for name, items in by_pack.items():
            try:
                datas = many(name, [(p.offset, p.length) for _r, p in items])
            except (PackMissing, IntegrityError):
                continue  # one by one, with the usual re-read and errors
            for (row, p), data in zip(items, datas, strict=True):
                codec, frame = self.open_frame(row.digest, p.codec, data)
                out[row.digest] = self.inflate(row.digest, codec, row.size, frame)

    def has(self, digests: Iterable[bytes]) -> set[bytes]:
        """Which blobs exist and may be relied on (condemned ones count as absent)."""
        self.meta.writers.begin()
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
        if self.read_only is not None:
            raise UpgradeRequired(self.read_only)
        self.meta.writers.begin()
        return BlobWriter(self)


class BlobWriter:
    """Batches small blobs into few transactions; streams large files as chunks.

    Commit order: everything written here is durable before :meth:`flush` returns,
    and the checkpoint that references it is committed only after that.
    """

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs
        self._batch: list[tuple[bytes, bytes]] = []  # not yet handed to the worker
        self._batch_bytes = 0
        self._jobs: collections.deque[tuple[list[tuple[bytes, bytes]], Future[_Compressed]]] = (
            collections.deque()
        )
        """Batches being compressed by a worker thread (see Blobs.encode_later)."""
        self._encoded: list[BlobRow] = []
        """Rows of batches compressed already (their contents are let go at once)."""
        self._pending_bytes = 0
        self._seen: set[bytes] = set()
        self._chunk_lists: list[BlobRow] = []
        self._packing: list[Future[list[BlobRow]]] = []
        """Packs being written by a writer thread: their rows are sent once they are durable."""
        self._chunk_jobs: collections.deque[Future[None]] = collections.deque()
        """Chunk files of large files being written by writer threads."""

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
            jobs = self._jobs
            jobs.append((self._batch, self.blobs.encode_later(self._batch)))
            self._batch, self._batch_bytes = [], 0
            while jobs[0][1].done():  # (not a wait: the scan goes on)
                items, job = jobs.popleft()
                self._encoded += self.blobs.rows_of(items, job.result())
                if not jobs:
                    break
        if self._pending_bytes >= _FLUSH_BYTES:
            self._stream()
        return digest

    def add_file(self, fd: int, size_hint: int, known: bytes | None = None) -> tuple[bytes, int]:
        """Store an open file's content; returns (digest, size). Chunked when large.

        ``known``: the digest the stat cache had for this file, whose blob is committed (a
        "racy" file re-read only because its stat could hide an edit): when the content
        still hashes to it, nothing is queued, compressed or sent again."""
        if size_hint <= CHUNK_SIZE:
            data = os.read(fd, size_hint) if size_hint else b""  # one read, usually
            if 0 < len(data) < size_hint:  # (a short read: read on, up to EOF)
                data += _read_all(fd, size_hint - len(data))
            if len(data) <= CHUNK_SIZE:
                if known is not None:
                    digest = hashlib.sha256(data).digest()
                    if digest == known:
                        return digest, len(data)
                    return self.add(data, digest), len(data)
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

        # Both digests of each piece (the file's, the chunk's) are computed by one hashing
        # thread, in order, while this one reads on; at most _IN_FLIGHT pieces wait.
        hashing: collections.deque[tuple[bytes, Future[bytes]]] = collections.deque()
        hasher = self.blobs._hasher()
        for piece in pieces():
            total += len(piece)
            hashing.append((piece, hasher.submit(_hash_piece, whole, piece)))
            if len(hashing) > _IN_FLIGHT:
                piece, job = hashing.popleft()
                chunks.append(self._put_chunk(piece, job.result()))
        while hashing:
            piece, job = hashing.popleft()
            chunks.append(self._put_chunk(piece, job.result()))
        digest = whole.digest()  # (every update is done: each job was waited for)
        if digest not in self._seen:
            self._seen.add(digest)
            self._chunk_lists.append(BlobRow(digest, BlobCodec.CHUNKS, total, b"".join(chunks)))
        return digest, total

    def add_chunks(self, pieces: Iterable[bytes | memoryview]) -> tuple[bytes, int, int]:
        """Store content given as pieces (content-defined chunks of an artifact); returns
        (digest, size, number of pieces). Each piece is a chunk; the whole is a chunk list
        named by the content's digest, like a large file's, so reads, GC, verify and bundles
        need nothing new. A piece may be a view into a reused buffer. One piece is stored as
        a plain blob (a chunk list naming only itself would read itself forever)."""
        whole = hashlib.sha256()
        chunks: list[bytes] = []
        total = 0
        prev, prev_digest = b"", b""
        local = self.blobs.local
        # Chunk files are compressed, written and fsynced by threads while this one cuts and
        # hashes (zstd, hashing and fsync release the GIL): two fsyncs per chunk file would
        # otherwise dominate. At most _IN_FLIGHT chunks wait, so memory stays bounded; all
        # are durable before this returns, so the store's commit order holds.
        from concurrent.futures import ThreadPoolExecutor

        pending: collections.deque[Future[None]] = collections.deque()
        with ThreadPoolExecutor(max_workers=3) as pool:
            for view in pieces:
                piece = bytes(view)  # compared and stored as bytes (memoryview == is slow)
                whole.update(piece)
                total += len(piece)
                if piece == prev:  # a run of one chunk (a sparse file's zeros) is hashed once
                    chunks.append(prev_digest)
                    continue
                digest = hashlib.sha256(piece).digest()
                chunks.append(digest)
                prev, prev_digest = piece, digest
                if digest in self._seen:
                    continue
                self._seen.add(digest)
                if local is not None:
                    if not self.blobs.has_loose(digest):
                        _revive_loose(self.blobs.meta, digest)  # here: one thread uses meta
                        pending.append(pool.submit(self._write_chunk, digest, piece))
                        while len(pending) > _IN_FLIGHT:
                            pending.popleft().result()
                elif not self.blobs.meta.has_blobs([digest]):
                    self._seen.discard(digest)
                    self.add(piece, digest)
            for job in pending:
                job.result()
        digest = whole.digest()
        if not chunks:
            return self.add(b""), 0, 0
        if len(chunks) > 1 and digest not in self._seen:
            self._seen.add(digest)
            self._chunk_lists.append(BlobRow(digest, BlobCodec.CHUNKS, total, b"".join(chunks)))
        return digest, total, len(chunks)

    def _write_chunk(self, digest: bytes, piece: bytes) -> None:
        assert self.blobs.local is not None
        row = self.blobs.encode(digest, piece)
        self.blobs.local.put(digest, row.codec, row.size, row.data, revive=False)

    def _put_chunk(self, piece: bytes, digest: bytes) -> bytes:
        local = self.blobs.local
        if local is None:  # no blob directory (memory, PostgreSQL): chunks go with the rest
            return self.add(piece, digest)
        if digest in self._seen:
            return digest
        self._seen.add(digest)
        if not self.blobs.has_loose(digest):
            # Compressed, written and fsynced by a worker thread while this one reads on (a
            # snapshot's large files cost two fsyncs a chunk); every one is durable before
            # the rows naming it are handed to a commit (see _packed).
            _revive_loose(self.blobs.meta, digest)  # here: one thread uses meta
            jobs = self._chunk_jobs
            jobs.append(self.blobs._writers().submit(self._write_chunk, digest, piece))
            while len(jobs) > _IN_FLIGHT:
                jobs.popleft().result()
        return digest

    def _encode_new(self) -> list[BlobRow]:
        """The queued blobs the store does not have yet, encoded (one existence query).

        Batches already handed to the compression thread come back encoded; the last,
        partial batch is compressed only after the query, and only what is new."""
        rows_of = self.blobs.rows_of
        encoded = self._encoded
        encoded += [r for items, job in self._jobs for r in rows_of(items, job.result())]
        raw, lists = self._batch, self._chunk_lists
        self._batch, self._chunk_lists, self._encoded = [], [], []
        self._jobs.clear()
        self._batch_bytes = self._pending_bytes = 0
        count = len(encoded) + len(raw) + len(lists)
        if not count:
            return []
        size = (
            sum(len(r.data) for r in encoded)
            + sum(len(data) for _d, data in raw)
            + sum(len(r.data) for r in lists)
        )
        if count <= _PROBE_MIN_ROWS and size <= _PROBE_MIN_BYTES:
            # A few small rows: sending them again costs less than asking which exist (a
            # round trip to a remote store); the commit inserts them with ON CONFLICT DO
            # NOTHING and revives condemned ones either way.
            return [*encoded, *(self.blobs.encode(d, data) for d, data in raw), *lists]
        have = self.blobs.meta.has_blobs(
            [r.digest for r in encoded] + [d for d, _ in raw] + [r.digest for r in lists]
        )
        rows = [r for r in encoded if r.digest not in have]
        rows += [self.blobs.encode(d, data) for d, data in raw if d not in have]
        rows = self.blobs.pack(rows)
        rows += [r for r in lists if r.digest not in have]
        return rows

    def _packed(self) -> list[BlobRow]:
        """The rows of every pack handed to a worker, once each is durable (blobs before the
        rows naming them); a failed write raises here."""
        while self._chunk_jobs:  # chunk files first: durable before anything names them
            self._chunk_jobs.popleft().result()
        jobs, self._packing = self._packing, []
        return [r for job in jobs for r in job.result()]

    def _stream(self) -> None:
        """Send what is queued while a large snapshot goes on, so that reading, compressing
        and writing overlap.

        With a blob directory, a writer thread waits for the batches' compression, then
        writes and fsyncs their pack; the scan does not wait for any of it (unless
        ``_PACKS_IN_FLIGHT`` packs are still being written, which bounds the memory). A
        pack's rows are pointers, a few dozen bytes each: they wait for the commit, which
        records them with the checkpoint in one transaction (an fsync per 32 MiB on the
        scanning thread, otherwise). Without one, the rows hold the contents: they are
        recorded now."""
        if self.blobs.local is None:
            rows = self._packed() + self._encode_new()
            if rows:
                self.blobs.meta.put_blobs(rows)
            return
        if self._batch:
            self._jobs.append((self._batch, self.blobs.encode_later(self._batch)))
        jobs, encoded = list(self._jobs), self._encoded
        self._batch, self._encoded = [], []
        self._jobs.clear()
        self._batch_bytes = self._pending_bytes = 0
        have = self.blobs.meta.has_blobs(
            [r.digest for r in encoded] + [d for items, _job in jobs for d, _ in items]
        )
        packing = self._packing
        packing.append(self.blobs._writers().submit(self._pack_stream, encoded, jobs, have))
        while sum(not job.done() for job in packing) > _PACKS_IN_FLIGHT:
            next(job for job in packing if not job.done()).result()

    def _pack_stream(
        self,
        encoded: list[BlobRow],
        jobs: list[tuple[list[tuple[bytes, bytes]], Future[_Compressed]]],
        have: set[bytes],
    ) -> list[BlobRow]:
        """(On a writer thread.) The pointer rows of a pack of the blobs of ``encoded`` and
        ``jobs`` the store does not ``have``, once the pack is durable (a pack however
        small: rows that kept their contents would wait for the commit in memory)."""
        rows_of = self.blobs.rows_of
        rows = [r for r in encoded if r[0] not in have] if have else encoded
        for items, job in jobs:
            got = rows_of(items, job.result())
            rows += [r for r in got if r[0] not in have] if have else got
        return self.blobs.pack(rows, min_bytes=0)

    def flush(self) -> None:
        """Write queued blobs now, in their own transaction: all of them are recorded when
        this returns."""
        rows = self._packed() + self._encode_new()
        if rows:
            self.blobs.meta.put_blobs(rows)

    def take_pending(self) -> list[BlobRow]:
        """Hand the queued rows to a checkpoint commit instead of writing them separately."""
        return self._packed() + self._encode_new()


def _hash_piece(whole: hashlib._Hash, piece: bytes) -> bytes:
    """(On the hashing thread.) Add a large file's next piece to its digest; the piece's."""
    whole.update(piece)
    return hashlib.sha256(piece).digest()


def _read_all(fd: int, n: int) -> bytes:
    parts = []
    while n > 0:
        part = os.read(fd, min(n, CHUNK_SIZE))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)
