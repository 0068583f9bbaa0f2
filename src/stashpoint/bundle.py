"""Portable bundles: a session, or one checkpoint with its ancestry, as one file.

Why a framed format of our own and not a tar: a bundle is never extracted to disk. It is read
entry by entry with bounded sizes, every byte is checked against a digest, and only then is
anything written - into a store, through the interfaces a checkpoint uses. Container entries are
named by digest or id, so ``../x``, absolute paths, links, hard links and device files have no
meaning there; the names that *could* do harm live in workspace tree objects, and every name of
every tree is checked (unsafe, duplicate, case-fold or Unicode-normalisation collisions, ``.git``)
before the import writes a byte.

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

A single-checkpoint bundle carries the records of all its ancestors *and their contents*: every
record in a store is verified with its contents (``stashpoint verify``), so a record imported
without them would read as damage. Content-addressing keeps this small when history is
incremental (measured in ``bench/bench_bundle.py``).

Cheap checks come first, because a hostile bundle's cost is in what it declares: reading
checks every entry's declared size and count against :class:`Limits`, decodes and verifies the
small entries (manifest, records, logs, trees, chunk lists: bounded by ``max_meta``), then
checks names, references (an object nothing refers to is refused here) and what each
checkpoint would restore - all before a blob is decompressed. Blobs are then decompressed and
hashed 1 MiB at a time, so memory never follows a declared size.

Errors: :class:`IntegrityError` (exit 2) when a digest, a declared size or count, the framing or
a reference does not match - the file is damaged or forged; :class:`UsageError` (exit 1) when an
intact bundle asks for something refused: unsafe names or kinds, collisions, duplicate or
unreferenced entries, limits (decompression bombs), ids that exist here with other contents,
branches whose history diverged (import those with ``as_session``), another HMAC key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import stat
import struct
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, Protocol, TypeVar, cast

import msgspec
import zstandard

from ._fsutil import TMP_MARK, fsync_dir
from ._ids import new_id
from ._store import Store
from .blobs.objects import BlobCodec, Blobs
from .errors import (
    ClashError,
    ConflictError,
    IntegrityError,
    NotFoundError,
    StashpointWarning,
    UsageError,
)
from .integrity import EMPTY_CHAIN, ChainHasher, message_chain
from .model import Checkpoint, LogRef, TreeEntry, utc_now_iso
from .stores.base import (
    GC_EPOCH_KEY,
    BlobRow,
    CheckpointRow,
    Commit,
    GcEpochChanged,
    LogAppend,
    LogInfo,
    MetadataStore,
    lease_held,
)
from .workspace.tree import validate_name

__all__ = [
    "MAGIC",
    "VERSION",
    "Bundle",
    "BundleWriter",
    "Clash",
    "ExportReport",
    "ImportReport",
    "Limits",
    "LogEntry",
    "Manifest",
    "RawEntry",
    "RecordEntry",
    "export_bundle",
    "import_bundle",
    "iter_entries",
    "read_bundle",
]

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
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_LINK = 4096
_BATCH_BYTES = 32 << 20
# Zero-width code points HFS+ ignores in names (git's is_hfs_dotgit list), so ".g\u200cit" is
# ".git" on a Mac.
_IGNORABLE = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_RESERVED = frozenset({".git", ".stashpoint", "git~1"})

_DCTX = zstandard.ZstdDecompressor()
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


KILL_ENV = "STASHPOINT_TEST_KILL_AT"
"""For tests only: ``NAME`` or ``NAME:N`` - SIGKILL this process the N-th time (default the
first) it passes the kill point ``NAME`` (``import-log``, ``import-record``, ``import-head``,
``copy-exported``)."""
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """A place where a test may kill this process (``$STASHPOINT_TEST_KILL_AT``, for tests
    only): a crash between two writes of an import or a copy must leave nothing that a plain
    re-run cannot finish, and a test can only show that by killing the real CLI exactly
    there, not at a random instant. Unset, it costs one environment lookup."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    seen = _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if seen >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _damaged(msg: str) -> IntegrityError:
    return IntegrityError(f"bundle is damaged or forged: {msg}")


def _refused(msg: str) -> UsageError:
    return UsageError(f"refusing bundle: {msg}")


Clash = ClashError
"""Older name of :class:`~stashpoint.errors.ClashError`."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what reading a bundle, and restoring what it holds, may cost; exceeding one
    refuses the bundle (exit 1) before anything is written.

    Why these defaults: a bundle is a file someone else made, and a few KiB of it can declare
    terabytes of files or millions of directories. Every limit is checked against what the
    bundle declares, before anything is decompressed; contents are then decompressed and
    hashed in pieces of at most 1 MiB, so memory does not grow with what is declared. The
    defaults fit a laptop; ``stashpoint import --max-size/--max-files/--max-depth/--max-path``
    raise them for a bundle you trust (:meth:`raised`).
    """

    max_bytes: int = 4 << 30
    """Decompressed bytes of all entries together."""
    max_ratio: int = 1000
    """... and at most this many times the file's size (a decompression bomb's tell; 0: no
    such rule), which also bounds what one checkpoint restores ..."""
    ratio_floor: int = 64 << 20
    """... except that any bundle may expand to this much."""
    max_entry: int = 1 << 30
    """One entry, decompressed (state values are not chunked, so this is a value's limit)."""
    max_entries: int = 2_000_000
    """Entries in the file (each costs memory while it is checked)."""
    max_meta: int = 256 << 20
    """Records, logs, trees and chunk lists, which are held in memory while checking."""
    max_depth: int = 256
    """Directory nesting (restores recurse per level)."""
    max_path: int = 1024
    """Bytes of a path below the workspace root: a restore adds the directory it writes into,
    and the whole path must stay under the 4096 bytes Linux allows (1024 on macOS)."""
    max_restore: int = 4 << 30
    """Bytes one checkpoint's files, values and artifacts restore to (a chunk list can name
    one chunk many times)."""
    max_restore_entries: int = 250_000
    """Files, directories and symlinks one checkpoint's tree may expand to: a tree can name one
    subtree under many names, so a bundle of a few KiB could otherwise ask a restore for 2**40
    of them. Counted once per distinct subtree, so checking stays cheap."""
    cache_bytes: int = 32 << 20
    """Blob payloads kept in memory between checking and writing; the rest is read twice."""

    def raised(
        self,
        *,
        size: int | None = None,
        files: int | None = None,
        depth: int | None = None,
        path: int | None = None,
    ) -> Limits:
        """These limits with the ones a user raised (or lowered) by name: ``size`` is what the
        bundle may expand to, altogether and per checkpoint, and replaces the ratio rule (the
        user said how much they expect); ``files`` is files, directories and symlinks per
        checkpoint (and the file's entries, if more)."""
        new = self
        if size is not None:
            new = replace(
                new,
                max_bytes=size,
                max_restore=size,
                max_entry=size,
                max_ratio=0,
            )
        if files is not None:
            new = replace(new, max_restore_entries=files, max_entries=max(files, new.max_entries))
        if depth is not None:
            new = replace(new, max_depth=depth)
        if path is not None:
            new = replace(new, max_path=path)
        return new

    def expansion_cap(self, file_size: int) -> int:
        """The most a bundle of ``file_size`` bytes may expand to."""
        if not self.max_ratio:
            return self.max_bytes
        return min(self.max_bytes, max(self.ratio_floor, self.max_ratio * file_size))

    def restore_cap(self, file_size: int) -> int:
        """The most one checkpoint of a bundle of ``file_size`` bytes may restore to."""
        if not self.max_ratio:
            return self.max_restore
        return min(self.max_restore, max(self.ratio_floor, self.max_ratio * file_size))


TRUSTED = Limits(
    max_bytes=1 << 50,
    max_ratio=0,
    max_entries=1 << 40,
    max_meta=1 << 40,
    max_path=1 << 20,
    max_restore=1 << 50,
    max_restore_entries=1 << 40,
)
"""For bundles this process wrote from a store of its own (``stashpoint copy``, the check
``export`` runs): their size is the source store's, not a stranger's choice. Structure is
still checked in full, and memory stays bounded as for any bundle."""


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


# -- checks shared by export and import --------------------------------------------------------
def _check_text(what: str, value: str) -> None:
    if not value or len(value) > 1024 or _CONTROL.search(value):
        raise _refused(f"invalid {what} {value[:80]!r}")


def _fold(name: bytes) -> str:
    """The key under which case-insensitive or normalising filesystems see a name."""
    text = unicodedata.normalize("NFC", name.decode("utf-8", "surrogateescape"))
    return unicodedata.normalize("NFC", text.casefold()).translate(_IGNORABLE)


_NAME_MAX = 255
"""Bytes of one name on every common filesystem (ext4, APFS, NTFS, XFS, btrfs)."""


def _tree_count(content: bytes) -> int:
    """Entries a tree object holds, read from its msgpack array header (-1: not an array)."""
    first = content[:1]
    if first and 0x90 <= first[0] <= 0x9F:
        return first[0] & 0x0F
    if first == b"\xdc" and len(content) >= 3:
        return int.from_bytes(content[1:3], "big")
    if first == b"\xdd" and len(content) >= 5:
        return int.from_bytes(content[1:5], "big")
    return -1


def parse_tree(digest: bytes, content: bytes, limit: int | None = None) -> list[TreeEntry]:
    """Decode one tree object and refuse any entry a restore must not be asked to create.

    With ``limit``, a tree of more entries is refused from its header, before a million
    entries are decoded into objects (~200 bytes of memory each)."""
    where = f"tree {digest.hex()[:16]}"
    if limit is not None and _tree_count(content) > limit:
        raise _too_many(limit)
    try:
        entries = _tree_dec.decode(content)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a kind that is not UTF-8
        raise _damaged(f"{where} is malformed: {exc}") from None
    folded: dict[str, bytes] = {}
    for e in entries:
        if not validate_name(e.name):
            raise _refused(f"{where} has an unsafe name {e.name!r} (empty, '.', '..', or with '/')")
        if len(e.name) > _NAME_MAX:
            raise _refused(
                f"{where} has a name of {len(e.name)} bytes ({e.name[:40]!r}...); "
                f"filesystems hold at most {_NAME_MAX}"
            )
        if e.kind not in ("f", "d", "l"):
            raise _refused(
                f"{where}: {e.name!r} is of kind {e.kind!r}; a bundle holds only files, "
                "directories and symlinks (no device files, hard links or FIFOs)"
            )
        key = _fold(e.name)
        if key.rstrip(". ") in _RESERVED:
            raise _refused(f"{where} has an entry {e.name!r}, which stashpoint never snapshots")
        if key in folded:
            other = folded[key]
            what = "twice" if other == e.name else f"and {other!r}, which collide"
            raise _refused(
                f"{where} has {e.name!r} {what} (case-insensitive or Unicode-normalising "
                "filesystems cannot hold both)"
            )
        folded[key] = e.name
        if not 0 <= e.mode <= 0o7777 or e.size < 0:
            raise _damaged(f"{where}: {e.name!r} has an invalid mode or size")
        if e.kind == "f" and e.mode & 0o6000:
            raise _refused(f"{where}: {e.name!r} is setuid/setgid")
        if e.kind in ("f", "d") and len(e.ref) != 32:
            raise _damaged(f"{where}: {e.name!r} has a malformed reference")
        if e.kind == "l" and (not e.ref or len(e.ref) > _MAX_LINK or b"\0" in e.ref):
            raise _refused(f"{where}: symlink {e.name!r} has an invalid target")
    return entries


def _too_many(limit: int) -> UsageError:
    return _refused(
        f"its trees expand to more than {limit} files, directories and symlinks (one "
        "directory named under many names?); a restore would create them all (limit: "
        "--max-files)"
    )


_S = TypeVar("_S", bound=msgspec.Struct)


def log_refs(obj: msgspec.Struct) -> Iterator[LogRef]:
    """Every LogRef in a record (conversation, journal, and any added later), generically."""
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        if isinstance(value, LogRef):
            yield value
        elif isinstance(value, msgspec.Struct):
            yield from log_refs(value)


def _remap_logs(obj: _S, fn: Callable[[str], str]) -> _S:
    changes: dict[str, Any] = {}
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        if isinstance(value, LogRef):
            changes[name] = msgspec.structs.replace(value, log=fn(value.log))
        elif isinstance(value, msgspec.Struct):
            new = _remap_logs(value, fn)
            if new is not value:
                changes[name] = new
    return msgspec.structs.replace(obj, **changes) if changes else obj


@dataclass
class _Contents:
    """What a bundle carries, as export builds it or import reads it."""

    manifest: Manifest | None = None
    records: dict[str, RecordEntry] = field(default_factory=dict)
    logs: dict[str, LogEntry] = field(default_factory=dict)
    trees: dict[bytes, bytes] = field(default_factory=dict)
    blobs: dict[bytes, int] = field(default_factory=dict)
    """Digest -> size of blobs: declared (read) or verified (export). A reader verifies every
    blob's content against its digest only after the cheap checks passed."""
    lists: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class _Checked:
    records: list[tuple[Checkpoint, RecordEntry]]
    """Parents first."""
    logs: list[str]
    """Parents first."""
    chunks: set[bytes]
    list_sizes: dict[bytes, int]


class _Checker:
    """Everything about a bundle that can be checked without the target store."""

    def __init__(
        self,
        c: _Contents,
        hasher: ChainHasher,
        limits: Limits,
        parsed: dict[bytes, list[TreeEntry]] | None = None,
        file_size: int = 0,
    ) -> None:
        self.c = c
        self.restore_cap = limits.restore_cap(file_size)
        self.parsed = parsed or {}
        """Trees already checked by :func:`parse_tree` (export parses each once)."""
        self.hasher = hasher.plain()  # bundles carry plaintext bodies
        self.limits = limits
        self.used: set[bytes] = set()
        self.chunks: set[bytes] = set()
        self.list_sizes: dict[bytes, int] = {}
        self.tree_stats: dict[bytes, _TreeStats] = {}
        self.chains: dict[str, list[bytes]] = {}
        self.used_logs: set[str] = set()

    def run(self) -> _Checked:
        m = self.c.manifest
        if m is None:
            raise _damaged("no manifest")
        if m.format != FORMAT:
            raise _damaged(f"manifest format is {m.format!r}")
        if m.version != VERSION:
            raise _refused(f"format version {m.version}; this stashpoint reads {VERSION}")
        _check_text("session name", m.session)
        if m.keyed != self.hasher.keyed:
            raise _refused(
                "its records are sealed with an HMAC key and this store has none"
                if m.keyed
                else "this store is keyed (HMAC) and the bundle's records are not; they can "
                "only be imported into a store without a key"
            )
        records = self._records(m)
        logs = self._logs(m)
        for cp, _rec in records:
            if cp.id not in m.pruned:
                self._contents(cp)
        unused = [k for k in (*self.c.trees, *self.c.blobs, *self.c.lists) if k not in self.used]
        if unused:
            raise _refused(f"it carries {len(unused)} object(s) no checkpoint refers to")
        if set(logs) - self.used_logs:
            raise _refused("it carries logs no checkpoint refers to")
        return _Checked(records, logs, self.chunks, self.list_sizes)

    def _records(self, m: Manifest) -> list[tuple[Checkpoint, RecordEntry]]:
        opened: dict[str, Checkpoint] = {}
        for ident, rec in self.c.records.items():
            try:
                cp = self.hasher.open(ident, rec.body, rec.digest)
            except UnicodeDecodeError as exc:  # its digest matches; a string in it is not UTF-8
                raise _damaged(f"checkpoint {ident} is malformed: {exc}") from None
            except IntegrityError as exc:  # (a newer record format: SchemaVersionError, exit 1)
                if self.hasher.keyed:
                    raise _damaged(
                        f"checkpoint {ident} does not verify under this store's key (the bundle "
                        "was sealed with another key, or altered)"
                    ) from None
                raise _damaged(str(exc)) from None
            if cp.session != m.session:
                raise _refused(f"checkpoint {ident} belongs to session {cp.session!r}")
            _check_text("branch name", cp.branch)
            opened[ident] = cp
        for cp in opened.values():
            if cp.parent is None:
                continue
            parent = opened.get(cp.parent)
            if parent is None:
                raise _damaged(f"checkpoint {cp.id}'s parent {cp.parent} is not in the bundle")
            if parent.digest != cp.parent_digest:
                raise _damaged(f"checkpoint {cp.id}'s parent {cp.parent} was altered")
        if not m.checkpoints or any(i not in opened for i in m.checkpoints):
            raise _damaged("the manifest names checkpoints the bundle does not carry")
        for branch, head in m.heads.items():
            _check_text("branch name", branch)
            if head not in opened:
                raise _damaged(f"branch {branch!r} points to a checkpoint not in the bundle")
        for ident, label in m.labels.items():
            _check_text("label", label)
            if ident not in opened:
                raise _damaged(f"label {label!r} names a checkpoint not in the bundle")
        for ident, when in m.pruned.items():
            _check_text("prune time", when)
            if ident not in opened or ident in m.checkpoints or ident in m.heads.values():
                raise _damaged(f"pruned checkpoint {ident} is missing, exported or a head")
        reachable: set[str] = set()
        for start in (*m.checkpoints, *m.heads.values()):
            node: str | None = start
            while node is not None and node not in reachable:
                reachable.add(node)
                node = opened[node].parent
        if len(reachable) != len(opened):
            raise _refused("it carries records that no exported checkpoint descends to")
        # Parents first (ids sort by time, but a record's order must not depend on clocks).
        order: list[tuple[Checkpoint, RecordEntry]] = []
        done: set[str] = set()
        for ident in sorted(opened):
            path: list[str] = []
            node = ident
            while node is not None and node not in done:
                path.append(node)
                node = opened[node].parent
            for x in reversed(path):
                done.add(x)
                order.append((opened[x], self.c.records[x]))
        return order

    def _logs(self, m: Manifest) -> list[str]:
        logs = self.c.logs
        order: list[str] = []
        state: dict[str, int] = {}  # 1 visiting, 2 done
        for name, entry in logs.items():
            _check_text("log session", entry.session)
            if entry.session != m.session:
                raise _refused(f"log {name} belongs to session {entry.session!r}")
            if (entry.parent is None and entry.parent_len != 0) or entry.parent_len < 0:
                raise _damaged(f"log {name} has an invalid fork point")
            if entry.parent is not None and entry.parent not in logs:
                raise _damaged(f"log {name}'s parent log {entry.parent} is not in the bundle")
            path: list[str] = []
            node: str | None = name
            while node is not None and state.get(node) != 2:
                if state.get(node) == 1:
                    raise _damaged(f"log {node} is its own ancestor")
                state[node] = 1
                path.append(node)
                node = logs[node].parent
            for x in reversed(path):
                state[x] = 2
                order.append(x)
        for name in order:
            entry = logs[name]
            chain = self.chain_at(entry.parent, entry.parent_len) if entry.parent else EMPTY_CHAIN
            own: list[bytes] = []
            for i, (stored, data) in enumerate(entry.rows):
                chain = message_chain(chain, data)
                if bytes.fromhex(chain) != stored:
                    raise _damaged(
                        f"log {name} does not match its running hash at {entry.start + i}"
                    )
                own.append(stored)
            self.chains[name] = own
        return order

    def chain_at(self, log: str | None, n: int) -> str:
        """Running hash after ``n`` entries of ``log``, following fork points."""
        while log is not None and n > 0:
            entry = self.c.logs[log]
            self.used_logs.add(log)
            if n > entry.start:
                own = self.chains.get(log)
                if own is None or n - entry.start > len(own):
                    raise _damaged(f"log {log} is shorter than a checkpoint says")
                return own[n - 1 - entry.start].hex()
            log = entry.parent
        if log is not None:
            self.used_logs.add(log)
        return EMPTY_CHAIN

    def _contents(self, cp: Checkpoint) -> None:
        restored = 0
        for ref in log_refs(cp):
            if ref.log not in self.c.logs or ref.length < 0:
                raise _damaged(f"checkpoint {cp.id} refers to log {ref.log}, not in the bundle")
            if self.chain_at(ref.log, ref.length) != ref.hash:
                raise _damaged(f"checkpoint {cp.id}: log {ref.log} does not match its hash")
        for key, hexd in cp.state.values.items():
            if not _HEX.fullmatch(hexd):
                raise _damaged(f"checkpoint {cp.id}: state value {key!r} has a bad digest")
            restored += self._content_size(
                bytes.fromhex(hexd), f"checkpoint {cp.id}: state value {key!r}"
            )
        ws = cp.workspace
        if ws is not None:
            if not _HEX.fullmatch(ws.tree):
                raise _damaged(f"checkpoint {cp.id} has a bad tree digest")
            stats = self._tree(bytes.fromhex(ws.tree), 0)
            files, nbytes = stats.files, stats.bytes
            if (files, nbytes) != (ws.files, ws.bytes):
                raise _damaged(
                    f"checkpoint {cp.id} declares {ws.files} files / {ws.bytes} bytes, its tree "
                    f"holds {files} / {nbytes}"
                )
            if stats.longest > self.limits.max_path:
                raise _refused(
                    f"checkpoint {cp.id} has a path of {stats.longest} bytes (limit "
                    f"{self.limits.max_path}: --max-path); most tools, and a restore, fail on "
                    "paths that long"
                )
            restored += nbytes
        for name, art in cp.artifacts.items():
            # The name and path are checked like tree names: a rewind writes to that path.
            what = f"checkpoint {cp.id}: artifact {name!r}"
            _check_text("artifact name", name)
            _check_text("artifact path", art.path)
            if not _HEX.fullmatch(art.digest):
                raise _damaged(f"{what} has a bad digest")
            if not os.path.isabs(art.path) or ".." in Path(art.path).parts:
                raise _refused(f"{what} names an unsafe path {art.path!r}")
            if not 0 <= art.mode <= 0o7777:
                raise _damaged(f"{what} has an invalid mode")
            if art.mode & 0o6000:  # the rule for tree files: a rewind would create it so
                raise _refused(f"{what} is setuid/setgid")
            if self._content_size(bytes.fromhex(art.digest), what) != art.size:
                raise _damaged(f"{what} declares {art.size} bytes, its content differs")
            restored += art.size
        if restored > self.restore_cap:
            raise _refused(
                f"checkpoint {cp.id}'s files and values would expand to {restored} bytes, more "
                f"than {self.restore_cap} ({self._cap_rule()}): a decompression bomb?"
            )

    def _cap_rule(self) -> str:
        lim = self.limits
        if lim.max_ratio and self.restore_cap < lim.max_restore:
            return f"{lim.max_ratio}x the bundle's size; --max-size SIZE if you trust it"
        return "--max-size"

    def _content_size(self, digest: bytes, what: str) -> int:
        c = self.c
        self.used.add(digest)
        if digest in c.blobs:
            return c.blobs[digest]
        if digest in c.trees:
            return len(c.trees[digest])
        if digest in self.list_sizes:
            return self.list_sizes[digest]
        chunk_list = c.lists.get(digest)
        if chunk_list is None:
            raise _damaged(f"{what}: content {digest.hex()[:16]} is not in the bundle")
        if not chunk_list or len(chunk_list) % 32:
            raise _damaged(f"chunk list {digest.hex()[:16]} is malformed")
        total = 0
        for i in range(0, len(chunk_list), 32):
            chunk = chunk_list[i : i + 32]
            size = c.blobs.get(chunk)
            if size is None:
                raise _damaged(f"chunk {chunk.hex()[:16]} of {digest.hex()[:16]} is missing")
            self.used.add(chunk)
            self.chunks.add(chunk)
            total += size
            if total > self.restore_cap:  # stop counting: a list can name 8 M chunks
                raise _refused(
                    f"{what} would expand to more than {self.restore_cap} bytes "
                    f"({self._cap_rule()}): a decompression bomb?"
                )
        self.list_sizes[digest] = total
        return total

    def _tree(self, digest: bytes, depth: int) -> _TreeStats:
        """What a tree expands to. Memoised per digest, so a subtree named many times is checked
        once; its height and entry count keep the depth and entry limits true for every name
        it is reached by."""
        lim = self.limits
        known = self.tree_stats.get(digest)
        if known is None:
            if depth > lim.max_depth:
                raise _refused(f"directories nest deeper than {lim.max_depth} (--max-depth)")
            known = self._expand(digest, depth)
            self.tree_stats[digest] = known
        if depth + known.height > lim.max_depth:
            raise _refused(f"directories nest deeper than {lim.max_depth} (--max-depth)")
        return known

    def _expand(self, digest: bytes, depth: int) -> _TreeStats:
        content = self.c.trees.get(digest)
        if content is None:
            raise _damaged(f"tree {digest.hex()[:16]} is not in the bundle")
        self.used.add(digest)
        limit = self.limits.max_restore_entries
        files = nbytes = count = height = longest = 0
        entries = self.parsed.get(digest)
        for e in parse_tree(digest, content, limit) if entries is None else entries:
            count += 1
            longest = max(longest, len(e.name))
            if e.kind == "d":
                sub = self._tree(e.ref, depth + 1)
                files, nbytes = files + sub.files, nbytes + sub.bytes
                count += sub.entries
                height = max(height, sub.height + 1)
                if sub.longest:
                    longest = max(longest, len(e.name) + 1 + sub.longest)
            elif e.kind == "f":
                size = self._content_size(e.ref, f"file {e.name!r}")
                if size != e.size:
                    raise _damaged(f"file {e.name!r} declares {e.size} bytes, its content {size}")
                files, nbytes = files + 1, nbytes + size
            else:
                if e.size != len(e.ref):
                    raise _damaged(f"symlink {e.name!r} declares a wrong size")
                files += 1
            if count > limit:
                raise _too_many(limit)
        return _TreeStats(files, nbytes, count, height, longest)


@dataclass(frozen=True)
class _TreeStats:
    files: int
    """Files and symlinks (what a workspace record counts)."""
    bytes: int
    entries: int
    """Files, directories and symlinks below the tree."""
    height: int
    """Directory levels below the tree."""
    longest: int
    """Bytes of the longest path below the tree (``a/b/c``)."""


# -- reading -----------------------------------------------------------------------------------
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
    (``stashpoint copy`` reads its temporary bundle through a cipher: see :mod:`.copy`)."""

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


# -- export ------------------------------------------------------------------------------------
@dataclass
class ExportReport:
    path: str
    session: str
    scope: str
    checkpoints: int
    logs: int
    objects: int
    """Trees, blobs and chunk lists."""
    bytes: int
    """Decompressed bytes of every entry."""
    size: int
    """Bytes of the file."""
    digest: str
    heads: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def export_bundle(
    store: Store,
    dest: str | os.PathLike[str],
    *,
    session: str,
    checkpoint: str | None = None,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Write a session (or one checkpoint, with its ancestors) to ``dest``.

    Everything written is read back from the store verified, and the bundle is checked by the
    same rules as an import before it is renamed into place, so a bundle that exists imports.
    """
    path = Path(dest)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        # The bundle is renamed over the path: never over a device, FIFO, socket, directory or
        # symlink, --overwrite or not (as root, ``-o /dev/null`` would replace the device).
        kind = _KINDS.get(stat.S_IFMT(mode), "an unknown kind")
        raise UsageError(
            f"{path} exists and is not a regular file ({kind}); refusing to replace it: "
            "choose another name"
        )
    if mode is not None and not overwrite:
        raise UsageError(f"{path} exists; choose another name or pass --overwrite")
    ex = _Exporter(store, session, progress)
    rows = ex.select(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TMP_MARK}{path.name}.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            digest = ex.write(f, rows, checkpoint)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    m = ex.contents.manifest
    assert m is not None
    return ExportReport(
        str(path),
        session,
        m.scope,
        len(ex.contents.records),
        len(ex.contents.logs),
        len(ex.done),
        ex.writer_bytes,
        path.stat().st_size,
        digest.hex(),
        dict(m.heads),
    )


class _Exporter:
    def __init__(
        self, store: Store, session: str, progress: Callable[[int, int], None] | None
    ) -> None:
        self.store = store
        self.blobs: Blobs = store.blobs
        self.session = session
        self.progress = progress
        self.contents = _Contents()
        self.done: set[bytes] = set()
        self.parsed: dict[bytes, list[TreeEntry]] = {}
        self.writer_bytes = 0
        self._w: BundleWriter | None = None

    def select(self, checkpoint: str | None) -> list[CheckpointRow]:
        """The records to export, each verified with its parent link; parents first."""
        meta = self.store.meta
        if checkpoint is None:
            rows = {r.id: r for r in meta.list_checkpoints(self.session)}
            if not rows:
                raise NotFoundError(f"session {self.session!r} has no checkpoints")
        else:
            row = meta.get_checkpoint(checkpoint)
            if row is None or row.session != self.session:
                raise NotFoundError(f"no checkpoint {checkpoint} in session {self.session!r}")
            rows = {row.id: row}
        out: dict[str, CheckpointRow] = {}
        pending = sorted(rows)
        while pending:
            ident = pending.pop()
            if ident in out:
                continue
            row2 = rows.get(ident) or meta.get_checkpoint(ident)
            if row2 is None:
                raise IntegrityError(f"checkpoint {ident} is missing", checkpoint=ident)
            cp = self.store.open_row(row2)
            if cp.parent is not None:
                prow = rows.get(cp.parent) or meta.get_checkpoint(cp.parent)
                if prow is None or prow.digest != cp.parent_digest:
                    what = "is missing" if prow is None else "was altered"
                    raise IntegrityError(
                        f"checkpoint {cp.id} is broken: its parent {cp.parent} {what}",
                        checkpoint=cp.id,
                    )
                rows.setdefault(prow.id, prow)
                pending.append(prow.id)
            out[ident] = row2
        return [out[i] for i in sorted(out)]

    def write(self, f: BinaryIO, rows: list[CheckpointRow], checkpoint: str | None) -> bytes:
        from . import __version__

        c, meta = self.contents, self.store.meta
        cps = [self.store.open_row(r) for r in rows]
        ids = {cp.id for cp in cps}
        pruned = {i: at for i, at in meta.pruned(self.session).items() if i in ids}
        if checkpoint is None:
            heads = {b: h for b, h in meta.branches(self.session).items() if h in ids}
            selected = sorted(ids - pruned.keys())
        else:
            target = next(cp for cp in cps if cp.id == checkpoint)
            heads, selected = {target.branch: target.id}, [target.id]
        if pruned.keys() & {*heads.values(), *selected}:
            raise UsageError(
                "a checkpoint to export was pruned by retention: its contents may be gone"
            )
        self._warn_live_runs(heads, {cp.id: cp for cp in cps})
        labels = {i: label for i, label in meta.labels(self.session).items() if i in ids}
        c.manifest = Manifest(
            format=FORMAT,
            version=VERSION,
            session=self.session,
            scope="session" if checkpoint is None else "checkpoint",
            checkpoints=selected,
            heads=heads,
            labels=labels,
            pruned=pruned,
            keyed=self.store.hasher.keyed,
            source_store=self.store.id,
            created_at=utc_now_iso(),
            stashpoint=__version__,
        )
        cps_full = [cp for cp in cps if cp.id not in pruned]
        w = self._w = BundleWriter(f)
        w.add(MANIFEST, "manifest", msgspec.json.encode(c.manifest))
        for row, cp in zip(rows, cps, strict=True):
            rec = RecordEntry(row.digest, self.store.hasher.plain_body(row.id, row.body))
            c.records[cp.id] = rec
            w.add(RECORD, cp.id, _msgpack.encode(rec))
        for name, entry in self._logs(cps_full).items():
            c.logs[name] = entry
            w.add(LOG, name, _msgpack.encode(entry))
        for cp in cps_full:
            for hexd in cp.state.values.values():
                self._blob(bytes.fromhex(hexd))
            if cp.workspace is not None:
                self._tree(bytes.fromhex(cp.workspace.tree))
            for art in cp.artifacts.values():
                self._blob(bytes.fromhex(art.digest))
        _Checker(c, self.store.hasher, TRUSTED, self.parsed).run()  # import would accept it
        self.writer_bytes = w.bytes
        return w.finish()

    def _warn_live_runs(self, heads: dict[str, str], cps: dict[str, Checkpoint]) -> None:
        """A durable run's journal entries after its branch's last checkpoint live in this
        store only (its run record); a run resumed from the bundle would execute those steps
        again, so say so."""
        import json
        import warnings

        from ._runs import record_applies, run_key

        meta = self.store.meta
        for branch, head in heads.items():
            raw = meta.get_meta(run_key(self.session, branch))
            record = json.loads(raw) if raw else None
            if not isinstance(record, dict) or not record_applies(record, cps[head]):
                continue
            info = meta.log_info(str(record["log"]))
            tail = info.length if info is not None else int(record.get("parent_len") or 0)
            journal = cps[head].journal
            extra = tail - (journal.length if journal is not None else 0)
            if extra > 0:
                warnings.warn(
                    f"branch {branch!r} has a live durable run with {extra} journal entries "
                    "after its last checkpoint; the bundle carries checkpoints only, so a run "
                    "resumed from it repeats those steps (checkpoint first to include them)",
                    StashpointWarning,
                    stacklevel=4,
                )

    def _logs(self, cps: list[Checkpoint]) -> dict[str, LogEntry]:
        """Every log the records refer to, up to the longest reference, with its fork parents
        up to their fork points; parents first."""
        meta = self.store.meta
        need: dict[str, int] = {}
        infos: dict[str, LogInfo] = {}
        work = [(ref.log, ref.length) for cp in cps for ref in log_refs(cp)]
        while work:
            log, n = work.pop()
            if need.get(log, -1) >= n:
                continue
            need[log] = n
            info = infos.get(log) or meta.log_info(log)
            if info is None:
                raise IntegrityError(f"log {log} is missing")
            infos[log] = info
            if info.parent is not None:
                work.append((info.parent, info.parent_len))
        out: dict[str, LogEntry] = {}

        def add(log: str) -> None:
            if log in out:
                return
            info = infos[log]
            if info.parent is not None:
                add(info.parent)
            start = info.parent_len if info.parent is not None else 0
            rows = meta.read_messages(log, start, need[log]) if need[log] > start else []
            if any(r.idx != start + i for i, r in enumerate(rows)) or len(rows) != max(
                0, need[log] - start
            ):
                raise IntegrityError(f"log {log} has missing entries")
            out[log] = LogEntry(
                info.session, info.parent, info.parent_len, [(r.chain, r.data) for r in rows]
            )

        for log in sorted(need):
            add(log)
        return out

    def _raw(
        self, digest: bytes, row: tuple[int, int, bytes] | None = None
    ) -> tuple[int, int, bytes, bytes]:
        """(bundle codec, size, payload, content) of a stored blob, verified. Reaches into
        :class:`Blobs` for the stored frame, so that it is copied, not re-compressed."""
        codec, size, data = row or self.blobs._fetch(digest)
        if codec == BlobCodec.PACKED:
            codec, data = self.blobs._unpack(digest, data)
        codec, data = self.blobs.open_frame(digest, codec, data)  # bundles hold plaintext
        content = self.blobs.inflate(digest, codec, size, data)
        if codec == BlobCodec.ZSTD and zstandard.frame_content_size(data) == size:
            return ZSTD, size, data, content
        return RAW, size, content, content

    def _put(self, kind: bytes, digest: bytes, codec: int, size: int, payload: bytes) -> None:
        assert self._w is not None
        self._w.add_payload(kind, digest.hex(), codec, size, payload)
        self.done.add(digest)
        if self.progress is not None:
            self.progress(self._w.entries, self._w.bytes)

    def _tree(self, digest: bytes) -> None:
        if digest in self.done:
            return
        codec, size, payload, content = self._raw(digest)
        self._put(TREE, digest, codec, size, payload)
        self.contents.trees[digest] = content
        entries = self.parsed[digest] = parse_tree(digest, content)
        for e in entries:
            if e.kind == "d":
                self._tree(e.ref)
            elif e.kind == "f":
                self._blob(e.ref)

    def _blob(self, digest: bytes) -> None:
        if digest in self.done:
            return
        row = self.blobs._fetch(digest)
        codec, size, data = row
        if codec != BlobCodec.CHUNKS:
            codec, size, payload, _content = self._raw(digest, row)
            self._put(BLOB, digest, codec, size, payload)
            self.contents.blobs[digest] = size
            return
        if not data or len(data) % 32:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad chunk list")
        whole, total = hashlib.sha256(), 0
        for i in range(0, len(data), 32):
            chunk = data[i : i + 32]
            ccodec, csize, payload, content = self._raw(chunk)
            whole.update(content)
            total += csize
            if chunk not in self.done:
                self._put(BLOB, chunk, ccodec, csize, payload)
                self.contents.blobs[chunk] = csize
        if whole.digest() != digest or total != size:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: chunks do not match digest")
        assert self._w is not None
        self._w.add(CHUNKS, digest.hex(), data)
        self.done.add(digest)
        self.contents.lists[digest] = data


# -- import ------------------------------------------------------------------------------------
@dataclass
class ImportReport:
    session: str
    digest: str
    checkpoints: int = 0
    """Records written."""
    present: int = 0
    """Records the store already had (same id, same digest): skipped."""
    logs: int = 0
    """Logs created or extended."""
    objects: int = 0
    """Trees, blobs and chunk lists written."""
    objects_present: int = 0
    bytes: int = 0
    """Bytes of content written."""
    pruned: int = 0
    """Records marked pruned, as they were in the source (imported without contents)."""
    heads: dict[str, dict[str, str | None]] = field(default_factory=dict)
    """Branch -> {"head": id, "action": created | fast-forward | unchanged | kept}."""
    ids: dict[str, str] = field(default_factory=dict)
    """Id in the bundle -> id in the store (they differ only when imported ``as_session``)."""
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class _LogPlan:
    log: str
    start: int
    rows: list[tuple[bytes, bytes]]
    new: LogInfo | None


def import_bundle(
    store: Store,
    bundle: Bundle,
    *,
    as_session: str | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Import a checked bundle; every check against the store happens before the first write.

    Records whose id the store has with the same digest are skipped; another digest refuses the
    bundle. A branch is created, fast-forwarded, or left where it is when the store is ahead; a
    branch whose history diverged refuses the bundle - import it ``as_session`` (records are
    then re-sealed into that new session with new ids, each naming its origin in ``meta``).

    Writes go blobs -> logs -> records -> heads, so a crash leaves only unreferenced rows that
    a rerun skips or completes. Imported ``as_session``, the new ids are noted in the store
    before the first write (see :class:`_PendingImport`): running the same import again
    reuses them, so it completes the half-done session instead of being refused as existing.
    Another writer moving a branch meanwhile, or a GC condemning blobs after they were found
    present (the ``gc_epoch`` fence), is a ConflictError; a session another worker holds a live
    lease on is refused (LeaseHeld) before the first write. Every record the bundle carries
    ends with the bundle's label, or none (a re-run carries changes).
    """
    checked = bundle.checked
    if checked is None:
        raise UsageError("import_bundle needs a bundle from read_bundle")
    m = bundle.manifest
    if as_session is None and m.keyed != store.hasher.keyed:
        raise _refused(
            "it was checked under another key than this store's; import it as a new session "
            "(--as NAME) to seal its records again under this store's key"
        )
    session = as_session or m.session
    _check_text("session name", session)
    report = ImportReport(session, bundle.digest, dry_run=dry_run)
    meta = store.meta
    if as_session is None:
        plain = store.hasher.plain()  # bundles carry plaintext bodies; sealed again on write
        records = [(plain.open(cp.id, rec.body, rec.digest), rec) for cp, rec in checked.records]
    else:  # checked by read_bundle under the key it was given, sealed again under ours: this
        records = list(checked.records)  # is how a store is encrypted or re-keyed

    pending: _PendingImport | None = None
    if as_session is not None:
        pending = _PendingImport.find(meta, session, records)
        if pending is None:
            if meta.branches(session) or meta.list_checkpoints(session, limit=1):
                raise UsageError(f"session {session!r} exists in this store; --as needs a new name")
            pending = _PendingImport(bundle.digest, {}, {})
        resumed = bool(pending.records or pending.logs)
        log_ids = {name: pending.logs.get(name) or new_id() for name in checked.logs}
        rows, report.ids = _reseal(store, records, session, log_ids, pending)
        pending.logs = log_ids
        pending.records = {cp.id: (report.ids[cp.id], rec.digest) for cp, rec in records}
        new_rows = []
        for row in rows:  # a re-run: what the interrupted import wrote is there, same digest
            existing = meta.get_checkpoint(row.id) if resumed else None
            if existing is None:
                new_rows.append(row)
            elif existing.digest != row.digest:
                raise Clash(
                    f"refusing bundle: checkpoint {row.id} of the interrupted import into "
                    f"{session!r} has other contents than this bundle gives it"
                )
            else:
                report.present += 1
    else:
        log_ids = {name: name for name in checked.logs}
        rows = [
            CheckpointRow(
                cp.id,
                cp.session,
                cp.branch,
                cp.parent,
                store.hasher.store_body(cp.id, rec.body),
                rec.digest,
            )
            for cp, rec in records
        ]
        new_rows = []
        for row in rows:
            existing = meta.get_checkpoint(row.id)
            if existing is None:
                new_rows.append(row)
            elif existing.digest != row.digest:
                raise Clash(
                    f"refusing bundle: checkpoint {row.id} exists in this store with other "
                    "contents; refusing to overwrite it"
                )
            else:
                report.present += 1
        report.ids = {row.id: row.id for row in rows}
    logs = _plan_logs(store, bundle, checked.logs, log_ids, session)
    # In the store's ids: a re-run of an interrupted import --as finds heads it set itself.
    ids = report.ids
    parents: dict[str, str | None] = {
        ids[cp.id]: ids.get(cp.parent, cp.parent) for cp, _rec in records if cp.parent
    }
    heads: list[tuple[str, str, str | None]] = []
    for branch, head in sorted(m.heads.items()):
        target = ids[head]
        action, current = _head_action(store, session, branch, target, parents)
        report.heads[branch] = {"head": target, "action": action}
        if action in ("created", "fast-forward"):
            heads.append((branch, target, current))
    fresh = {row.id for row in new_rows}
    # Every record the bundle carries gets the bundle's label (or none), also one that was
    # here already: a re-run then carries a label added, moved or removed since the last one.
    # Records the bundle does not carry keep theirs.
    here = meta.labels(session)
    want = {report.ids[i]: label for i, label in m.labels.items()}
    labels = {i: want.get(i) for i in report.ids.values() if here.get(i) != want.get(i)}
    digests = [*bundle.slots, *checked.list_sizes]
    epoch = meta.get_meta(GC_EPOCH_KEY) or "0"  # read before relying on which blobs exist
    # Only chunks live as files: asking the blob directory about small blobs costs a stat each.
    have = store.blobs.has(checked.chunks) | meta.has_blobs(
        d for d in digests if d not in checked.chunks
    )
    report.objects_present = len(have)
    report.checkpoints, report.logs = len(new_rows), len(logs)
    _check_ids(store.meta, [row.id for row in new_rows], [plan.log for plan in logs])
    if dry_run:
        report.objects = len(digests) - len(have)
        return report
    lease = meta.lease_info(session)
    if lease is not None and lease.expires_in > 0:  # refuse before writing anything
        raise lease_held(session, lease.owner, lease.expires_in)
    if pending is not None:  # before the first write: a re-run must find the ids it reuses
        meta.set_meta(pending.key(session), pending.to_json())
    _write_objects(store, bundle, checked, have, report, progress)
    for plan in logs:  # session=: refused in the append's own transaction if leased meanwhile
        meta.append_log(LogAppend(plan.log, plan.start, plan.rows, plan.new, session=session))
        kill_point("import-log")
    try:
        for row in new_rows:
            meta.commit(Commit(row, None, move_head=False, gc_epoch=epoch))
            kill_point("import-record")
    except GcEpochChanged:
        raise ConflictError(
            "a garbage collection began during the import; run it again (what was written "
            "is kept and skipped)"
        ) from None
    for branch, target, current in heads:
        _bind_imported(store, session, branch, current)
        meta.set_head(session, branch, target, current)
        kill_point("import-head")
    for ident, label in sorted(labels.items(), key=lambda kv: kv[1] is not None):
        meta.set_label(ident, session, label)  # removals first: a moved label is never twice
    # Marks after their records (a mark needs its record): a crash between leaves one unmarked.
    by_time: dict[str, list[str]] = {}
    for ident, when in m.pruned.items():
        if report.ids[ident] in fresh:
            by_time.setdefault(when, []).append(report.ids[ident])
    for when, idents in sorted(by_time.items()):
        report.pruned += len(meta.mark_pruned(session, idents, when))
    if pending is not None:
        meta.set_meta(pending.key(session), None)  # complete: the session is an ordinary one
    return report


def _bind_imported(store: Store, session: str, branch: str, current: str | None) -> None:
    """The root a bundle's records were snapshotted in is the sender's, not a place to
    write: a branch the import creates is bound to no directory (a restore then needs one
    named explicitly); one it fast-forwards stays bound where it was here."""
    from . import restore_target

    if restore_target.bound_to(store, session, branch) is not None:
        return
    here = store.get(current) if current is not None else None
    if here is not None and here.workspace is not None:
        restore_target.bind(store, session, branch, Path(here.workspace.root))
    else:
        restore_target.unbind(store, session, branch)


@dataclass
class _PendingImport:
    """The ids an import ``as_session`` gives the records and logs it writes, noted in the
    store (meta ``import:<session>``) before its first write and removed after its last.

    Why: those ids are new, so a crash midway leaves records of a session with no head, or
    logs no record names, which a plain re-run would refuse ("session exists") or duplicate.
    With the note, a re-run that carries the same records (same original ids and digests: the
    same bundle, or a new export of the same history, as ``stashpoint copy --as`` makes on each
    run) reuses those ids: what was written is found present and the rest is completed. A
    bundle with other records is refused while the note is there."""

    bundle: str
    """The digest of the bundle the import began with (each record's ``stashpoint_import``
    names it, also the ones a re-run writes: records of one import are sealed alike)."""
    records: dict[str, tuple[str, str]]
    """Original id -> (id here, original digest)."""
    logs: dict[str, str]
    """Original log id -> log id here."""

    PREFIX = "import:"

    @classmethod
    def key(cls, session: str) -> str:
        return f"{cls.PREFIX}{session}"

    def to_json(self) -> str:
        return json.dumps(
            {"bundle": self.bundle, "records": self.records, "logs": self.logs},
            separators=(",", ":"),
        )

    @classmethod
    def find(
        cls, meta: MetadataStore, session: str, records: list[tuple[Checkpoint, RecordEntry]]
    ) -> _PendingImport | None:
        """The interrupted import into ``session`` that these records continue, if any."""
        raw = meta.get_meta(cls.key(session))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            note = cls(
                str(data["bundle"]),
                {k: (str(v[0]), str(v[1])) for k, v in data["records"].items()},
                {str(k): str(v) for k, v in data["logs"].items()},
            )
        except (ValueError, TypeError, KeyError, IndexError):
            raise IntegrityError(
                f"the note of an interrupted import into session {session!r} is unreadable"
            ) from None
        digests = {cp.id: rec.digest for cp, rec in records}
        if any(digests.get(orig) != digest for orig, (_id, digest) in note.records.items()):
            raise UsageError(
                f"session {session!r} holds an interrupted import of another bundle "
                f"({note.bundle[:16]}); import that bundle --as {session!r} again to finish "
                "it, or import this one as another session"
            )
        return note


def _check_ids(meta: MetadataStore, checkpoints: list[str], logs: list[str]) -> None:
    """Refuse ids the destination cannot hold before the first write: a bundle allows 128
    characters with ``.`` and ``:``, a ``file://`` store only what can be a file name. Its
    refusal came after blobs and logs were written."""
    try:
        for ident in checkpoints:
            meta.check_id("checkpoint id", ident)
        for log in logs:
            meta.check_id("log", log)
    except UsageError as exc:
        raise _refused(f"{exc}; import it as a new session (--as NAME) for new ids") from None


def _reseal(
    store: Store,
    records: list[tuple[Checkpoint, RecordEntry]],
    session: str,
    log_ids: dict[str, str],
    pending: _PendingImport,
) -> tuple[list[CheckpointRow], dict[str, str]]:
    """The records as a new session: new ids (those an interrupted import of them gave them,
    if any), new log ids, the chain sealed again here. Sealing is deterministic, so a record
    the interrupted import wrote comes out the same and is found present."""
    ids: dict[str, str] = {}
    digests: dict[str, str] = {}
    rows = []
    for cp, rec in records:
        known = pending.records.get(cp.id)
        ids[cp.id] = known[0] if known is not None else new_id()
        parent = ids[cp.parent] if cp.parent is not None else None
        origin = {
            "id": cp.id,
            "digest": rec.digest,
            "session": cp.session,
            "bundle": pending.bundle,
        }
        new = msgspec.structs.replace(
            _remap_logs(cp, log_ids.__getitem__),
            id=ids[cp.id],
            session=session,
            parent=parent,
            parent_digest=digests[cp.parent] if cp.parent is not None else None,
            meta={**cp.meta, "stashpoint_import": origin},
            digest="",
        )
        sealed, body = store.hasher.seal(new)
        digests[cp.id] = sealed.digest
        rows.append(CheckpointRow(sealed.id, session, sealed.branch, parent, body, sealed.digest))
    return rows, ids


def _plan_logs(
    store: Store, bundle: Bundle, order: list[str], log_ids: dict[str, str], session: str
) -> list[_LogPlan]:
    """What to append to each log; a log here that disagrees with the bundle refuses it."""
    meta = store.meta
    plans = []
    for name in order:
        entry = bundle.contents.logs[name]
        target = log_ids[name]
        parent = log_ids[entry.parent] if entry.parent is not None else None
        start = entry.start
        info = meta.log_info(target)
        if info is None:
            new = LogInfo(session, parent, entry.parent_len, entry.parent_len)
            plans.append(_LogPlan(target, start, entry.rows, new))
            continue
        if (info.session, info.parent, info.parent_len) != (session, parent, entry.parent_len):
            raise Clash(f"refusing bundle: log {target} exists in this store with another origin")
        overlap = min(info.length, start + len(entry.rows))
        have = meta.read_messages(target, start, overlap) if overlap > start else []
        if [(r.chain, r.data) for r in have] != entry.rows[: overlap - start]:
            raise Clash(f"refusing bundle: log {target} exists in this store with other entries")
        if start + len(entry.rows) > info.length:
            plans.append(_LogPlan(target, info.length, entry.rows[info.length - start :], None))
    return plans


def _head_action(
    store: Store, session: str, branch: str, head: str, parents: dict[str, str | None]
) -> tuple[str, str | None]:
    current = store.meta.get_head(session, branch)
    if current is None:
        return "created", None
    if current == head:
        return "unchanged", current
    node: str | None = head
    while node is not None:
        if node == current:
            return "fast-forward", current
        node = parents.get(node)
    node, steps = current, 0
    while node is not None and steps < 10_000_000:
        if node == head:
            return "kept", current  # the store is ahead of the bundle on this branch
        row = store.meta.get_checkpoint(node)
        node, steps = (row.parent if row else None), steps + 1
    raise Clash(
        f"branch {branch!r} of session {session!r} has another history here (head {current}) "
        f"than in the bundle (head {head}); import it as a new session with --as NAME"
    )


def _write_objects(
    store: Store,
    bundle: Bundle,
    checked: _Checked,
    have: set[bytes],
    report: ImportReport,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Blobs, in file order, as they are in the bundle (zstd frames stay compressed); chunks
    before the chunk lists that name them."""
    blobs = store.blobs
    local = blobs.local
    batch: list[BlobRow] = []
    batch_bytes = 0

    def flush() -> None:
        nonlocal batch, batch_bytes
        if batch:
            store.meta.put_blobs(blobs.pack(batch))
        batch, batch_bytes = [], 0

    for digest, slot in sorted(bundle.slots.items(), key=lambda kv: kv[1].offset):
        if digest in have:
            continue
        codec: int = BlobCodec.ZSTD if slot.codec == ZSTD else BlobCodec.RAW
        codec, payload = blobs.seal_frame(digest, codec, bundle.payload(digest))
        if digest in checked.chunks and local is not None:
            local.put(digest, codec, slot.size, payload)
        else:
            batch.append(BlobRow(digest, codec, slot.size, payload))
            batch_bytes += len(payload)
            if batch_bytes >= _BATCH_BYTES:
                flush()
        report.objects += 1
        report.bytes += slot.size
        if progress is not None:
            progress(report.objects, report.bytes)
    flush()
    lists = [
        BlobRow(d, BlobCodec.CHUNKS, size, bundle.contents.lists[d])
        for d, size in checked.list_sizes.items()
        if d not in have
    ]
    if lists:
        store.meta.put_blobs(lists)
        report.objects += len(lists)
