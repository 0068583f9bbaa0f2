"""A full disk: a clear error, previous checkpoints intact, no temp files,
and the same command succeeds once there is space again.

The store lives on a real, tiny tmpfs mounted for the test (so SQLite and the blob directory
both meet a real ENOSPC from the kernel). Mounting needs root: elsewhere the test skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _temp_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if "stashpoint-tmp" in p.name]


def _fill(mnt: Path, leave: int) -> Path:
    """Take all of the file system's space but ``leave`` bytes."""
    filler = mnt / "filler"
    free = shutil.disk_usage(mnt).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_fails_clearly_and_loses_nothing(
    sp: Any, tmp_path: Path, tiny_fs: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("first\n")
    store = ["--store", str(tiny_fs / "st")]
    first = json.loads(sp(*store, "snap", "-m", "one", "--json", cwd=ws).out)

    # 1. a large file: its chunks do not fit in the blob directory
    (ws / "big.bin").write_bytes(os.urandom(4 << 20))
    res = sp(*store, "snap", "-m", "big", cwd=ws, check=False)
    assert res.code == 1 and "No space left on device" in res.err, res.err
    assert "Traceback" not in res.err
    (ws / "big.bin").unlink()

    # 2. many small files: packed into one pack file, which does not fit
    (ws / "many").mkdir()
    for i in range(1500):
        (ws / "many" / f"f{i}.txt").write_bytes(os.urandom(1500))
    res = sp(*store, "snap", "-m", "many", cwd=ws, check=False)
    assert res.code == 1 and "No space left on device" in res.err, res.err
    assert "Traceback" not in res.err
    shutil.rmtree(ws / "many")

    # 3. the database itself cannot grow: a few small files go inline into SQLite
    (ws / "few").mkdir()
    for i in range(30):
        (ws / "few" / f"f{i}.txt").write_bytes(os.urandom(3000))
    filler = _fill(tiny_fs, 8 << 10)
    res = sp(*store, "snap", "-m", "few", cwd=ws, check=False)
    assert res.code != 0 and "Traceback" not in res.err, res.err
    assert "full" in res.err or "No space" in res.err, res.err
    filler.unlink()

    # nothing was lost or left behind, and the same command now works
    assert _temp_files(tiny_fs) == []
    assert sp(*store, "verify", cwd=ws).code == 0
    log = json.loads(sp(*store, "log", "--json", cwd=ws).out)
    assert [c["id"] for c in log] == [first["id"]]
    again = json.loads(sp(*store, "snap", "-m", "few", "--json", cwd=ws).out)
    assert again["parent"] == first["id"]
    assert sp(*store, "verify", cwd=ws).code == 0
    shown = json.loads(sp(*store, "show", "HEAD", "--files", "--json", cwd=ws).out)
    assert len([e for e in shown["manifest"]["entries"] if e["type"] == "f"]) == 31


def test_a_rewind_into_a_full_disk_names_the_file_it_could_not_write(
    sp: Any, tmp_path: Path, tiny_fs: Path
) -> None:
    ws = tiny_fs / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(1 << 20))
    store = ["--store", str(tmp_path / "st")]
    first = json.loads(sp(*store, "snap", "-m", "one", "--json", cwd=ws).out)
    (ws / "big.bin").unlink()
    filler = _fill(tiny_fs, 4 << 10)
    res = sp(*store, "rewind", first["id"], cwd=ws, check=False)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "restore failed at big.bin" in res.err, res.err
    filler.unlink()
    sp(*store, "log", cwd=ws)  # completes the interrupted rewind now that there is room
    assert (ws / "big.bin").stat().st_size == 1 << 20


def _small_then_big(sp: Any, tmp_path: Path, tiny_fs: Path) -> tuple[Path, list[str], str]:
    """A workspace on the tiny file system with two checkpoints, rewound to the small one:
    (workspace, the --store arguments, the big checkpoint's id)."""
    ws = tiny_fs / "ws"
    ws.mkdir()
    store = ["--store", str(tmp_path / "st")]
    (ws / "app.py").write_text("v1\n")
    small = json.loads(sp(*store, "snap", "-m", "small", "--json", cwd=ws).out)
    (ws / "big.bin").write_bytes(os.urandom(1 << 20))
    big = json.loads(sp(*store, "snap", "-m", "big", "--json", cwd=ws).out)
    sp(*store, "rewind", small["id"], cwd=ws)
    return ws, store, str(big["id"])


def test_finishing_an_interrupted_rewind_keeps_the_work_done_meanwhile(
    sp: Any, tmp_path: Path, tiny_fs: Path
) -> None:
    """A rewind the disk stopped halfway is finished by the next command. Files written
    after it stopped (the user kept working) are in neither its target nor its safety
    checkpoint: they are recorded first, never silently overwritten or deleted."""
    ws, store, big = _small_then_big(sp, tmp_path, tiny_fs)
    filler = _fill(tiny_fs, 4 << 10)
    res = sp(*store, "rewind", big, cwd=ws, check=False)
    assert res.code == 1 and "restore failed at big.bin" in res.err, res.err
    (ws / "notes.txt").write_text("work\n")  # the user goes on working
    (ws / "app.py").write_text("v2\n")
    filler.unlink()

    done = sp(*store, "log", "--json", cwd=ws)  # finishes the interrupted rewind
    assert (ws / "big.bin").stat().st_size == 1 << 20  # the rewind is complete
    assert "notes.txt" in done.err and "changed since it was interrupted" in done.err, done.err
    kept = done.err.split("saved as checkpoint ")[1].split()[0]
    sp(*store, "rewind", kept, cwd=ws)
    assert (ws / "notes.txt").read_text() == "work\n"
    assert (ws / "app.py").read_text() == "v2\n"


def test_finishing_an_interrupted_rewind_without_new_work_records_nothing_more(
    sp: Any, tmp_path: Path, tiny_fs: Path
) -> None:
    ws, store, big = _small_then_big(sp, tmp_path, tiny_fs)
    before = json.loads(sp(*store, "log", "--json", cwd=ws).out)
    filler = _fill(tiny_fs, 4 << 10)
    assert sp(*store, "rewind", big, cwd=ws, check=False).code == 1
    filler.unlink()
    done = sp(*store, "log", "--json", cwd=ws)
    assert "changed since" not in done.err, done.err
    after = json.loads(done.out)
    # the failed rewind's own safety checkpoint, and nothing else
    assert len(after) == len(before) + 1, (before, after)
    assert (ws / "big.bin").stat().st_size == 1 << 20


def test_a_full_disk_still_opens_the_store_for_reading_and_for_gc(
    sp: Any, tmp_path: Path, tiny_fs: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    store = ["--store", str(tiny_fs / "st")]
    (ws / "big.bin").write_bytes(os.urandom(1500 << 10))  # chunks in the blob directory
    old = json.loads(sp(*store, "snap", "-m", "big", "--json", cwd=ws).out)
    (ws / "big.bin").unlink()
    (ws / "a.txt").write_text("small\n")
    head = json.loads(sp(*store, "snap", "-m", "small", "--json", cwd=ws).out)
    sp(*store, "prune", "--keep-last", "1", cwd=ws)
    filler = _fill(tiny_fs, 16 << 10)
    assert shutil.disk_usage(tiny_fs).free <= 16 << 10

    for command in (["verify"], ["log"], ["show", "HEAD"]):
        res = sp(*store, *command, cwd=ws, check=False)
        assert res.code == 0 and "Traceback" not in res.err, (command, res)
    log = json.loads(sp(*store, "log", "--json", cwd=ws).out)
    assert [c["id"] for c in log] == [head["id"], old["id"]]
    res = sp(*store, "gc", cwd=ws, check=False)
    assert res.code == 0 and "freed 1.5 MiB: 4 blobs" in res.out, res
    assert shutil.disk_usage(tiny_fs).free > 1 << 20  # the remedy worked
    assert sp(*store, "verify", cwd=ws).code == 0

    filler.unlink()  # with room again, the store opens as usual and takes a checkpoint
    (ws / "a.txt").write_text("more\n")
    again = json.loads(sp(*store, "snap", "-m", "again", "--json", cwd=ws).out)
    assert again["parent"] == head["id"]
    assert "warning" not in sp(*store, "log", cwd=ws).err
