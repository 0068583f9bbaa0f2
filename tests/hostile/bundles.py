"""Builders of hostile bundles, each a few KiB to a few MiB on disk.

Every bundle starts from a real export (one checkpoint: a small file, a state value) and
changes one thing, with every digest recomputed - the record re-sealed, the tree re-hashed -
so that only the trick itself is hostile, as an attacker would craft it.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import msgspec

import stashpoint
from stashpoint.bundle import (
    BLOB,
    CHUNKS,
    RAW,
    RECORD,
    TREE,
    ZSTD,
    BundleWriter,
    RawEntry,
    RecordEntry,
    decode_payload,
    export_bundle,
    iter_entries,
)
from stashpoint.integrity import ChainHasher
from stashpoint.model import Checkpoint, TreeEntry

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_BLOCK = 128 * KIB  # zstd's largest block


def rle_frame(size: int, byte: int = 0) -> bytes:
    """A zstd frame of ``size`` copies of ``byte``, declaring its content size: RLE blocks of
    4 bytes per 128 KiB, so a 1 GiB run is 32 KiB and costs nothing to build (compressing the
    run with the library would take ~0.4 s a GiB)."""
    # An 8-byte content size and a 128 KiB window (a single-segment frame would ask for a
    # window of its whole size, which streaming decompressors refuse past 128 MiB).
    out = [struct.pack("<IBBQ", 0xFD2FB528, 0xC0, 7 << 3, size)]
    left = size
    while True:
        n = min(left, _BLOCK)
        left -= n
        last = 1 if left == 0 else 0
        out.append((last | 1 << 1 | n << 3).to_bytes(3, "little") + bytes([byte]))
        if last:
            return b"".join(out)


def run_digest(size: int, byte: int = 0) -> bytes:
    """SHA-256 of ``size`` copies of ``byte`` (hashing runs ~0.6 GiB/s here)."""
    h = hashlib.sha256()
    piece = bytes([byte]) * min(size, 4 * MIB)
    left = size
    while left:
        h.update(piece[: min(left, len(piece))])
        left -= min(left, len(piece))
    return h.digest()


def base_bundle(d: Path) -> Path:
    """A legitimate bundle: one checkpoint of a workspace holding ``a.txt``, one state value."""
    ws = d / "ws"
    ws.mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    with stashpoint.open(d / "store") as store:
        store.session("main", workspace=ws).checkpoint({"plan": "p"})
        export_bundle(store, d / "base.spb", session="main")
    return d / "base.spb"


def raw(kind: bytes, data: bytes) -> tuple[bytes, RawEntry]:
    """(digest, entry) of an object stored uncompressed."""
    digest = hashlib.sha256(data).digest()
    return digest, RawEntry(kind, digest.hex(), RAW, len(data), data)


def packed(kind: bytes, data: bytes) -> tuple[bytes, RawEntry]:
    """(digest, entry) of an object stored as a zstd frame."""
    import zstandard

    digest = hashlib.sha256(data).digest()
    frame = zstandard.ZstdCompressor(level=3).compress(data)
    return digest, RawEntry(kind, digest.hex(), ZSTD, len(data), frame)


def tree(entries: list[TreeEntry]) -> tuple[bytes, RawEntry]:
    return packed(TREE, msgspec.msgpack.encode(entries))


def save(entries: list[RawEntry], path: Path) -> Path:
    with open(path, "wb") as f:
        w = BundleWriter(f)
        for e in entries:
            w.add_payload(e.kind, e.name, e.codec, e.size, e.payload)
        w.finish()
    return path


def forge(
    base: Path,
    out: Path,
    *,
    root: list[TreeEntry] | None = None,
    values: dict[str, bytes] | None = None,
    added: list[RawEntry] = (),  # type: ignore[assignment]
    files: int | None = None,
    size: int | None = None,
) -> Path:
    """``base`` with a new root directory ``root`` (``files`` files and symlinks of ``size``
    bytes in all, as the record must declare) and/or state ``values`` (key -> digest), the
    record re-sealed; ``added`` objects are appended after the record's own."""
    entries = list(iter_entries(base))
    (i,) = [n for n, e in enumerate(entries) if e.kind == RECORD]
    rec = msgspec.msgpack.decode(
        decode_payload(entries[i].codec, entries[i].size, entries[i].payload), type=RecordEntry
    )
    cp = msgspec.json.decode(rec.body, type=Checkpoint)
    assert cp.workspace is not None
    cp_tree = cp.workspace.tree
    drop: set[str] = set()
    if root is not None:
        digest, root_entry = tree(root)
        drop.add(cp.workspace.tree)
        ws = msgspec.structs.replace(
            cp.workspace,
            tree=digest.hex(),
            files=files if files is not None else sum(e.kind in "fl" for e in root),
            bytes=size if size is not None else sum(e.size for e in root if e.kind == "f"),
        )
        cp = msgspec.structs.replace(cp, workspace=ws)
        added = [root_entry, *added]
    if values is not None:
        drop.update(cp.state.values.values())
        state = msgspec.structs.replace(cp.state, values={k: v.hex() for k, v in values.items()})
        cp = msgspec.structs.replace(cp, state=state)
    sealed, body = ChainHasher().seal(cp)
    record = msgspec.msgpack.encode(RecordEntry(sealed.digest, body))
    entries[i] = RawEntry(RECORD, cp.id, RAW, len(record), record)
    if root is not None:  # the base workspace is one file: its tree and that file's blob go
        (t,) = [e for e in entries if e.name == cp_tree]
        old = msgspec.msgpack.decode(
            decode_payload(t.codec, t.size, t.payload), type=list[TreeEntry]
        )
        drop.update(e.ref.hex() for e in old)
    return save([*(e for e in entries if e.name not in drop), *added], out)


# -- the table's bundles ---------------------------------------------------------------------
def big_value(base: Path, out: Path, size: int) -> Path:
    """One state value of ``size`` zero bytes."""
    digest = run_digest(size)
    bomb = RawEntry(BLOB, digest.hex(), ZSTD, size, rle_frame(size))
    return forge(base, out, values={"plan": digest}, added=[bomb])


def unreferenced_bombs(base: Path, out: Path, count: int, size: int) -> Path:
    """``count`` blobs of ``size``+i zero bytes (each digest true) that nothing refers to."""
    h = hashlib.sha256()
    piece = bytes(4 * MIB)
    left = size
    while left:
        n = min(left, len(piece))
        h.update(piece[:n])
        left -= n
    bombs = []
    for i in range(count):
        d = h.copy()
        d.update(bytes(i))
        bombs.append(RawEntry(BLOB, d.hexdigest(), ZSTD, size + i, rle_frame(size + i)))
    return save([*iter_entries(base), *bombs], out)


def chunked_zeros(base: Path, out: Path, size: int, *, true_digest: bool) -> Path:
    """A file of ``size`` zero bytes (a multiple of 1 MiB), as a chunk list naming one zero
    MiB ``size / 1 MiB`` times. With ``true_digest`` False the list is named by a wrong
    whole-file digest (which only hashing every chunk could find out)."""
    chunk = run_digest(MIB)
    chunk_entry = RawEntry(BLOB, chunk.hex(), ZSTD, MIB, rle_frame(MIB))
    chunks = size // MIB
    listing = chunk * chunks
    whole = _repeat_digest(bytes(MIB), chunks) if true_digest else hashlib.sha256(b"no").digest()
    import zstandard

    cobj = zstandard.ZstdCompressor(level=3).compressobj(size=len(listing))
    frame = cobj.compress(listing) + cobj.flush()
    lst = RawEntry(CHUNKS, whole.hex(), ZSTD, len(listing), frame)
    entry = TreeEntry(b"zeros.bin", "f", 0o644, size, whole)
    return forge(base, out, root=[entry], added=[chunk_entry, lst])


def _repeat_digest(piece: bytes, times: int) -> bytes:
    h = hashlib.sha256()
    for _ in range(times):
        h.update(piece)
    return h.digest()


def wide_tree(base: Path, out: Path, count: int) -> Path:
    """One directory of ``count`` empty files (a single tree object)."""
    digest, blob = raw(BLOB, b"")
    entries = [TreeEntry(b"f%07d" % i, "f", 0o644, 0, digest) for i in range(count)]
    return forge(base, out, root=entries, added=[blob])


def fan_out(base: Path, out: Path, levels: int, names: int) -> Path:
    """A directory that names the level below under ``names`` names, ``levels`` deep: a few
    KiB that a restore would expand to ``names ** levels`` empty files."""
    digest, blob = raw(BLOB, b"")
    sub, sub_entry = tree([TreeEntry(b"f", "f", 0o644, 0, digest)])
    added = [blob, sub_entry]
    for _ in range(levels - 1):
        sub, sub_entry = tree([TreeEntry(b"n%d" % k, "d", 0o755, 0, sub) for k in range(names)])
        added.append(sub_entry)
    root = [TreeEntry(b"n%d" % k, "d", 0o755, 0, sub) for k in range(names)]
    return forge(base, out, root=root, added=added, files=names**levels, size=0)


def long_path(base: Path, out: Path, levels: int, name_len: int) -> Path:
    """``levels`` nested directories whose names are ``name_len`` characters long, a file at
    the bottom: every name is valid, the path is ``levels * (name_len + 1)`` bytes long."""
    digest, blob = raw(BLOB, b"x\n")
    sub, sub_entry = tree([TreeEntry(b"leaf.txt", "f", 0o644, 2, digest)])
    added = [blob, sub_entry]
    for i in range(levels - 1):
        name = (b"d%03d" % i).ljust(name_len, b"x")
        sub, sub_entry = tree([TreeEntry(name, "d", 0o755, 0, sub)])
        added.append(sub_entry)
    root = [TreeEntry(b"top".ljust(name_len, b"x"), "d", 0o755, 0, sub)]
    return forge(base, out, root=root, added=added, files=1, size=2)
