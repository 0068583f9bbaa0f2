"""The plain-file store (``file:///dir``): readable documents, same integrity, same
crash safety, from the API and the CLI as a user types it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import IntegrityError
from stashpoint.stores.files import FileStore
from stashpoint.testing.engine import EngineConformance
from stashpoint.verify import verify_store

from .conftest import STASHPOINT


def _doc(root: Path, ident: str) -> Path:
    [path] = root.glob(f"checkpoints/*/{ident}.json")
    return path


class TestFileStoreEngine(EngineConformance):
    """The engine conformance suite (rewind, integrity, N writer processes, durable runs,
    leases) on a file store."""

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"file://{tmp_path / 'fs'}"


def test_each_checkpoint_is_a_readable_json_document(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello")
    with stashpoint.open(f"file://{root}") as store:
        assert isinstance(store.refs.inner, FileStore)
        run = store.session("séssion/../x", workspace=ws)
        cp = run.checkpoint({"messages": [{"role": "user", "content": "hi"}], "n": 1}, label="one")
    path = _doc(root, cp.id)
    assert path.parent.parent == root / "checkpoints", "session names never escape the dir"
    text = path.read_text()
    assert "\n  " in text, "pretty-printed"
    doc = json.loads(text)
    assert doc["id"] == cp.id and doc["digest"] == cp.digest
    assert doc["record"]["label"] == "one"
    assert doc["record"]["workspace"]["files"] == 1
    assert json.loads((root / "heads.json").read_text()) == {"séssion/../x": {"main": cp.id}}
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_a_hand_edited_document_is_caught_on_read_and_by_verify(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    with stashpoint.open(f"file://{root}") as store:
        run = store.session("s")
        first = run.checkpoint({"n": 1})
        second = run.checkpoint({"n": 2})
    path = _doc(root, second.id)
    doc = json.loads(path.read_text())
    doc["record"]["step"] = 99  # a plausible, well-formed edit
    path.write_text(json.dumps(doc, indent=2))
    with stashpoint.open(f"file://{root}") as store:
        with pytest.raises(IntegrityError, match=second.id) as info:
            store.get(second.id)
        assert info.value.last_good == first.id
        report = verify_store(store)
        assert [p.checkpoint for p in report.problems] == [second.id]
        assert store.get(first.id).id == first.id, "the rest of the store stays usable"
    path.write_text(path.read_text()[:40])  # truncated: still named, never a crash
    with stashpoint.open(f"file://{root}") as store:
        with pytest.raises(IntegrityError, match=second.id):
            store.get(second.id)
        assert [p.checkpoint for p in verify_store(store).problems] == [second.id]


def test_a_flipped_blob_byte_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    with stashpoint.open(f"file://{root}") as store:
        run = store.session("s")
        run.checkpoint({"big": "x" * 5000})
    [blob] = [p for p in (root / "objects").rglob("*") if p.is_file()]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with stashpoint.open(f"file://{root}") as store:
        report = verify_store(store)
        assert not report.ok and "corrupt" in report.problems[0].message
        with pytest.raises(IntegrityError):
            store.session("s").state()


def test_an_interrupted_commit_is_replayed_by_the_next_opener(tmp_path: Path) -> None:
    """A crash between the redo record and the files it names: the next opener finishes it."""
    root = tmp_path / "fs"
    with stashpoint.open(f"file://{root}") as store:
        cp = store.session("s").checkpoint({"n": 1})
    heads = (root / "heads.json").read_bytes()
    doc = _doc(root, cp.id)
    body = doc.read_bytes()
    rel = str(doc.relative_to(root))
    doc.unlink()
    (root / "heads.json").unlink()
    record = {rel: body.decode(), "heads.json": heads.decode()}
    (root / "txn.json").write_text(json.dumps(record))
    with stashpoint.open(f"file://{root}") as store:
        assert store.session("s").head.id == cp.id
        assert verify_store(store).ok
    assert not (root / "txn.json").exists()


FILE_KILLS = 40


@pytest.mark.slow
def test_snap_killed_at_random_instants_on_a_file_store(sp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The crash harness of test_crash.py, on ``file://``: ``kill -9`` of ``snap`` at random
    instants; after each, the store opens without repair, verifies, keeps every acknowledged
    checkpoint, and has no redo record or temp file left once a command has run."""
    import random

    from .test_crash import (
        NARROW,
        SEED,
        Project,
        check_store,
        cli_env,
        cli_json,
        measure,
        run_killed,
    )

    rng = random.Random(SEED + 24)
    ws = tmp_path / "ws"
    ws.mkdir()
    fs = tmp_path / "fs"
    (ws / ".stashpoint").write_text(json.dumps({"store": f"file://{fs}"}))  # a link file
    project = Project(ws, rng)
    project.populate(150)
    env = cli_env(tmp_path)
    acked = [cli_json(sp, ws, "snap", "-m", "initial")["id"]]
    loaded: set[str] = set()

    def one_snap() -> None:
        project.step(0)
        acked.append(cli_json(sp, ws, "snap")["id"])

    duration = measure(one_snap, 3)
    killed = 0
    for i in range(3 * FILE_KILLS):
        if killed == FILE_KILLS:
            break
        project.step(i)
        code, out = run_killed(["snap", "--json"], ws, env, rng.uniform(0, duration))
        if code == 0:
            acked.append(json.loads(out)["id"])
            duration *= NARROW
        else:
            killed += 1
        check_store(sp, env, ws, acked, loaded)
        assert not (fs / "txn.json").exists(), "a redo record outlived the next command"
        assert not [p for p in fs.rglob("*") if ".stashpoint-tmp-" in p.name]
    assert killed == FILE_KILLS


_WRITER = """
import sys, stashpoint
with stashpoint.open(sys.argv[1]) as store:
    run = store.session("s")
    i = 0
    while True:
        run.checkpoint({"messages": [{"i": j} for j in range(i % 5)], "i": i})
        print(i, flush=True)
        i += 1
"""


def test_kill_9_mid_writes_leaves_a_store_that_opens_and_verifies(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, url], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        acked = [proc.stdout.readline() for _ in range(5)]
        time.sleep(0.05 * (_ + 1))  # land somewhere inside a later commit
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert all(a.strip() for a in acked)
        with stashpoint.open(url) as store:
            report = verify_store(store)
            assert report.ok, report.problems
            history = store.session("s").history()
            parents = [c.parent for c in history if c.parent]
            assert len(parents) == len(set(parents)), "one linear chain"
    leftovers = [p for p in (tmp_path / "fs").rglob("*") if ".stashpoint-tmp-" in p.name]
    assert leftovers == []


def test_unsafe_ids_are_refused_not_used_as_paths(tmp_path: Path) -> None:
    fs = FileStore(tmp_path / "fs")
    assert fs.get_checkpoint("../../etc/passwd") is None
    assert fs.log_info("../x") is None
    fs.close()


def test_cli_on_a_file_store(tmp_path: Path, sp) -> None:  # type: ignore[no-untyped-def]
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "notes.txt").write_text("v1\n")
    url = f"file://{tmp_path / 'fs'}"
    one = json.loads(sp("--store", url, "snap", "-m", "first", "--json", cwd=ws).out)
    (ws / "notes.txt").write_text("v2\n")
    (ws / "new.txt").write_text("later\n")
    two = json.loads(sp("--store", url, "snap", "-m", "second", "--json", cwd=ws).out)
    log = json.loads(sp("--store", url, "log", "--json", cwd=ws).out)
    assert [c["id"] for c in log][:2] == [two["id"], one["id"]]
    assert log[0]["message"] == "second"
    sp("--store", url, "rewind", one["id"], cwd=ws)
    assert (ws / "notes.txt").read_text() == "v1\n" and not (ws / "new.txt").exists()
    assert sp("--store", url, "verify", cwd=ws).code == 0

    env_run = subprocess.run(  # STASHPOINT_STORE works the same
        [*STASHPOINT, "log", "--json"],
        cwd=ws,
        env={**os.environ, "STASHPOINT_STORE": url, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert env_run.returncode == 0, env_run.stderr
    assert {one["id"], two["id"]} <= {c["id"] for c in json.loads(env_run.stdout)}

    path = _doc(tmp_path / "fs", one["id"])
    path.write_text(path.read_text().replace('"first"', '"edited by hand"'))
    res = sp("--store", url, "verify", "--json", cwd=ws, check=False)
    assert res.code == 2
    report = json.loads(res.out)
    assert one["id"] in {p["checkpoint"] for p in report["problems"]}
    res = sp("--store", url, "show", one["id"], cwd=ws, check=False)
    assert res.code == 2 and one["id"] in res.err


def test_a_damaged_redo_record_is_set_aside_never_applied(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    with stashpoint.open(f"file://{root}") as store:
        cp = store.session("s").checkpoint({"n": 1})
    (root / "txn.json").write_text(json.dumps({"../../escape.txt": "owned"}))
    with pytest.warns(UserWarning, match="damaged"), stashpoint.open(f"file://{root}") as store:
        assert store.session("s").head.id == cp.id  # type: ignore[union-attr]
        assert verify_store(store).ok
    assert not (tmp_path / "escape.txt").exists() and not (root.parent / "escape.txt").exists()
    assert (root / "txn.json.damaged").exists() and not (root / "txn.json").exists()


def test_forked_writers_of_one_opened_store_still_exclude_each_other(tmp_path: Path) -> None:
    """A FileStore opened before fork(): each child must take the cross-process lock itself
    (a descriptor shared with the parent would make every child's flock the same lock)."""
    import json
    import os

    from stashpoint.errors import ConflictError
    from stashpoint.stores.files import FileStore

    fs = FileStore(tmp_path / "fs")
    fs.set_head("s", "main", "H0", None)
    kids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            wins = []
            for i in range(60):
                cur = fs.get_head("s", "main")
                try:
                    fs.set_head("s", "main", f"H{k}x{i}", cur)
                    wins.append(cur)
                except ConflictError:
                    pass
            (tmp_path / f"wins.{k}").write_text(json.dumps(wins))
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    wins = [w for k in range(3) for w in json.loads((tmp_path / f"wins.{k}").read_text())]
    assert wins and len(wins) == len(set(wins)), "two writers moved the head from one value"
    fs.close()


def test_a_commit_that_fails_for_lack_of_space_is_not_applied_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while writing one of a commit's files (here the heads file): the commit must be
    all-or-nothing as reported - not completed later from its redo record by the next writer,
    which would turn a reported failure into a checkpoint the caller may write again."""
    import errno
    import os

    from stashpoint.errors import StoreError

    store = stashpoint.open(f"file://{tmp_path / 'fs'}")
    run = store.session("job")
    first = run.checkpoint({"i": 1})
    real_open, real_write = os.open, os.write
    names: dict[int, str] = {}

    def tracking_open(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = real_open(path, flags, mode, **kw)
        names[fd] = os.fspath(path)
        return fd

    def full_write(fd: int, data: Any) -> int:
        if "heads.json" in names.get(fd, "") and "stashpoint-tmp" in names.get(fd, ""):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "write", full_write)
    with pytest.raises(StoreError, match="No space left"):
        run.checkpoint({"i": 2})
    monkeypatch.undo()
    assert not (tmp_path / "fs" / "txn.json").exists()
    store.meta.set_label(first.id, "job", "kept")  # any later write runs recovery first
    assert store.meta.get_head("job", "main") == first.id
    assert [c.id for c in run.history()] == [first.id]
    assert not [p for p in (tmp_path / "fs").rglob("*") if "stashpoint-tmp" in p.name]
    again = run.checkpoint({"i": 2})  # the retry is the one and only second checkpoint
    assert again.parent == first.id
    store.close()


def test_a_failure_after_some_renames_says_the_write_will_complete(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """EIO on the second rename of a commit: some files are already replaced, so the commit
    cannot be undone. The error says it will be completed (not "failed"), and the next write
    completes it: the checkpoint is then in the history, once."""
    import errno
    import os

    from stashpoint.errors import StoreError

    store = stashpoint.open(f"file://{tmp_path / 'fs'}")
    run = store.session("job")
    first = run.checkpoint({"i": 1})
    real_replace = os.replace
    calls = {"n": 0}

    def failing_replace(src: Any, dst: Any, **kw: Any) -> None:
        if "txn.json" not in os.fspath(dst):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StoreError, match="completed by the next write or open"):
        run.checkpoint({"i": 2})
    monkeypatch.undo()
    assert (tmp_path / "fs" / "txn.json").exists()
    store.meta.set_label(first.id, "job", "kept")  # the next write completes the commit
    assert not (tmp_path / "fs" / "txn.json").exists()
    history = stashpoint.open(f"file://{tmp_path / 'fs'}").session("job").history()
    assert len(history) == 2 and history[-1].id == first.id
    assert history[0].parent == first.id
    store.close()


def test_a_store_url_of_the_other_kind_is_refused_and_creates_nothing(
    tmp_path: Path,
    sp,  # type: ignore[no-untyped-def]
) -> None:
    """``--store file:///ws/.stashpoint`` at a SQLite store made a file store inside it (its
    blobs/ shared with the SQLite store's) and then reported the branch empty."""

    def listing(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    sp("snap", "-m", "first", cwd=ws)
    home = ws / ".stashpoint"
    before = listing(home)
    for args in (("log",), ("snap", "-m", "second")):
        res = sp("--store", f"file://{home}", *args, cwd=ws, check=False)
        assert res.code == 1, res
        assert f"{home} holds a SQLite store" in res.err, res
        assert f"sqlite://{home}" in res.err, res
        assert listing(home) == before
    assert "first" in sp("--store", f"sqlite://{home}", "log", cwd=ws).out

    files = tmp_path / "fs"
    sp("--store", f"file://{files}", "snap", "-m", "plain", cwd=ws)
    before = listing(files)
    for url in (f"sqlite://{files}", str(files)):
        res = sp("--store", url, "log", cwd=ws, check=False)
        assert res.code == 1, res
        assert f"{files} holds a file:// store" in res.err and f"file://{files}" in res.err, res
        assert listing(files) == before
