"""The bundle file format: the framed container (header, entries, trailer), the records
inside it, and reading and writing entries without judging them.

Layout (integers big-endian)::

    header   MAGIC (8 bytes) + format version (u32)
    entry*   kind (1 byte), codec (u8), name length (u16), size (u64, decompressed),
             payload length (u64), SHA-256 of the payload (32) | name (ASCII) | payload
    trailer  an entry of kind ``Z`` whose payload is the bundle digest (SHA-256 over the header
             and every entry header and name before it, which carry the payload digests), the
             number of entries (u64) and their decompressed bytes (u64)

Entry kinds: ``M`` manifest (JSON, first), ``C`` a checkpoint record (its stored canonical body
and chain digest), ``L`` a log's own entries and its fork point (conversations and journals
alike), ``T`` a tree object, ``B`` a blob (file content, a 1 MiB chunk, a state value), ``K`` a
chunk list, named by the whole file's digest. Payloads are zstd frames that must declare their
content size (codec 1) or raw bytes (codec 0). Blob frames are copied as the store holds them,
so neither export nor import compresses file contents again.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from collections.abc import Callable, Iterator
from typing import IO, BinaryIO, Literal, cast

import msgspec
import zstandard

from ..errors import IntegrityError, UsageError
from ..model import TreeEntry

MAGIC = b"\x89SPB\r\n\x1a\n"
"""PNG-style: a high byte and CR LF / EOF bytes, so text-mode mangling is detected."""
VERSION = 1
FORMAT = "stashpoint-bundle"

MANIFEST, RECORD, LOG, TREE, BLOB, CHUNKS, END = b"M", b"C", b"L", b"T", b"B", b"K", b"Z"
RAW, ZSTD = 0, 1

_HEADER = struct.Struct(">8sI")
_ENTRY = struct.Struct(">cBHQQ32s")
_TRAILER = struct.Struct(">32sQQ")
_HEX = re.compile(r"[0-9a-f]{64}")
_IDENT = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.:-]{0,127}")


_DCTX = zstandard.ZstdDecompressor()


def _damaged(msg: str) -> IntegrityError:
    return IntegrityError(f"bundle is damaged or forged: {msg}")


def _refused(msg: str) -> UsageError:
    return UsageError(f"refusing bundle: {msg}")


# -- records inside the file -------------------------------------------------------------------
class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    version: int
    session: str
    scope: Literal["session", "checkpoint"]
    checkpoints: list[str]
    """What was exported: every id of the session, or the one checkpoint."""
    heads: dict[str, str]
    """Branch -> head id; a single-checkpoint bundle names the checkpoint's branch."""
    labels: dict[str, str] = {}
    pruned: dict[str, str] = {}
    """Id -> when, for records pruned by retention: they travel as records only (the chain
    still verifies; their contents may be gone) and are marked pruned where imported."""
    keyed: bool = False
    """Records are sealed with an HMAC key (they verify only in a store with the same key)."""
    source_store: str = ""
    created_at: str = ""
    stashpoint: str = ""


class RecordEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    digest: str
    body: bytes
    """The record exactly as the source store holds it (canonical JSON)."""


class LogEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """A log's own entries: they start at ``parent_len`` (forks) or 0 (new logs)."""

    session: str
    parent: str | None
    parent_len: int
    rows: list[tuple[bytes, bytes]]
    """(running hash, encoded entry) pairs."""

    @property
    def start(self) -> int:
        return self.parent_len if self.parent is not None else 0


_manifest_dec = msgspec.json.Decoder(Manifest)
_record_dec = msgspec.msgpack.Decoder(RecordEntry)
_log_dec = msgspec.msgpack.Decoder(LogEntry)
_tree_dec = msgspec.msgpack.Decoder(list[TreeEntry])
_msgpack = msgspec.msgpack.Encoder()


# -- the container, low level ------------------------------------------------------------------
class RawEntry(msgspec.Struct, frozen=True):
    kind: bytes
    name: str
    codec: int
    size: int
    payload: bytes


class BundleWriter:
    """Frames entries into a file and writes the trailer; it checks nothing (tests use it to
    craft hostile bundles; :func:`export_bundle` checks what it writes)."""

    def __init__(self, f: BinaryIO, *, level: int = 3) -> None:
        self._f = f
        self._hash = hashlib.sha256()
        self._cctx = zstandard.ZstdCompressor(level=level)
        self.entries = 0
        self.bytes = 0
        self.size = 0
        self._put(_HEADER.pack(MAGIC, VERSION))

    def _put(self, data: bytes, *, hashed: bool = True) -> None:
        if hashed:
            self._hash.update(data)
        self._f.write(data)
        self.size += len(data)

    def add_payload(
        self, kind: bytes, name: str, codec: int, size: int, payload: bytes, *, sha: bytes = b""
    ) -> None:
        """An entry whose payload is ready (``codec`` RAW or ZSTD; ``size`` decompressed)."""
        nb = name.encode("ascii")
        sha = sha or hashlib.sha256(payload).digest()
        self._put(_ENTRY.pack(kind, codec, len(nb), size, len(payload), sha) + nb)
        self._put(payload, hashed=False)  # committed to through its digest in the header
        self.entries += 1
        self.bytes += size

    def add(self, kind: bytes, name: str, content: bytes) -> None:
        """An entry from its content, zstd-compressed unless that saves under 10 %."""
        if len(content) >= 64:
            packed = self._cctx.compress(content)
            if len(packed) < len(content) * 0.9:
                self.add_payload(kind, name, ZSTD, len(content), packed)
                return
        self.add_payload(kind, name, RAW, len(content), content)

    def finish(self) -> bytes:
        """Write the trailer; returns the bundle digest."""
        digest = self._hash.digest()
        payload = _TRAILER.pack(digest, self.entries, self.bytes)
        header = _ENTRY.pack(
            END, RAW, 0, len(payload), len(payload), hashlib.sha256(payload).digest()
        )
        self._put(header + payload, hashed=False)
        return digest


def iter_entries(path: str | os.PathLike[str]) -> Iterator[RawEntry]:
    """Every entry of a bundle file as it is, trailer excluded. Checks nothing: for tools and
    tests; :func:`read_bundle` is the reader that validates."""
    with open(path, "rb") as f:
        f.read(_HEADER.size)
        while True:
            header = f.read(_ENTRY.size)
            if len(header) < _ENTRY.size:
                return
            kind, codec, nlen, size, plen, _sha = _ENTRY.unpack(header)
            name = f.read(nlen).decode("ascii", "replace")
            payload = f.read(plen)
            if kind == END:
                return
            yield RawEntry(kind, name, codec, size, payload)


def manifest_keyed(path: str | os.PathLike[str]) -> bool | None:
    """Whether a bundle's manifest says its records are HMAC-sealed (None: cannot tell). A
    peek, bounded and unchecked, to pick the key to check it with; :func:`read_bundle` checks."""
    try:
        with open(path, "rb") as f:
            f.read(_HEADER.size)
            kind, codec, nlen, size, plen, _sha = _ENTRY.unpack(f.read(_ENTRY.size))
            if kind != MANIFEST or plen > 1 << 20 or size > 1 << 20:
                return None
            f.read(nlen)
            return _manifest_dec.decode(decode_payload(codec, size, f.read(plen))).keyed
    except (
        OSError,
        struct.error,
        msgspec.DecodeError,
        UnicodeDecodeError,
        IntegrityError,
        UsageError,
    ):
        return None


def decode_payload(codec: int, size: int, payload: bytes, what: str = "entry") -> bytes:
    """Content of a payload, bounded by its declared size, or IntegrityError.

    A zstd frame must carry its content size and it must equal ``size`` (the frame cannot then
    decompress to more), be the only frame, and end the payload.
    """
    if codec == RAW:
        if len(payload) != size:
            raise _damaged(f"{what} declares {size} bytes but holds {len(payload)}")
        return payload
    if codec != ZSTD:
        raise _refused(f"{what} uses unknown codec {codec}")
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise _damaged(f"{what} is not a zstd frame: {exc}") from None
    if declared != size:
        raise _damaged(f"{what} declares {size} bytes but its frame says {declared}")
    obj = _DCTX.decompressobj()
    try:
        out = obj.decompress(payload)
    except zstandard.ZstdError as exc:
        raise _damaged(f"{what} does not decompress: {exc}") from None
    if not obj.eof or obj.unused_data or len(out) != size:
        raise _damaged(f"{what} is not exactly one frame of {size} bytes")
    return out


_PIECE = 1 << 20
"""Decompressed content is produced, hashed and dropped in pieces of at most this size."""


def _frame_length(read_at: Callable[[int, int], bytes], plen: int, what: str) -> int:
    """Bytes of the zstd frame a payload starts with, from its header and block headers
    (each says how long its block is), without decompressing: a payload must be exactly one
    frame, and a streaming decompressor stops at the frame's end without saying where."""
    head = read_at(0, min(plen, 18))
    try:
        pos = zstandard.frame_header_size(head)
        checksum = zstandard.get_frame_parameters(head).has_checksum
    except zstandard.ZstdError as exc:
        raise _damaged(f"{what} is not a zstd frame: {exc}") from None
    while True:
        block = read_at(pos, 3)
        if len(block) < 3:
            raise _damaged(f"{what} is not exactly one frame (it is cut short)")
        value = int.from_bytes(block, "little")
        kind = (value >> 1) & 3
        if kind == 3:
            raise _damaged(f"{what} is not a valid zstd frame (reserved block type)")
        pos += 3 + (1 if kind == 1 else value >> 3)  # an RLE block stores its byte once
        if value & 1:
            return pos + (4 if checksum else 0)


class _PayloadReader:
    """A payload read from its place in the bundle in pieces, for the streaming decompressor."""

    def __init__(self, read_at: Callable[[int, int], bytes], length: int) -> None:
        self._read_at = read_at
        self._length = length
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        n = self._length - self._pos if n < 0 else min(n, self._length - self._pos)
        data = self._read_at(self._pos, n) if n > 0 else b""
        self._pos += len(data)
        return data


def iter_content(
    read_at: Callable[[int, int], bytes], plen: int, codec: int, size: int, what: str
) -> Iterator[bytes]:
    """The content of a payload (``read_at(offset, n)`` reads it) in pieces of at most 1 MiB,
    bounded by its declared ``size`` whatever the payload says; IntegrityError if it is not
    exactly ``size`` bytes (one zstd frame declaring that size, or raw bytes).

    Why pieces: :func:`decode_payload` holds the whole content, which is what a declared
    size of 1 GiB in a payload of 32 KiB would cost; here memory stays at one piece."""
    if codec == RAW:
        if plen != size:
            raise _damaged(f"{what} declares {size} bytes but holds {plen}")
        for pos in range(0, plen, _PIECE):
            yield read_at(pos, min(_PIECE, plen - pos))
        return
    if codec != ZSTD:
        raise _refused(f"{what} uses unknown codec {codec}")
    try:
        declared = zstandard.frame_content_size(read_at(0, min(plen, 18)))
    except zstandard.ZstdError as exc:
        raise _damaged(f"{what} is not a zstd frame: {exc}") from None
    if declared != size:
        raise _damaged(f"{what} declares {size} bytes but its frame says {declared}")
    if _frame_length(read_at, plen, what) != plen:
        raise _damaged(f"{what} is not exactly one frame of {size} bytes")
    total = 0
    try:
        for piece in _DCTX.read_to_iter(
            cast("IO[bytes]", _PayloadReader(read_at, plen)), read_size=_PIECE, write_size=_PIECE
        ):
            total += len(piece)
            if total > size:
                break
            yield piece
    except zstandard.ZstdError as exc:
        raise _damaged(f"{what} does not decompress: {exc}") from None
    if total != size:
        raise _damaged(f"{what} is not exactly one frame of {size} bytes")


def _bytes_at(data: bytes) -> Callable[[int, int], bytes]:
    return lambda pos, n: data[pos : pos + n]
