"""The engine through the public Python API, on real directories and a real SQLite store."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import IntegrityError, NotFoundError, UsageError

from .conftest import snapshot_tree


def _msgs(n: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 40}
        for i in range(n)
    ]


def _db(store: stashpoint.Store) -> sqlite3.Connection:
    assert store.home is not None
    return sqlite3.connect(store.home / "store.db")


def test_state_round_trip_and_history(store: stashpoint.Store) -> None:
    run = store.session("s")
    cp1 = run.checkpoint({"messages": _msgs(2), "plan": ["a", "b"], "pos": 1}, message="one")
    cp2 = run.checkpoint({"messages": _msgs(4), "plan": ["a"], "pos": 2}, label="two")
    assert run.state(cp1.id) == {"messages": _msgs(2), "plan": ["a", "b"], "pos": 1}
    assert run.state() == {"messages": _msgs(4), "plan": ["a"], "pos": 2}
    assert [c.id for c in run.history()] == [cp2.id, cp1.id]
    assert cp2.parent == cp1.id and cp2.parent_digest == cp1.digest
    assert cp2.step == cp1.step + 1
    assert run.resolve("two") == cp2.id
    assert run.resolve(cp1.id[:16]) == cp1.id
    assert run.resolve("HEAD~1") == cp1.id
    with pytest.raises(NotFoundError):
        run.get("nope")


def test_conversation_is_stored_incrementally(store: stashpoint.Store) -> None:
    """Appending k messages stores k message rows, never the whole list again."""
    run = store.session("s")
    msgs: list[dict[str, str]] = []
    for _ in range(50):
        msgs += _msgs(2)
        run.checkpoint({"messages": msgs})
    db = _db(store)
    (rows,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
    assert rows == 100
    # a fresh process (no in-memory cache) still appends to the same log
    again = stashpoint.open(store.home).session("s")
    again.checkpoint({"messages": [*msgs, {"role": "user", "content": "more"}]})
    (rows,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
    assert rows == 101
    assert again.state()["messages"][-1] == {"role": "user", "content": "more"}


def test_edited_history_branches_a_new_log_and_old_checkpoints_keep_theirs(
    store: stashpoint.Store,
) -> None:
    run = store.session("s")
    first = run.checkpoint({"messages": _msgs(6)})
    edited = [*_msgs(3), {"role": "user", "content": "different"}]
    run.checkpoint({"messages": edited})
    assert run.state()["messages"] == edited
    assert run.state(first.id)["messages"] == _msgs(6)
    (rows,) = _db(store).execute("SELECT COUNT(*) FROM messages").fetchone()
    assert rows == 7  # 6 + the one new message after the shared prefix of 3


def test_unchanged_values_are_stored_once(store: stashpoint.Store) -> None:
    run = store.session("s")
    big = {"doc": "x" * 50_000}
    db = _db(store)
    run.checkpoint({"big": big, "n": 1})
    (before,) = db.execute("SELECT COUNT(*) FROM blobs").fetchone()
    for i in range(2, 12):
        run.checkpoint({"big": big, "n": i})
    (after,) = db.execute("SELECT COUNT(*) FROM blobs").fetchone()
    assert after - before == 10  # one new blob per changed "n", none for "big"


def test_tampered_record_is_detected_and_last_good_offered(store: stashpoint.Store) -> None:
    run = store.session("s")
    a = run.checkpoint({"v": 1})
    b = run.checkpoint({"v": 2})
    db = _db(store)
    body = db.execute("SELECT body FROM checkpoints WHERE id=?", (b.id,)).fetchone()[0]
    db.execute(
        "UPDATE checkpoints SET body=? WHERE id=?", (body.replace(b'"step":2', b'"step":9'), b.id)
    )
    db.commit()
    fresh = stashpoint.open(store.home)
    with pytest.raises(IntegrityError) as info:
        fresh.get(b.id)
    assert info.value.checkpoint == b.id and info.value.last_good == a.id
    assert a.id in str(info.value)
    with pytest.raises(IntegrityError):
        fresh.session("s").history()


def test_rehashed_forgery_breaks_the_chain_below_it(store: stashpoint.Store) -> None:
    """Re-hashing an edited record fixes its own digest but not its child's parent link."""
    from stashpoint.integrity import ChainHasher, canonical_body

    run = store.session("s")
    a = run.checkpoint({"v": 1})
    b = run.checkpoint({"v": 2})
    forged = canonical_body(a).replace(b'"kind":"manual"', b'"kind":"milestone"')
    db = _db(store)
    db.execute(
        "UPDATE checkpoints SET body=?, digest=? WHERE id=?",
        (forged, ChainHasher().digest(forged), a.id),
    )
    db.commit()
    fresh = stashpoint.open(store.home)
    fresh.get(a.id)  # verifies alone ...
    with pytest.raises(IntegrityError, match="altered"):
        fresh.get(b.id)  # ... but its child no longer matches it


def test_keyed_chain_rejects_unkeyed_forgery(tmp_path: Path) -> None:
    s = stashpoint.open(tmp_path / "k", key=b"secret-key")
    cp = s.session("s").checkpoint({"v": 1})
    s.close()
    with pytest.raises(UsageError, match="keyed hash chain"):
        stashpoint.open(tmp_path / "k")  # refused up front: the store says it is keyed
    with sqlite3.connect(tmp_path / "k" / "store.db") as db:  # a writer drops that mark
        db.execute("DELETE FROM meta WHERE key = 'integrity'")
    with pytest.raises(IntegrityError):
        stashpoint.open(tmp_path / "k").get(cp.id)  # the records still do not verify
    assert stashpoint.open(tmp_path / "k", key=b"secret-key").get(cp.id).id == cp.id


def test_tampered_message_is_detected(store: stashpoint.Store) -> None:
    run = store.session("s")
    cp = run.checkpoint({"messages": _msgs(4)})
    db = _db(store)
    db.execute("UPDATE messages SET data=? WHERE idx=2", (b'{"role":"user","content":"forged"}',))
    db.commit()
    with pytest.raises(IntegrityError):
        stashpoint.open(store.home).session("s").state(cp.id)


def test_replayed_record_from_another_session_is_detected(store: stashpoint.Store) -> None:
    a = store.session("a").checkpoint({"v": 1})
    db = _db(store)
    db.execute("UPDATE checkpoints SET session='b' WHERE id=?", (a.id,))
    db.commit()
    with pytest.raises(IntegrityError):
        stashpoint.open(store.home).get(a.id)


def test_unsupported_state_fails_at_checkpoint_time(store: stashpoint.Store) -> None:
    class Opaque:
        pass

    with pytest.raises(stashpoint.SerializationError, match="Opaque"):
        store.session("s").checkpoint({"x": Opaque()})
    assert store.session("s").head is None


def test_schema_and_config_changes_warn(store: stashpoint.Store) -> None:
    cp = store.session("s", config={"model": "a"}, schema_version=1).checkpoint({"v": 1})
    other = store.session("s", config={"model": "b"}, schema_version=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.state(cp.id)
    texts = " ".join(str(w.message) for w in caught)
    assert "schema version 1" in texts and "different agent configuration" in texts


def test_refuses_home_and_root(store: stashpoint.Store) -> None:
    with pytest.raises(UsageError, match="home directory"):
        store.session("s", workspace=Path.home())
    with pytest.raises(UsageError, match="filesystem root"):
        store.session("s", workspace="/")


def _make_tree(ws: Path) -> None:
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "a.py").write_text("a = 1\n")
    (ws / "bin.dat").write_bytes(bytes(range(256)) * 10)
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "empty").mkdir()
    os.symlink("src/pkg/a.py", ws / "link")
    os.symlink("missing-target", ws / "dangling")
    (ws / os.fsdecode(b"latin1-\xe9.txt")).write_text("non-utf8 name")


def test_rewind_files_and_state_then_undo(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_tree(ws)
    run = store.session("s", workspace=ws)
    before = snapshot_tree(ws)
    cp = run.checkpoint({"messages": _msgs(2), "plan": "v1"})
    (ws / "src" / "pkg" / "a.py").write_text("a = 2\n")
    (ws / "run.sh").unlink()
    (ws / "new").mkdir()
    (ws / "new" / "f.txt").write_text("new")
    (ws / "link").unlink()
    (ws / "link").mkdir()  # type change: symlink -> directory
    (ws / "empty").chmod(0o700)
    run.checkpoint({"messages": _msgs(4), "plan": "v2"})
    after = snapshot_tree(ws)
    result = run.rewind(cp.id)
    assert snapshot_tree(ws) == before
    assert run.state() == {"messages": _msgs(2), "plan": "v1"}
    assert run.head is not None and run.head.id == cp.id
    run.rewind(result.safety.id)
    assert snapshot_tree(ws) == after
    assert run.state()["plan"] == "v2"


def test_files_only_and_state_only(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("1")
    run = store.session("s", workspace=ws)
    cp = run.checkpoint({"plan": "v1"})
    (ws / "f").write_text("2")
    run.checkpoint({"plan": "v2"})
    r = run.rewind(cp.id, state=False)
    assert (ws / "f").read_text() == "1" and run.state()["plan"] == "v2"
    assert r.head.kind == "rewind"
    (ws / "f").write_text("3")
    run.rewind(cp.id, files=False)
    assert (ws / "f").read_text() == "3" and run.state()["plan"] == "v1"


def test_restore_never_follows_a_planted_symlink(tmp_path: Path, store: stashpoint.Store) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "d").mkdir()
    (ws / "d" / "f.txt").write_text("inside")
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    (ws / "d" / "f.txt").unlink()
    (ws / "d").rmdir()
    os.symlink(outside, ws / "d")  # d now points outside the workspace
    run.rewind(cp.id)
    assert list(outside.iterdir()) == []
    assert not (ws / "d").is_symlink() and (ws / "d" / "f.txt").read_text() == "inside"


def test_same_size_edit_with_restored_mtime_is_seen(
    tmp_path: Path, store: stashpoint.Store
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    f = ws / "f.txt"
    f.write_text("aaaa")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - 10**10))  # old enough not to be racy
    run = store.session("s", workspace=ws)
    first = run.checkpoint()
    st = f.stat()
    f.write_text("bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only ctime moved
    second = run.checkpoint()
    assert first.workspace is not None and second.workspace is not None
    assert first.workspace.tree != second.workspace.tree


def test_big_file_small_change_stores_one_chunk(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    data = bytearray(os.urandom(5 * 1024 * 1024))
    (ws / "big.bin").write_bytes(data)
    run = store.session("s", workspace=ws)
    run.checkpoint()
    assert store.home is not None
    blob_dir = store.home / "blobs"
    count = sum(1 for p in blob_dir.rglob("*") if p.is_file())
    data[3 * 1024 * 1024 + 5] ^= 0xFF
    (ws / "big.bin").write_bytes(data)
    cp = run.checkpoint()
    assert sum(1 for p in blob_dir.rglob("*") if p.is_file()) == count + 1
    (ws / "big.bin").write_bytes(b"gone")
    run.rewind(cp.id)
    assert (ws / "big.bin").read_bytes() == bytes(data)


def test_fork_into_directory_is_independent(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_tree(ws)
    run = store.session("s", workspace=ws)
    cp = run.checkpoint({"plan": "base"})
    b = run.fork(cp.id, "b", into=tmp_path / "b")
    assert {k: v for k, v in snapshot_tree(tmp_path / "b").items()} == snapshot_tree(ws)
    (tmp_path / "b" / "only-b.txt").write_text("b")
    cpb = b.checkpoint({"plan": "b"})
    (ws / "only-a.txt").write_text("a")
    cpa = run.checkpoint({"plan": "a"})
    assert cpb.branch == "b" and cpa.branch == "main"
    assert cpb.parent == cp.id and cpa.parent == cp.id
    assert not (ws / "only-b.txt").exists() and not (tmp_path / "b" / "only-a.txt").exists()
    with pytest.raises(UsageError, match="exists"):
        run.fork(cp.id, "b")


def test_fork_in_place_switches_branch(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("1")
    run = store.session("s", workspace=ws)
    cp = run.checkpoint()
    (ws / "f").write_text("2")
    run.checkpoint()
    run.fork(cp.id, "alt")
    assert (ws / "f").read_text() == "1" and run.branch == "alt"
    # a new session object on this workspace follows the checkout
    assert store.session("s", workspace=ws).branch == "alt"


def test_diff_reports_state_messages_and_files(tmp_path: Path, store: stashpoint.Store) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("one\n")
    run = store.session("s", workspace=ws)
    a = run.checkpoint({"messages": _msgs(2), "k": 1, "gone": True})
    (ws / "f.txt").write_text("two\n")
    (ws / "g.txt").write_text("g\n")
    b = run.checkpoint({"messages": _msgs(3), "k": 2, "new": [1]})
    d = run.diff(a.id, b.id)
    assert [(k, s) for k, s, _o, _n in d.values] == [
        ("gone", "removed"),
        ("k", "changed"),
        ("new", "added"),
    ]
    assert d.messages_removed == 0 and d.messages_added == _msgs(3)[2:]
    assert [(c.path, c.status) for c in d.files] == [(b"f.txt", "modified"), (b"g.txt", "added")]


def _writer(home: str, n: int) -> None:
    run = stashpoint.open(home).session("shared")
    for i in range(n):
        run.checkpoint({"pid": os.getpid(), "i": i})


def test_concurrent_writers_lose_nothing(store: stashpoint.Store) -> None:
    procs, per = 4, 25
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(str(store.home), per)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    run = stashpoint.open(store.home).session("shared")
    history = run.history()
    assert len(history) == procs * per
    # one linear chain: every checkpoint but the first is the parent of exactly one other
    parents = [c.parent for c in history if c.parent]
    assert len(parents) == len(set(parents)) == procs * per - 1
    head = run.head
    assert head is not None
    seen = 0
    node: stashpoint.Checkpoint | None = head
    while node is not None:
        seen += 1
        node = store.get(node.parent) if node.parent else None
    assert seen == procs * per


def test_ids_are_unique_and_sort_by_time() -> None:
    from stashpoint._ids import id_time_ms, is_id, new_id

    ids = [new_id() for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) and all(map(is_id, ids))
    assert all(id_time_ms(b) >= id_time_ms(a) for a, b in itertools.pairwise(ids))


def test_memory_store_keeps_chunked_files(tmp_path: Path) -> None:
    """Stores without a blob directory keep large files' chunks with the other blobs."""
    ws = tmp_path / "ws"
    ws.mkdir()
    data = os.urandom(3 * 1024 * 1024 + 7)
    (ws / "big.bin").write_bytes(data)
    run = stashpoint.open("memory://").session("s", workspace=ws)
    cp = run.checkpoint()
    (ws / "big.bin").write_bytes(b"x")
    run.rewind(cp.id)
    assert (ws / "big.bin").read_bytes() == data


def test_verify_walks_forked_conversation_logs_and_catches_a_forged_message(
    store: stashpoint.Store,
) -> None:
    from stashpoint.verify import verify_store

    run = store.session("s")
    run.checkpoint({"messages": _msgs(4)})
    run.checkpoint({"messages": [*_msgs(2), {"role": "user", "content": "edited"}]})  # new log
    run.checkpoint({"messages": [*_msgs(2), {"role": "user", "content": "edited"}, *_msgs(1)]})
    report = verify_store(store)
    assert report.ok, report.problems
    db = _db(store)
    db.execute("UPDATE messages SET data=? WHERE idx=1", (b'{"role":"user","content":"forged"}',))
    db.commit()
    bad = verify_store(stashpoint.open(store.home))
    assert not bad.ok
    assert all("conversation log" in p.message for p in bad.problems)
    assert len(bad.problems) == 3  # every checkpoint shares the forged message


def test_a_checkpoint_records_the_python_and_stashpoint_versions(store: stashpoint.Store) -> None:
    import platform

    cp = store.session("s").checkpoint({"n": 1})
    assert cp.deps["python"] == platform.python_version()
    assert cp.deps["stashpoint"] == stashpoint.__version__


@pytest.mark.parametrize("bad", ["", "a\0b", "bad\udcff"])
def test_session_and_branch_names_every_backend_can_store(tmp_path: Path, bad: str) -> None:
    """An empty name, a NUL or a byte that is not Unicode (from a command line in another
    encoding) is refused with a clear error before anything reaches a store driver."""
    with stashpoint.open(tmp_path / "store") as store:
        with pytest.raises(UsageError, match="session"):
            store.session(bad)
        with pytest.raises(UsageError, match="branch"):
            store.session("s", branch=bad)
        run = store.session("s")
        first = run.checkpoint({"n": 1})
        if bad:  # an empty fork name means "make one up"
            with pytest.raises(UsageError, match="branch"):
                run.fork(first.id, bad)
        assert store.sessions() == ["s"]


def test_the_cli_refuses_a_session_name_that_is_not_unicode(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "f.txt").write_text("hi")
    sp("snap", "-m", "one", cwd=ws)
    res = sp("--session", "bad\udcff", "snap", "-m", "two", cwd=ws, check=False)
    assert res.code != 0
    assert "valid Unicode" in res.err and "Traceback" not in res.err
