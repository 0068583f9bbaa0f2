"""Another filesystem mounted inside the workspace is not the workspace's: a snapshot does not
descend into it and a rewind leaves it in place (as ``tar --one-file-system`` or ``rsync -x``).

Before, a bind mount at ``ws/mp/m`` of a directory outside the project went into snapshots; a
rewind to a checkpoint taken before it existed deleted the mounted directory's files (outside
the project), chmod-ed it, then failed with EBUSY, leaving an unfinished restore.

These tests mount for real (bind mounts and tmpfs; the test runs as root) and skip, with the
reason, where mounting is not permitted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import stashpoint
from stashpoint.workspace import restore as restore_mod
from stashpoint.workspace import scan as scan_mod
from stashpoint.workspace.mounts import mount_points
from stashpoint.workspace.restore import clean_temp_files
from stashpoint.workspace.watch import watch_supported

from .conftest import Result, snapshot_tree

Sp = Callable[..., Result]


@contextmanager
def mounted(target: Path, source: Path | None = None) -> Iterator[None]:
    """``source`` bind-mounted at ``target``, or a small tmpfs there (``source`` None)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    if source is not None:
        cmd = ["mount", "--bind", str(source), str(target)]
    else:
        cmd = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(target)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting is not permitted here: {done.stderr.strip()}")
    try:
        yield
    finally:
        if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], capture_output=True)


def files_in(sp: Sp, ws: Path, ref: str = "HEAD") -> list[str]:
    out = json.loads(sp("show", ref, "--files", "--json", cwd=ws).out)
    return sorted(e["path"] for e in out["manifest"]["entries"])


@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_a_rewind_leaves_a_mount_in_the_workspace_and_its_files_alone(
    tmp_path: Path, sp: Sp, kind: str
) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "a.txt").write_text("a\n")
    sp("snap", "-m", "one", "-l", "one", cwd=ws)
    (ws / "mp" / "m").mkdir(parents=True)
    with mounted(ws / "mp" / "m", outside if kind == "bind" else None):
        (ws / "mp" / "m" / "keep.txt").write_text("not the project's\n")
        os.chmod(ws / "mp" / "m", 0o755)
        (ws / "b.txt").write_text("b\n")
        res = sp("snap", "-m", "two", cwd=ws)
        assert files_in(sp, ws) == ["a.txt", "b.txt", "mp"]  # mp/m/* is not in it
        assert "mount point" in res.err and "mp/m" in res.err, res

        res = sp("rewind", "one", cwd=ws)
        assert not (ws / "b.txt").exists()
        assert (ws / "mp" / "m" / "keep.txt").read_text() == "not the project's\n"
        assert (ws / "mp" / "m").stat().st_mode & 0o777 == 0o755  # not chmod-ed either
        assert os.path.ismount(ws / "mp" / "m") or kind == "bind"
        assert json.loads(sp("show", "HEAD", "--json", cwd=ws).out)["label"] == "one"
        sp("rewind", "one", cwd=ws)  # and again: nothing is left unfinished
    if kind == "bind":
        assert (outside / "keep.txt").read_text() == "not the project's\n"
    # Unmounted, the directory under it is the workspace's again (no event, no stat change).
    sp("snap", "-m", "three", cwd=ws)
    assert files_in(sp, ws) == ["a.txt", "mp", "mp/m"]


def test_a_checkpoint_that_had_files_where_a_mount_now_is_does_not_write_into_it(
    tmp_path: Path, sp: Sp
) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "data").mkdir(parents=True)
    outside.mkdir()
    (ws / "data" / "old.txt").write_text("from the checkpoint\n")
    sp("snap", "-l", "plain", cwd=ws)
    (outside / "theirs.txt").write_text("theirs\n")
    before = snapshot_tree(outside)
    with mounted(ws / "data", outside):
        (ws / "new.txt").write_text("new\n")
        res = sp("rewind", "plain", cwd=ws)
        assert snapshot_tree(outside) == before  # no old.txt written into the mount
        assert not (ws / "new.txt").exists()  # the rest of the workspace was restored
        assert "left 1 mount point(s)" in res.err and "data" in res.err, res
    assert (ws / "data" / "old.txt").read_text() == "from the checkpoint\n"  # (under it)


def test_without_a_mount_table_another_device_is_still_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no mount table can be read, a directory on another device than the workspace
    root is a mount point: not scanned, and not entered, written or chmod-ed by a restore."""
    monkeypatch.setattr(scan_mod, "mount_points", lambda root: frozenset())
    monkeypatch.setattr(restore_mod, "mount_points", lambda root: frozenset())
    ws = tmp_path / "ws"
    (ws / "t").mkdir(parents=True)
    (ws / "t" / "old.txt").write_text("old\n")
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws)
        plain = run.checkpoint()
        with mounted(ws / "t"):
            os.chmod(ws / "t", 0o750)
            (ws / "t" / "tmp.txt").write_text("on the tmpfs\n")
            with pytest.warns(UserWarning, match="mount point"):
                cp = run.checkpoint()
            assert cp.workspace is not None and cp.workspace.files == 0
            with pytest.warns(UserWarning) as caught:
                run.rewind(plain.id)
            assert any("left 1 mount point(s)" in str(w.message) for w in caught), caught
            assert sorted(os.listdir(ws / "t")) == ["tmp.txt"]
            assert (ws / "t").stat().st_mode & 0o777 == 0o750
            # The check after a crash-completed restore accepts what the mount shows.
            assert run.workspace is not None and plain.workspace is not None
            run.workspace.verify_equals(bytes.fromhex(plain.workspace.tree))


@pytest.mark.skipif(not watch_supported(), reason="inotify is Linux-only")
@pytest.mark.filterwarnings("ignore::stashpoint.errors.StashpointWarning")  # (checked above)
def test_watch_mode_sees_a_mount_come_and_go_as_a_full_scan_does(tmp_path: Path) -> None:
    """Mounting makes no inotify event in the directory above: a watched snapshot must still
    equal a full scan, before, during and after the mount."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "mp" / "m").mkdir(parents=True)
    (ws / "mp" / "m" / "under.txt").write_text("under the mount\n")
    outside.mkdir()
    (outside / "o.txt").write_text("outside\n")

    def full_scan(i: int) -> str:
        with stashpoint.open(tmp_path / f"ref{i}") as ref:
            cp = ref.session("r", workspace=ws).checkpoint()
        shutil.rmtree(tmp_path / f"ref{i}")
        assert cp.workspace is not None
        return cp.workspace.tree

    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s", workspace=ws, watch=True)
        assert run.workspace is not None and run.workspace.watcher is not None

        def watched() -> str:
            cp = run.checkpoint()
            assert cp.workspace is not None
            return cp.workspace.tree

        first = watched()
        assert first == full_scan(0)
        with mounted(ws / "mp" / "m", outside):
            during = watched()
            assert during == full_scan(1) != first
            (outside / "o.txt").write_text("changed outside\n")
            assert watched() == full_scan(2) == during
        assert watched() == full_scan(3) == first


def test_temp_files_in_a_mount_are_not_the_restores_to_clean(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "m").mkdir(parents=True)
    (ws / ".stashpoint-tmp-a.txt").write_text("left by a killed restore\n")
    with mounted(ws / "m"):
        (ws / "m" / ".stashpoint-tmp-b.txt").write_text("someone else's\n")
        assert mount_points(os.fsencode(ws)) == {b"m"}
        assert clean_temp_files(os.fsencode(ws)) == 1
        assert (ws / "m" / ".stashpoint-tmp-b.txt").exists()
    assert not (ws / ".stashpoint-tmp-a.txt").exists()


def test_the_mount_table_is_read_with_its_escapes(tmp_path: Path) -> None:
    ws = tmp_path / "a dir\\with"
    (ws / "x y").mkdir(parents=True)
    assert mount_points(os.fsencode(ws)) == frozenset()
    with mounted(ws / "x y"):
        assert mount_points(os.fsencode(ws)) == {b"x y"}
        assert mount_points(os.fsencode(ws / "x y")) == frozenset()  # strictly below
