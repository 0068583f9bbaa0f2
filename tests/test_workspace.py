"""Workspace scanning and restoring: ignore rules, exclusions and hostile trees."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import IntegrityError
from stashpoint.model import TreeEntry
from stashpoint.stores.base import BlobRow
from stashpoint.workspace.scan import encode_tree
from stashpoint.workspace.statcache import WHOLE_SECOND_RACY_WINDOW_NS

from .conftest import assert_restores_from_empty, snapshot_tree


def _paths(store: stashpoint.Store, cp: stashpoint.Checkpoint) -> set[str]:
    from stashpoint.workspace.tree import TreeReader

    assert cp.workspace is not None
    reader = TreeReader(store.blobs)
    return {os.fsdecode(p) for p, _e in reader.walk(bytes.fromhex(cp.workspace.tree))}


def test_ignore_rules_nested_negation_and_always_excluded(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    ws = tmp_path / "ws"
    (ws / "logs").mkdir(parents=True)
    (ws / ".gitignore").write_text("*.log\nbuild/\n")
    (ws / "logs" / ".gitignore").write_text("!keep.log\n")
    (ws / "logs" / "keep.log").write_text("k")
    (ws / "logs" / "drop.log").write_text("d")
    (ws / "build").mkdir()
    (ws / "build" / "out.o").write_text("o")
    (ws / ".stashpointignore").write_text("secret.txt\n")
    (ws / "secret.txt").write_text("s")
    (ws / "sub" / "nested" / ".git").mkdir(parents=True)
    (ws / "sub" / "nested" / ".git" / "HEAD").write_text("ref")
    (ws / "sub" / "nested" / "code.py").write_text("c")
    cp = store.session("s", workspace=ws).checkpoint()
    assert _paths(store, cp) == {
        ".gitignore",
        ".stashpointignore",
        "logs",
        "logs/.gitignore",
        "logs/keep.log",
        "sub",
        "sub/nested",
        "sub/nested/code.py",
    }


def test_rewind_never_touches_ignored_paths(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".gitignore").write_text("*.tmp\n")
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    (ws / "d").mkdir()
    (ws / "d" / "tracked.txt").write_text("t")
    (ws / "d" / "scratch.tmp").write_text("keep me")
    (ws / "top.tmp").write_text("keep me too")
    run.checkpoint()
    run.rewind(cp.id)
    assert not (ws / "d" / "tracked.txt").exists()
    assert (ws / "d" / "scratch.tmp").read_text() == "keep me"  # dir kept for the ignored file
    assert (ws / "top.tmp").read_text() == "keep me too"


def test_changes_are_seen_on_every_snapshot(tmp_path: Path, store: stashpoint.Store) -> None:
    """The stat cache and tree reuse never hide a change, however quick."""
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    f = ws / "a" / "b" / "f.txt"
    run = store.session("s", workspace=ws)
    for i in range(30):
        f.write_text(f"version {i:03d}")  # same size every time, often within one tick
        if i % 3 == 0:
            (ws / "a" / f"n{i}").write_text("x")
        if i % 5 == 0 and (ws / "a" / f"n{i - 3}").exists():
            (ws / "a" / f"n{i - 3}").unlink()
        before = snapshot_tree(ws)
        cp = run.checkpoint()
        out = tmp_path / f"check{i}"
        run.fork(cp.id, f"b{i}", into=out)
        after = snapshot_tree(out)
        after.pop(".stashpoint", None)
        assert after == before, f"snapshot {i} missed a change"


def test_hostile_tree_is_refused_before_writing(tmp_path: Path, store: stashpoint.Store) -> None:
    target, outside = tmp_path / "target", tmp_path / "evil"
    target.mkdir()
    payload = b"pwned"
    blob = hashlib.sha256(payload).digest()
    for name in (b"../evil", b"..", b"a/b", b""):
        tree = encode_tree([TreeEntry(name, "f", 0o644, len(payload), blob)])
        digest = hashlib.sha256(tree).digest()
        store.meta.put_blobs(
            [BlobRow(blob, 0, len(payload), payload), BlobRow(digest, 0, len(tree), tree)]
        )
        ws = store.session("s", workspace=target).workspace
        assert ws is not None
        with pytest.raises(IntegrityError):
            ws.restore(None, digest)
    assert not outside.exists() and list(target.iterdir()) == []


def test_corrupt_blob_fails_restore_cleanly(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("original content " * 10)
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    digest = hashlib.sha256(("original content " * 10).encode()).digest()
    row = store.meta.get_blob(digest)
    assert row is not None
    import sqlite3

    assert store.home is not None
    db = sqlite3.connect(store.home / "store.db")
    db.execute("UPDATE blobs SET data=? WHERE digest=?", (row.data[:-1] + b"X", digest))
    db.commit()
    (ws / "f.txt").write_text("newer work")
    with pytest.raises((IntegrityError, stashpoint.StashpointError)):
        stashpoint.open(store.home).session("s", workspace=ws).rewind(cp.id)
    assert (ws / "f.txt").read_text() == "newer work"
    assert [p.name for p in ws.iterdir()] == ["f.txt"], "no temp files left behind"


def test_a_racy_file_is_re_read_but_not_stored_again(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """A file written moments before a snapshot is "racy" (its stat could hide an edit made
    in the same timestamp tick), so the next snapshot reads it again. Content that still
    hashes to the cached digest is already stored: nothing is queued, compressed or sent."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("just written\n")
    # "Just written" however late the snapshot runs on a loaded machine: a stamp ahead of
    # the clock stays racy (a stamp 1 us ahead fell out of the window when the scan started
    # a tick later). Never a whole second.
    now = time.time_ns() + 60 * 10**9 + 1_000
    os.utime(ws / "notes.txt", ns=(now, now))
    run = store.session("s", workspace=ws)
    first = run.checkpoint()
    assert run.workspace is not None
    result, pending = run.workspace.scan()
    assert result.read_files == 1  # re-read: its cache entry was racy
    assert pending == []  # same content: nothing to store
    assert result.tree.hex() == first.workspace.tree  # type: ignore[union-attr]
    (ws / "notes.txt").write_text("edited again\n")  # same size or not, a change is stored
    result, pending = run.workspace.scan()
    assert result.read_files == 1 and len(pending) >= 2  # the new content and its tree


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's file clock")
def test_a_file_stamped_before_the_kernels_current_tick_is_trusted(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """On Linux the racy window is the kernel's own file clock: a file stamped before its
    current tick cannot be rewritten with the same stamp, so after one read it comes from the
    stat cache, even 2 ms after the write (a fixed 20 ms window re-read it, and every file an
    agent checkpointing every few ms rewrote). One stamped within the tick is read again."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old, new = ws / "old.txt", ws / "new.txt"
    old.write_text("old\n")
    new.write_text("new\n")
    coarse = time.clock_gettime_ns(5)  # CLOCK_REALTIME_COARSE
    stamp = coarse - 2_000_000  # 2 ms before the current tick began
    stamp += 1 if stamp % 10**9 == 0 else 0  # a nanosecond mtime, not a whole second
    os.utime(old, ns=(stamp, stamp))
    ahead = time.time_ns() + 60 * 10**9 + 1_000  # within the tick however late the scan runs
    os.utime(new, ns=(ahead, ahead))
    run = store.session("s", workspace=ws)
    run.checkpoint()
    assert run.workspace is not None
    result, _ = run.workspace.scan()
    assert result.read_files == 1  # new.txt only


def test_a_large_file_stays_racy_while_one_write_could_still_be_copying_it(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """One ``write()`` stamps a file's times before it copies the bytes: a scan 30 ms later
    may read a large file half-written, with times that no longer change. So the window
    grows with the size: the large file is read again at the next scan, the small one with
    the same mtime is trusted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    big, small = ws / "big.bin", ws / "small.txt"
    with open(big, "wb") as f:
        f.truncate(32 << 20)  # sparse: cheap to write and read, 32 MiB by its stat
    small.write_text("small\n")
    ago = time.time_ns() - 30_000_000
    ago += 1 if ago % 10**9 == 0 else 0  # a nanosecond mtime, not a whole second
    for p in (big, small):
        os.utime(p, ns=(ago, ago))
    run = store.session("s", workspace=ws)
    run.checkpoint()
    assert run.workspace is not None
    result, _ = run.workspace.scan()
    assert result.read_files == 1  # big.bin again: 32 MiB keeps it racy for ~0.35 s
    assert result.read_bytes == 32 << 20


def test_a_whole_second_mtime_is_racy_for_seconds(tmp_path: Path, store: stashpoint.Store) -> None:
    """On a filesystem that keeps whole seconds (ext3, HFS+, FAT), an edit in the same second
    as the scan leaves the stat as it was: such a file stays racy for seconds, not one tick,
    while a nanosecond mtime as old is trusted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    coarse, fine = ws / "coarse.txt", ws / "fine.txt"
    coarse.write_text("a\n")
    fine.write_text("b\n")
    second = time.time_ns() // 10**9 * 10**9  # this second, as a 1 s filesystem stamps it
    os.utime(coarse, ns=(second, second))
    half = time.time_ns() - 500_000_001  # half a second ago: old for a nanosecond clock
    os.utime(fine, ns=(half, half))
    run = store.session("s", workspace=ws)
    run.checkpoint()
    assert run.workspace is not None
    result, _ = run.workspace.scan()
    assert result.read_files == 1  # coarse.txt again; fine.txt came from the stat cache
    assert time.time_ns() - second < WHOLE_SECOND_RACY_WINDOW_NS  # (still within its window)
    before = time.time_ns() - WHOLE_SECOND_RACY_WINDOW_NS - 10**9
    old_second = before // 10**9 * 10**9
    os.utime(coarse, ns=(old_second, old_second))  # long enough ago: trusted after one read
    run.workspace.scan()
    run.workspace.save_cache()
    result, _ = run.workspace.scan()
    assert result.read_files == 0


def test_write_parts_resumes_partial_writes(tmp_path: Path, monkeypatch: Any) -> None:
    """``writev`` may write less than asked (a signal, a pipe, a network filesystem): every
    byte must still land once, in order, including a part cut in the middle."""
    from stashpoint import _fsutil

    real = os.writev
    calls = []

    def stingy(fd: int, buffers: Any) -> int:
        calls.append(len(buffers))
        flat = b"".join(bytes(b) for b in buffers)
        return real(fd, [flat[:5]])  # at most 5 bytes per call

    monkeypatch.setattr(os, "writev", stingy)
    parts = [b"abc", b"", b"defghij", b"k" * 13, b"lm"]
    _fsutil.atomic_write(tmp_path / "out", parts, durable=False)
    assert (tmp_path / "out").read_bytes() == b"".join(parts)
    assert len(calls) == 5  # 25 bytes, 5 at a time


def test_a_snapshot_larger_than_a_flush_streams_through_packs_written_alongside(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """More than 32 MB of small files: earlier packs are written by a worker thread while the
    scan goes on, and their rows are recorded only once they are durable. Every file must
    come back, verify must pass, and there is more than one pack."""
    import random

    from stashpoint.verify import verify_store

    ws = tmp_path / "ws"
    rng = random.Random(7)
    for d in range(40):
        sub = ws / f"d{d:02}"
        sub.mkdir(parents=True)
        for f in range(25):
            (sub / f"f{f}.bin").write_bytes(rng.randbytes(40_000))  # incompressible: 40 MB
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    assert cp.workspace is not None and cp.workspace.files == 1000
    assert store.home is not None
    packs = list((store.home / "blobs" / "packs").glob("*.pack"))
    assert len(packs) >= 2
    assert verify_store(store).ok
    assert_restores_from_empty(run, cp.id, ws)


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-url", "file"])
def test_every_directory_and_file_a_store_creates_is_private(tmp_path: Path, kind: str) -> None:
    """SPEC 5: store files 0600, and no directory of the store readable by others either
    (blob fan-out directories were created 0755 by ``mkdir(parents=True)``)."""
    import stat as stat_mod

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "big.bin").write_bytes(os.urandom((1 << 20) + 10))  # chunk files
    (ws / "small.txt").write_text("x\n")
    home = tmp_path / "store"
    url = {
        "sqlite": str(home),
        "sqlite-url": f"sqlite:///{home}/deeper/store.db",  # directories it must create
        "file": f"file://{home}",
    }[kind]
    umask = os.umask(0o022)  # the usual one: what mkdir would otherwise leave 0755
    try:
        with stashpoint.open(url) as store:
            store.session("s", workspace=ws).checkpoint({"k": 1})
    finally:
        os.umask(umask)
    paths = [home, *home.rglob("*")]
    assert any(p.is_dir() and p.parent != home for p in paths[1:])  # fan-out levels exist
    loose = {
        str(p.relative_to(home)): oct(p.lstat().st_mode & 0o777)
        for p in paths
        if p.lstat().st_mode & 0o077 and not stat_mod.S_ISLNK(p.lstat().st_mode)
    }
    assert loose == {}


def test_a_rewind_reads_packed_files_in_one_batch_and_still_checks_them(
    tmp_path: Path, store: stashpoint.Store, monkeypatch: Any
) -> None:
    """A rewind of many small packed files fetches their rows in one query and opens each
    pack once (not once per file); the content is still checked against its digest, and a
    damaged entry stops the rewind before it writes anything."""
    import random

    from stashpoint.blobs.local import LocalBlobStore

    ws = tmp_path / "ws"
    rng = random.Random(3)
    for i in range(300):  # > 1 MB of small files: the first snapshot packs them
        (ws / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (ws / f"d{i % 10}" / f"f{i}.bin").write_bytes(rng.randbytes(4000))
    run = store.session("s", workspace=ws)
    base = run.checkpoint()
    before = snapshot_tree(ws)
    for i in range(0, 300, 3):
        (ws / f"d{i % 10}" / f"f{i}.bin").write_bytes(b"changed")
    one_by_one: list[str] = []
    real = LocalBlobStore.read_packed

    def counting(self: Any, name: str, offset: int, length: int) -> bytes:
        one_by_one.append(name)
        return real(self, name, offset, length)

    monkeypatch.setattr(LocalBlobStore, "read_packed", counting)
    run.rewind(base.id)
    assert snapshot_tree(ws) == before
    assert one_by_one == []  # every packed file came from the batch
    monkeypatch.undo()

    assert store.home is not None
    (pack,) = (store.home / "blobs" / "packs").glob("*.pack")
    data = bytearray(pack.read_bytes())
    for at in range(len(data) // 3, len(data), 997):  # damage in every later entry
        data[at] ^= 0xFF
    pack.chmod(0o600)
    pack.write_bytes(bytes(data))
    for i in range(0, 300, 3):
        (ws / f"d{i % 10}" / f"f{i}.bin").write_bytes(b"changed again")
    edited = snapshot_tree(ws)
    with pytest.raises((IntegrityError, stashpoint.StashpointError)):
        store.session("s", workspace=ws).rewind(base.id)
    assert snapshot_tree(ws) == edited  # nothing was written


def test_a_stat_cache_directory_removed_under_a_running_process_is_made_again(
    tmp_path: Path,
) -> None:
    """The writer thread never re-creates a removed directory itself (that could resurrect a
    deleted store), but the next save does, while the store directory above it exists."""
    from stashpoint.workspace import statcache

    path = tmp_path / "store" / "cache" / "stat.bin"
    path.parent.parent.mkdir()
    cache = statcache.StatCache("store", "0", str(tmp_path))
    cache.files = {b"f": (1, 1, 1, 1, 0o100644, b"d" * 32)}
    statcache.save_later(path, cache)
    statcache.flush_saves(5.0)
    assert path.exists()
    shutil.rmtree(path.parent)
    statcache.save_later(path, cache)  # made before the removal: the thread's write fails
    statcache.flush_saves(5.0)
    assert not path.parent.exists()
    statcache.save_later(path, cache)  # this save makes the directory again
    statcache.flush_saves(5.0)
    assert path.exists(), "the cache is written again, not silently lost for good"
    shutil.rmtree(tmp_path / "store")
    statcache.save_later(path, cache)
    statcache.flush_saves(5.0)
    assert not (tmp_path / "store").exists(), "a removed store is not resurrected"


def test_stat_cache_saves_in_a_burst_are_written_once_and_flushed_on_demand(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Caches saved back to back (an agent checkpointing in a burst) are written once, the
    newest; ``flush_saves`` (also run at exit) writes at once instead of waiting for quiet."""
    from stashpoint.workspace import statcache

    writes: list[int] = []
    real = statcache.StatCache.save
    path = tmp_path / "cache" / "stat.bin"

    def counting(self: Any, to: Path, **kw: Any) -> None:
        if to == path:  # (another test's store may still be flushing its own cache)
            writes.append(len(self.files))
        real(self, to, **kw)

    monkeypatch.setattr(statcache.StatCache, "save", counting)
    for n in (1, 2, 3):
        cache = statcache.StatCache("store", "0", str(tmp_path))
        cache.files = {f"f{i}".encode(): (1, 1, 1, 1, 0o100644, b"d" * 32) for i in range(n)}
        statcache.save_later(path, cache)
    statcache.flush_saves(5.0)
    assert writes == [3]
    loaded = statcache.StatCache.load(path, "store", "0", str(tmp_path))
    assert len(loaded.files) == 3


def test_a_mode_restored_on_a_hard_linked_file_leaves_the_other_link_alone(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """A workspace file hard-linked to one outside the workspace shares its inode: restoring
    only its mode must replace the workspace's file, not chmod the shared inode."""
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("shared\n")
    os.chmod(outside, 0o644)
    os.link(outside, ws / "f.txt")
    run = store.session("s", workspace=ws)
    a = run.checkpoint()
    os.chmod(ws / "f.txt", 0o600)  # the shared inode: outside.txt is 0600 now too
    run.checkpoint()
    run.rewind(a.id)
    assert (ws / "f.txt").stat().st_mode & 0o777 == 0o644
    assert (ws / "f.txt").read_text() == "shared\n"
    assert outside.stat().st_mode & 0o777 == 0o600  # not the restore's to change


def test_a_replaced_file_is_exchanged_for_its_new_content_and_the_old_one_freed(
    tmp_path: Path, store: stashpoint.Store, monkeypatch: Any
) -> None:
    """A file the restore rewrites is exchanged with its new content (where the system can):
    no temp file is left, a hard link elsewhere keeps the old content, and one failure the
    file system gives for "cannot exchange" sends the rest of the restore to plain renames."""
    from stashpoint.workspace import restore

    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text(f"{name} v1\n")
    outside = tmp_path / "outside.txt"
    os.link(ws / "a.txt", outside)
    run = store.session("s", workspace=ws)
    first = run.checkpoint()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).unlink()  # (a.txt: outside.txt keeps v1)
        (ws / name).write_text(f"{name} v2\n")
    run.checkpoint()
    calls: list[bytes] = []
    real = restore._exchange

    def counting(dfd: int, a: bytes, b: bytes) -> int:
        calls.append(b)
        return real(dfd, a, b)

    monkeypatch.setattr(restore, "_exchange", counting)
    run.rewind(first.id)
    assert {p.name: p.read_text() for p in ws.iterdir()} == {
        n: f"{n} v1\n" for n in ("a.txt", "b.txt", "c.txt")
    }
    assert outside.read_text() == "a.txt v1\n"
    assert len(calls) == (3 if sys.platform.startswith("linux") else 0)
    # A file system that cannot exchange: asked once, then renamed over.
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text(f"{name} v3\n")
    run.checkpoint()
    calls.clear()
    monkeypatch.setattr(restore, "_exchange", lambda dfd, a, b: calls.append(b) or 22)  # EINVAL
    run.rewind(first.id)
    assert {p.name: p.read_text() for p in ws.iterdir()} == {
        n: f"{n} v1\n" for n in ("a.txt", "b.txt", "c.txt")
    }
    assert len(calls) == (1 if sys.platform.startswith("linux") else 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_a_directory_put_where_a_file_is_being_restored_is_left_in_place(
    tmp_path: Path, store: stashpoint.Store, monkeypatch: Any
) -> None:
    """A directory made where the restore is about to replace a file would be exchanged
    into the temp name: it is exchanged back, and the restore fails as a rename over a
    directory fails, never removing what is in it."""
    from stashpoint.errors import StashpointError
    from stashpoint.workspace import restore

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("v1\n")
    run = store.session("s", workspace=ws)
    first = run.checkpoint()
    (ws / "f.txt").write_text("v2, longer\n")
    run.checkpoint()
    real = restore._exchange
    calls: list[bytes] = []

    def intruder(dfd: int, a: bytes, b: bytes) -> int:
        calls.append(b)
        if len(calls) == 1:  # (not the exchange back)
            (ws / "f.txt").unlink()
            (ws / "f.txt").mkdir()
            (ws / "f.txt" / "theirs").write_text("keep me\n")
        return real(dfd, a, b)

    monkeypatch.setattr(restore, "_exchange", intruder)
    with pytest.raises(StashpointError, match=r"f\.txt"):
        run.rewind(first.id)
    assert (ws / "f.txt" / "theirs").read_text() == "keep me\n"
    assert [p.name for p in ws.iterdir()] == ["f.txt"]  # no temp file left
    assert len(calls) == 2


def test_a_snapshot_names_what_it_left_out_and_points_at_its_caller(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    """A FIFO (or socket, device) is no file to snapshot: it is left out, and the warning
    names it and is attributed to the line that asked for the checkpoint."""
    import warnings

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    os.mkfifo(ws / "pipe")
    run = store.session("s", workspace=ws)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cp = run.checkpoint()
    [w] = [w for w in caught if "left out" in str(w.message)]
    assert "left out 1 path(s) that are neither file, directory nor symlink" in str(w.message)
    assert "pipe" in str(w.message)
    assert w.filename == __file__
    assert cp.workspace is not None and cp.workspace.files == 1
