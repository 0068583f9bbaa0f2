"""The first snapshot's scan: no cyclic GC while it runs, blob rows recorded with the
checkpoint."""

from __future__ import annotations

import gc
import random
from pathlib import Path
from typing import Any

import pytest

import stashpoint

from .conftest import assert_restores_from_empty


def _workspace(root: Path, files: int = 30) -> Path:
    for i in range(files):
        sub = root / f"d{i % 3}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}.txt").write_text(f"file {i}\n" * (i + 1))
    return root


@pytest.mark.parametrize("enabled", [True, False])
def test_the_scan_runs_without_cyclic_gc_and_gives_the_setting_back(
    tmp_path: Path, store: stashpoint.Store, enabled: bool
) -> None:
    ws = _workspace(tmp_path / "ws")
    during: list[bool] = []
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        run = store.session("s", workspace=ws)
        cp = run.checkpoint(progress=lambda _files, _bytes: during.append(gc.isenabled()))
        after = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert cp.workspace is not None and cp.workspace.files == 30
    assert during and not any(during)
    assert after is enabled


def test_a_failed_scan_gives_the_gc_setting_back(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = _workspace(tmp_path / "ws")

    def fail(files: int, _bytes: int) -> None:
        if files == 10:
            raise RuntimeError("interrupted")

    assert gc.isenabled()
    run = store.session("s", workspace=ws)
    with pytest.raises(RuntimeError, match="interrupted"):
        run.checkpoint(progress=fail)
    assert gc.isenabled()
    assert run.head is None  # nothing recorded


def test_a_large_first_snapshot_records_its_blob_rows_with_the_checkpoint(
    tmp_path: Path, store: stashpoint.Store, monkeypatch: Any
) -> None:
    """Many more small files than one pack holds (32 MiB; 2 MiB here) go into several
    packs, written and fsynced by writer threads while the scan reads on; their rows are not
    committed one transaction (and one fsync of the scanning thread) per pack, but with the
    checkpoint. It restores exactly."""
    from stashpoint.blobs import objects
    from stashpoint.verify import verify_store

    monkeypatch.setattr(objects, "_FLUSH_BYTES", 2 << 20)
    ws = tmp_path / "ws"
    rng = random.Random(11)
    words = [f"word{i}".encode() for i in range(500)]
    for d in range(30):
        sub = ws / f"d{d:02}"
        sub.mkdir(parents=True)
        for f in range(40):
            lines = [b" ".join(rng.choices(words, k=12)) for _ in range(50)]
            (sub / f"f{f}.txt").write_bytes(b"\n".join(lines))  # ~4.5 KB each, ~5.5 MB in all
    meta = store.blobs.meta
    sent: list[int] = []
    real = meta.put_blobs
    monkeypatch.setattr(meta, "put_blobs", lambda rows: (sent.append(len(rows)), real(rows)))
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    assert cp.workspace is not None and cp.workspace.files == 1200
    assert sent == []  # (none before the commit)
    assert store.home is not None
    assert len(list((store.home / "blobs" / "packs").glob("*.pack"))) >= 2
    assert verify_store(store).ok
    assert_restores_from_empty(run, cp.id, ws)


def test_a_large_files_digests_are_those_of_its_content(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """A large file's pieces are hashed on another thread while the scan reads on: the
    file's digest and its chunk list are still those of its content, in order, a repeated
    chunk is stored once, and it restores exactly."""
    import hashlib

    from stashpoint.blobs.objects import CHUNK_SIZE, BlobCodec
    from stashpoint.workspace.tree import TreeReader

    rng = random.Random(4)
    a, b = rng.randbytes(CHUNK_SIZE), rng.randbytes(CHUNK_SIZE)
    content = a + b + a + rng.randbytes(CHUNK_SIZE * 9) + a + b"tail"  # 13 pieces
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(content)
    (ws / "small.txt").write_bytes(b"small\n")
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    assert cp.workspace is not None
    entry = TreeReader(store.blobs).load(bytes.fromhex(cp.workspace.tree))[b"big.bin"]
    assert entry.ref == hashlib.sha256(content).digest() and entry.size == len(content)
    row = store.blobs.meta.get_blob(entry.ref)
    assert row is not None and row.codec == BlobCodec.CHUNKS
    pieces = [content[i : i + CHUNK_SIZE] for i in range(0, len(content), CHUNK_SIZE)]
    assert row.data == b"".join(hashlib.sha256(p).digest() for p in pieces)
    assert store.blobs.read(entry.ref) == content
    assert store.home is not None
    assert (
        len([p for p in (store.home / "blobs").rglob("*") if p.is_file() and len(p.name) == 64])
        == 12
    )
    (ws / "big.bin").unlink()
    run.rewind(cp.id)
    assert (ws / "big.bin").read_bytes() == content


def test_what_the_pause_allocated_goes_to_the_oldest_generation_untraversed() -> None:
    """The young collection that used to follow a scan traversed every object it kept (a
    stat cache entry and a blob row per file, none garbage): they are promoted instead."""
    from stashpoint.workspace.scan import gc_paused

    assert gc.isenabled()
    gc.collect()  # counts at zero: no collection may run between the pause and the check
    with gc_paused():
        kept = [[i] for i in range(100)]
    assert gc.isenabled()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(kept) in oldest and all(id(x) in oldest for x in kept)
    assert gc.get_freeze_count() == 0  # (promoted, not left frozen)


def test_the_pause_leaves_objects_the_program_froze_alone() -> None:
    """A program that froze its objects (before a fork: their pages stay shared) keeps them
    frozen across a scan: unfreezing to promote would undo that."""
    from stashpoint.workspace.scan import gc_paused

    gc.collect()
    frozen = [[i] for i in range(10)]
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with gc_paused():
            young = [1, 2]
        assert gc.get_freeze_count() == count
        assert id(frozen) not in {id(o) for o in gc.get_objects()}
        assert young
    finally:
        gc.unfreeze()
