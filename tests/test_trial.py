"""Trials (``Session.trial``): keep, roll back, exceptions, nesting, and rollbacks that write
only what differs yet leave the workspace exactly equal to the target tree."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import stat
from pathlib import Path

import pytest

import stashpoint
from stashpoint.workspace import Workspace
from stashpoint.workspace.watch import watch_supported

IGNORED_DIR = "build"
NAMES = ["a", "b", "c", "d.txt", "e.py", "f"]
DIRS = ["", "x", "x/y", "z"]


class Boom(Exception):
    pass


def _ignored(rel: str) -> bool:
    return rel == IGNORED_DIR or rel.startswith(IGNORED_DIR + "/") or rel.endswith(".log")


def tracked(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path a snapshot holds, read independently of stashpoint: kind, mode, content."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if _ignored(rel):
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", st.st_mode & 0o7777)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("f", st.st_mode & 0o7777, digest)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return out


def same(root: Path, want: dict[str, tuple[object, ...]]) -> bool:
    """The workspace holds exactly ``want``, except directories a restore keeps because
    they hold ignored files (it never touches those)."""
    got = tracked(root)
    for rel in got.keys() - want.keys():
        holds_ignored = any(
            _ignored(p.relative_to(root).as_posix()) for p in (root / rel).rglob("*")
        )
        if got[rel][0] != "d" or not holds_ignored:
            return False
    return all(got.get(k) == v for k, v in want.items())


def ignored_files(root: Path) -> dict[str, bytes]:
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if _ignored(rel) and path.is_file() and not path.is_symlink():
            out[rel] = path.read_bytes()
    return out


def full_scan(run: stashpoint.Session) -> str:
    """The tree of the workspace by a scan with no stat cache and no watcher."""
    assert run.root is not None
    ws = Workspace(
        run.root,
        run.store.blobs,
        store_id="full-scan",
        epoch=run.store.blobs.meta.read_gc_epoch(),
        cache_dir=None,
    )
    result, _rows = ws.scan()
    return result.tree.hex()


def random_edit(root: Path, rng: random.Random) -> None:
    """One random change: a file written, deleted, renamed or chmodded, a symlink, a directory
    made or removed, a file replaced by a directory or the other way, or an ignored file."""
    d = rng.choice(DIRS)
    base = root / d if d else root
    path = base / rng.choice(NAMES)
    op = rng.choice(["write", "write", "write", "rm", "mv", "chmod", "link", "mkdir", "rmdir"])
    op = op if rng.random() > 0.1 else "ignored"
    base.mkdir(parents=True, exist_ok=True)
    if op == "ignored":
        where = root / IGNORED_DIR if rng.random() < 0.5 else base
        where.mkdir(exist_ok=True)
        (where / f"out{rng.randint(0, 3)}.log").write_bytes(rng.randbytes(rng.randint(0, 40)))
        return
    exists = path.exists() or path.is_symlink()
    if op == "write":
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # a directory becomes a file
        elif path.is_symlink():
            path.unlink()
        path.write_bytes(rng.randbytes(rng.choice([0, 3, 8, 8, 8, 100, 5000])))
    elif op == "rm" and exists:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    elif op == "mv" and exists:
        dest_dir = root / rng.choice(DIRS)
        dest = dest_dir / rng.choice(NAMES)
        free = dest_dir.is_dir() and not dest.exists() and not dest.is_symlink()
        into_itself = path.is_dir() and (dest == path or path in dest.parents)
        if free and not into_itself:
            path.rename(dest)
    elif op == "chmod" and exists and not path.is_symlink():
        path.chmod(rng.choice([0o600, 0o644, 0o755]) if path.is_file() else 0o755)
    elif op == "link":
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif exists:
            path.unlink()
        path.symlink_to(rng.choice(["d.txt", "../a", "x/y", "nowhere", "/etc/hostname"]))
    elif op == "mkdir":
        if exists and not (path.is_dir() and not path.is_symlink()):
            path.unlink()
        path.mkdir(exist_ok=True)
        (path / "inner").write_bytes(rng.randbytes(5))
    elif op == "rmdir" and d and base.is_dir() and not base.is_symlink():
        # (a directory holding ignored files is never removed by a restore either)
        holds_ignored = any(_ignored(p.relative_to(root).as_posix()) for p in base.rglob("*"))
        if not holds_ignored:
            shutil.rmtree(base)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "x" / "y").mkdir(parents=True)
    (ws / "z").mkdir()
    (ws / ".gitignore").write_text(f"{IGNORED_DIR}/\n*.log\n")
    (ws / IGNORED_DIR).mkdir()
    (ws / IGNORED_DIR / "cache.bin").write_bytes(b"ignored")
    for d in DIRS:
        for name in NAMES[:3]:
            (ws / d / name).write_bytes(f"{d}/{name}".encode())
    return ws


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "scan"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_trials_leave_exactly_the_target(tmp_path: Path, seed: int, watch: bool) -> None:
    if watch and not watch_supported():
        pytest.skip("no inotify here")
    rng = random.Random(seed)
    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("search", workspace=ws, watch=watch)
        root = run.checkpoint({"depth": 0}, message="root")
        nodes = {root.id: tracked(ws)}
        for i in range(40):
            node = rng.choice(sorted(nodes))
            how = rng.choice(["rollback", "rollback", "keep", "raise", "explicit"])
            reached: dict[str, tuple[object, ...]] = {}
            ignored: dict[str, bytes] = {}
            with contextlib.suppress(Boom), run.trial(node) as t:
                assert same(ws, nodes[node])  # entering went to the node
                assert t.base.id == node
                for _ in range(rng.randint(1, 8)):
                    random_edit(ws, rng)
                    if rng.random() < 0.15:
                        run.checkpoint({"depth": i}, message="inside the trial")
                reached, ignored = tracked(ws), ignored_files(ws)
                if how == "keep":
                    kept = t.keep({"depth": i})
                    nodes[kept.id] = reached
                elif how == "raise":
                    raise Boom
                elif how == "explicit":
                    t.rollback()
            if how == "keep":
                assert t.outcome == "kept"
                assert tracked(ws) == reached
                continue
            assert t.outcome == "rolled back"
            assert same(ws, nodes[node]), f"trial {i} ({how}) did not restore {node}"
            assert ignored_files(ws) == ignored, "a rollback touched ignored files"
            if tracked(ws).keys() == nodes[node].keys():
                assert full_scan(run) == run.get(node).workspace.tree  # type: ignore[union-attr]
            assert run.head is not None and run.head.id == node  # state went back too
            assert t.result is not None
            nodes[t.result.id] = reached  # what the trial reached is recorded: go back to it


def test_rollback_after_changes_the_watcher_missed(tmp_path: Path) -> None:
    """Events lost (the kernel's queue overflowed): the watcher cannot vouch for anything,
    so the safety checkpoint stats every file and the rollback is still exact."""
    if not watch_supported():
        pytest.skip("no inotify here")
    ws = _workspace(tmp_path)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("search", workspace=ws, watch=True)
        root = run.checkpoint(message="root")
        want = tracked(ws)
        with run.trial(root) as t:
            for n in range(limit // 2 + 10):  # a create and a close-after-write per file
                (ws / "z" / f"n{n}").write_bytes(b"")
            (ws / "x" / "a").write_bytes(b"changed while events were being lost")
            (ws / "x" / "y" / "b").unlink()
            assert run.workspace is not None and run.workspace.watcher is not None
            run.workspace.watcher.drain()
            assert run.workspace.watcher.everything  # it knows it lost events
            reached = tracked(ws)
        assert t.outcome == "rolled back"
        assert tracked(ws) == want
        assert run.get(t.result.id).workspace.files == sum(  # type: ignore[union-attr]
            1 for v in reached.values() if v[0] != "d"
        )


def test_keep_rollback_and_exception(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v1")
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws)
        base = run.checkpoint({"score": 0})
        with run.trial(base) as t:
            (ws / "app.py").write_text("v2")
            (ws / "new.py").write_text("new")
        assert t.outcome == "rolled back"
        assert (ws / "app.py").read_text() == "v1" and not (ws / "new.py").exists()
        assert run.head is not None and run.head.id == base.id
        assert t.result is not None and t.result.kind == "pre-rewind"
        assert run.get(t.result.id).workspace.tree != base.workspace.tree  # type: ignore[union-attr]

        with run.trial(base) as t:
            (ws / "app.py").write_text("v3")
            kept = t.keep({"score": 3}, message="better")
        assert t.outcome == "kept" and t.result == kept
        assert run.head is not None and run.head.id == kept.id
        assert (ws / "app.py").read_text() == "v3" and run.state() == {"score": 3}

        with pytest.raises(Boom), run.trial(base) as t:  # enters by rewinding to base
            assert (ws / "app.py").read_text() == "v1"
            (ws / "app.py").write_text("v4")
            raise Boom
        assert t.outcome == "rolled back"
        assert (ws / "app.py").read_text() == "v1" and run.state() == {"score": 0}

        with run.trial() as t:  # from where it is: nothing changed, so from the head
            assert t.base.id == base.id
            t.rollback()
            with pytest.raises(stashpoint.UsageError, match="rolled back"):
                t.keep()


def test_nested_trials_and_misuse(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("0")
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws)
        run.checkpoint()
        t = run.trial()
        with pytest.raises(stashpoint.UsageError, match="not started"):
            _ = t.base
        with t as outer:
            (ws / "f").write_text("1")
            with run.trial() as inner:  # from the outer trial's current state
                (ws / "f").write_text("2")
                with pytest.raises(stashpoint.UsageError, match="nested in it"):
                    outer.keep()
                with pytest.raises(stashpoint.UsageError, match="nested in it"):
                    outer.rollback()
            assert (ws / "f").read_text() == "1"  # the inner one rolled back to its base
            assert inner.outcome == "rolled back"
        assert (ws / "f").read_text() == "0"
        with pytest.raises(stashpoint.UsageError, match="entered once"), t:
            pass

        # Entered by hand and left in the wrong order: a clear error, not a silent rollback
        outer = run.trial().__enter__()
        inner = run.trial().__enter__()
        with pytest.raises(stashpoint.UsageError, match="nested in it"):
            outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)
        assert outer.outcome == inner.outcome == "rolled back"


def test_rollback_writes_only_inside_the_bound_workspace(tmp_path: Path) -> None:
    """A trial that replaced a directory with a symlink out of the workspace: rolling back
    makes the directory again and writes nothing through the link; and a trial from a
    checkpoint of another directory is refused before anything is written."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f").write_text("mine")
    outside.mkdir()
    (outside / "f").write_text("not yours")
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws, watch=True)
        base = run.checkpoint()
        with run.trial(base):
            shutil.rmtree(ws / "sub")
            (ws / "sub").symlink_to(outside)
        assert (ws / "sub").is_dir() and not (ws / "sub").is_symlink()
        assert (ws / "sub" / "f").read_text() == "mine"
        assert (outside / "f").read_text() == "not yours"
        assert sorted(p.name for p in outside.iterdir()) == ["f"]

        other = tmp_path / "other"
        other.mkdir()
        (other / "keep.txt").write_text("other project")
        elsewhere = store.session("s", workspace=other)
        with pytest.raises(stashpoint.RestoreRefused), elsewhere.trial(base):
            pass
        assert sorted(p.name for p in other.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "scan"])
def test_rollback_rewrites_only_what_changed(tmp_path: Path, watch: bool) -> None:
    """O(changed): every file the trial did not touch keeps its inode and mtime."""
    if watch and not watch_supported():
        pytest.skip("no inotify here")
    ws = tmp_path / "ws"
    for d in range(10):
        (ws / f"d{d}").mkdir(parents=True)
        for f in range(20):
            (ws / f"d{d}" / f"f{f}.txt").write_text(f"{d}/{f}\n")

    def stamps() -> dict[str, tuple[int, int]]:
        return {
            p.relative_to(ws).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in ws.rglob("*")
            if p.is_file()
        }

    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws, watch=watch)
        node = run.checkpoint()
        before = stamps()
        with run.trial(node):
            (ws / "d3" / "f1.txt").write_text("changed\n")
            (ws / "d7" / "f2.txt").unlink()
            (ws / "d7" / "new.txt").write_text("new\n")
        after = stamps()
        assert after.keys() == before.keys()
        rewritten = {k for k in before if after[k] != before[k]}
        assert rewritten == {"d3/f1.txt", "d7/f2.txt"}


def test_async_trial_keeps_rolls_back_and_rolls_back_on_cancel(tmp_path: Path) -> None:
    """``async with run.trial(node)``: the same outcomes as the sync trial, the store work in
    the session's queue; a block cancelled mid-way rolls its files back."""
    import asyncio

    import stashpoint.aio

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v1")

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s", workspace=ws)
            base = await run.checkpoint({"score": 0})
            async with run.trial(base) as t:
                (ws / "app.py").write_text("v2")
            assert t.outcome == "rolled back" and (ws / "app.py").read_text() == "v1"
            assert t.result is not None and t.result.kind == "pre-rewind"

            async with run.trial(base) as t:
                (ws / "app.py").write_text("v3")
                kept = await t.keep({"score": 3})
            assert t.outcome == "kept" and (await run.get_head()) == kept
            assert await run.state() == {"score": 3}

            started = asyncio.Event()

            async def search() -> None:
                async with run.trial(base):
                    (ws / "app.py").write_text("v4")
                    started.set()
                    await asyncio.sleep(60)

            task = asyncio.create_task(search())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (ws / "app.py").read_text() == "v1" and await run.state() == {"score": 0}
            head = await run.get_head()
            assert head is not None and head.id == base.id

    asyncio.run(main())
