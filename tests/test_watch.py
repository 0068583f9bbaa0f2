"""Watch mode (inotify) must see every change a full scan sees, and skip what did not change."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

import stashpoint
from stashpoint.workspace.watch import watch_supported

pytestmark = pytest.mark.skipif(not watch_supported(), reason="inotify is Linux-only")


def _reference_tree(tmp_path: Path, ws: Path, i: int) -> str:
    """The tree a plain full scan (fresh store, no cache, no watcher) gives."""
    ref = stashpoint.open(tmp_path / f"ref{i}")
    cp = ref.session("r", workspace=ws).checkpoint()
    ref.close()
    shutil.rmtree(tmp_path / f"ref{i}")
    assert cp.workspace is not None
    return cp.workspace.tree


def _mutate(ws: Path, rng: random.Random, i: int) -> None:
    dirs = [p for p in ws.rglob("*") if p.is_dir() and ".stashpoint" not in p.parts]
    files = [p for p in ws.rglob("*") if p.is_file() and ".stashpoint" not in p.parts]
    op = rng.choice(
        ["edit", "edit", "create", "delete", "mkdir", "rmtree", "move", "chmod", "link"]
    )
    if op == "edit" and files:
        f = rng.choice(files)
        f.write_bytes(f.read_bytes()[:-1] + bytes([rng.randrange(97, 123)]))  # same size
    elif op == "create" and dirs:
        (rng.choice(dirs) / f"new{i}.txt").write_text(f"new {i}")
    elif op == "delete" and files:
        rng.choice(files).unlink()
    elif op == "mkdir" and dirs:
        d = rng.choice(dirs) / f"d{i}"
        d.mkdir()
        (d / "inner.txt").write_text("inner")
    elif op == "rmtree" and len(dirs) > 3:
        shutil.rmtree(rng.choice(dirs[1:]))
    elif op == "move" and len(dirs) > 3:
        src = rng.choice(dirs[1:])
        if src.exists():
            os.rename(src, ws / f"moved{i}")
    elif op == "chmod" and files:
        f = rng.choice(files)
        f.chmod(f.stat().st_mode ^ 0o100)
    elif op == "link" and dirs:
        os.symlink(f"target{i}", rng.choice(dirs) / f"link{i}")


def test_watch_mode_sees_everything_a_scan_sees(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for a in range(3):
        for b in range(3):
            d = ws / f"a{a}" / f"b{b}"
            d.mkdir(parents=True)
            for c in range(4):
                (d / f"f{c}.txt").write_text(f"{a}{b}{c}" * 20)
    store = stashpoint.open(tmp_path / "store")
    run = store.session("s", workspace=ws, watch=True)
    assert run.workspace is not None and run.workspace.watcher is not None
    rng = random.Random(7)
    for i in range(60):
        for _ in range(rng.randint(0, 3)):
            _mutate(ws, rng, i)
        cp = run.checkpoint()
        assert cp.workspace is not None
        assert cp.workspace.tree == _reference_tree(tmp_path, ws, i), f"step {i}"


def test_watch_mode_follows_ignore_rule_changes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "x.log").write_text("log")
    (ws / "sub" / "y.txt").write_text("txt")
    run = stashpoint.open(tmp_path / "store").session("s", workspace=ws, watch=True)
    run.checkpoint()
    (ws / ".gitignore").write_text("*.log\n")
    cp = run.checkpoint()
    assert cp.workspace is not None
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 0)
    assert cp.workspace.files == 2  # .gitignore and sub/y.txt


def test_watch_mode_reads_only_the_changed_directory(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for a in range(20):
        (ws / f"d{a}").mkdir(parents=True)
        for c in range(20):
            (ws / f"d{a}" / f"f{c}.txt").write_text(f"{a}-{c}")
    run = stashpoint.open(tmp_path / "store").session("s", workspace=ws, watch=True)
    run.checkpoint()
    workspace = run.workspace
    assert workspace is not None
    listed: list[bytes] = []
    real_scandir = os.scandir

    def spy(path: bytes) -> object:
        listed.append(path)
        return real_scandir(path)

    (ws / "d7" / "f3.txt").write_text("changed")
    os.scandir = spy  # type: ignore[assignment]
    try:
        cp = run.checkpoint()
    finally:
        os.scandir = real_scandir
    # d7's events name f3.txt: only that name is looked at, no directory is listed again
    assert listed == []
    assert cp.workspace is not None and cp.workspace.files == 400
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 1)


def test_an_unchanged_snapshot_in_watch_mode_keeps_its_counts(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f.txt").write_text("abc")
    run = stashpoint.open(tmp_path / "store").session("s", workspace=ws, watch=True)
    first = run.checkpoint()
    again = run.checkpoint()  # nothing changed: the whole tree is reused from the cache
    assert first.workspace is not None and again.workspace is not None
    assert (again.workspace.files, again.workspace.bytes) == (1, 3)
    assert again.workspace == first.workspace


def test_watch_mode_sees_writes_through_a_hard_link_outside_the_workspace(
    tmp_path: Path,
) -> None:
    """A write through another hard link names no watched path in any inotify event: such
    files are re-checked at every snapshot instead of being vouched for by events."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "shared.txt").write_text("v1")
    (ws / "plain.txt").write_text("plain")
    outside = tmp_path / "outside.txt"
    os.link(ws / "sub" / "shared.txt", outside)
    store = stashpoint.open(tmp_path / "store")
    run = store.session("w", workspace=ws, watch=True)
    first = run.checkpoint()
    run.checkpoint()  # a second, event-driven snapshot: the baseline watch mode relies on
    with open(outside, "r+b") as f:  # same inode, written in place, through the other link
        f.write(b"v2-longer")
    after = run.checkpoint()
    assert after.workspace is not None and first.workspace is not None
    assert after.workspace.tree != first.workspace.tree
    assert after.workspace.tree == _reference_tree(tmp_path, ws, 0)
    os.unlink(outside)  # back to one link: an ordinary, event-vouched file again
    (ws / "sub" / "shared.txt").write_text("v3")
    last = run.checkpoint()
    assert last.workspace is not None and last.workspace.tree == _reference_tree(tmp_path, ws, 1)
    store.close()


@pytest.mark.parametrize("watch", [False, True])
def test_a_chmod_of_a_subdirectory_alone_is_seen(tmp_path: Path, watch: bool) -> None:
    """A chmod changes a directory's ctime and mode, not its listing or its parent's: the
    parent's tree (which records the mode) must still be encoded again."""
    ws = tmp_path / "ws"
    (ws / "d" / "sub").mkdir(parents=True)
    (ws / "d" / "sub" / "f.txt").write_text("x")
    (ws / "d" / "g.txt").write_text("y")
    store = stashpoint.open(tmp_path / "store")
    session = store.session("s", workspace=ws, watch=watch)
    session.checkpoint()
    sub = ws / "d" / "sub"
    sub.chmod(sub.stat().st_mode ^ 0o020)
    cp = session.checkpoint()
    store.close()
    assert cp.workspace is not None
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 0)


def test_a_hard_link_made_in_another_directory_then_written_through(tmp_path: Path) -> None:
    """Linking ``b/h`` to ``a/f`` changes ``a/f``'s link count, which ``a``'s watch does not
    hear of; a write through ``b/h`` then names only ``b``. Watch mode must still see that
    ``a/f`` changed."""
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "b").mkdir()
    (ws / "a" / "f.txt").write_text("one\n")
    (ws / "b" / "other.txt").write_text("x\n")
    store = stashpoint.open(tmp_path / "store")
    session = store.session("s", workspace=ws, watch=True)
    session.checkpoint()
    os.link(ws / "a" / "f.txt", ws / "b" / "h.txt")
    session.checkpoint()
    (ws / "b" / "h.txt").write_text("two\n")  # same size, through the other name
    cp = session.checkpoint()
    store.close()
    assert cp.workspace is not None
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 0)


def test_a_queue_overflow_makes_the_next_snapshot_a_full_scan(tmp_path: Path) -> None:
    """Events the kernel dropped (its queue overflowed) are gone: the overflow event itself
    must make the next snapshot scan everything, which sees the change no event reported."""
    import struct

    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "f.txt").write_text("one\n")
    store = stashpoint.open(tmp_path / "store")
    session = store.session("s", workspace=ws, watch=True)
    first = session.checkpoint()
    watcher = session.workspace.watcher if session.workspace is not None else None
    assert watcher is not None
    (ws / "a" / "f.txt").write_text("two, longer\n")
    while True:  # the kernel "loses" the events: read and thrown away
        try:
            os.read(watcher.fd, 65536)
        except BlockingIOError:
            break
    unseen = session.checkpoint(skip_unchanged=True)
    assert unseen.id == first.id  # without an overflow event nothing says it changed
    watcher._parse(struct.pack("iIII", -1, 0x4000, 0, 0))  # IN_Q_OVERFLOW
    cp = session.checkpoint()
    store.close()
    assert cp.workspace is not None
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 0)


def test_an_ignore_file_that_ignores_itself_still_rules_in_watch_mode(tmp_path: Path) -> None:
    """A directory with events is not listed again when its stored tree vouches for it; an
    ignore file in no stored tree (it ignores itself) still decides below it."""
    ws = tmp_path / "ws"
    (ws / "a" / "sub").mkdir(parents=True)
    (ws / "a" / ".gitignore").write_text(".gitignore\n*.log\n")
    (ws / "a" / "keep.txt").write_text("keep")
    (ws / "a" / "sub" / "x.txt").write_text("x")
    run = stashpoint.open(tmp_path / "store").session("s", workspace=ws, watch=True)
    run.checkpoint()
    (ws / "a" / "new.txt").write_text("new")  # an event in a/
    (ws / "a" / "sub" / "z.log").write_text("ignored")
    cp = run.checkpoint()
    assert cp.workspace is not None
    assert cp.workspace.tree == _reference_tree(tmp_path, ws, 0)
    assert cp.workspace.files == 3  # keep.txt, new.txt, sub/x.txt


def test_watch_mode_names_each_kind_of_change_in_a_directory(tmp_path: Path) -> None:
    """Every change a directory's events name, without listing it: a file replaced by a
    directory and back, a symlink retargeted, a file moved in and one moved out, a
    deletion, a new subdirectory, a mode change, and an unchanged sibling kept as stored."""
    ws = tmp_path / "ws"
    d = ws / "d"
    (d / "sub").mkdir(parents=True)
    for name in ("f1", "f2", "f3", "f4", "f5", "same"):
        (d / name).write_text(name)
    (d / "sub" / "inner").write_text("inner")
    (ws / "elsewhere").write_text("moved in")
    os.symlink("f1", d / "link")
    run = stashpoint.open(tmp_path / "store").session("s", workspace=ws, watch=True)
    run.checkpoint()
    steps = [
        lambda: ((d / "f1").unlink(), (d / "f1").mkdir(), (d / "f1" / "x").write_text("x")),
        lambda: (os.unlink(d / "link"), os.symlink("f2", d / "link")),
        lambda: os.rename(ws / "elsewhere", d / "in"),
        lambda: os.rename(d / "f3", ws / "out"),
        lambda: (d / "f4").unlink(),
        lambda: ((d / "new").mkdir(), (d / "new" / "n").write_text("n")),
        lambda: (d / "f5").chmod(0o600),
        lambda: (shutil.rmtree(d / "f1"), (d / "f1").write_text("file again")),
        lambda: (shutil.rmtree(d / "sub"), (d / "sub").write_text("was a directory")),
    ]
    for i, step in enumerate(steps):
        step()
        cp = run.checkpoint()
        assert cp.workspace is not None
        assert cp.workspace.tree == _reference_tree(tmp_path, ws, i), f"step {i}"
