"""Mirrored writes: every checkpoint also in a second store, reads falling back to
it, ``verify --mirror`` comparing the two. Real stores only: SQLite, plain files, PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import stashpoint
from stashpoint.errors import IntegrityError, UsageError
from stashpoint.mirror import BEHIND_KEY, MirroredStore, MirrorWarning, compare_stores
from stashpoint.verify import verify_store

from .conftest import snapshot_tree
from .test_postgres import pg_url  # noqa: F401 - fixture: the real server, a fresh schema


@pytest.fixture(params=["files", "postgres"])
def mirror_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A mirror on plain files (always) and on the real PostgreSQL server (skips off CI when
    there is none, fails under CI=true: see tests/test_postgres.py)."""
    if request.param == "files":
        yield f"file://{tmp_path / 'mirror'}"
    else:
        yield request.getfixturevalue("pg_url")


def _flip_record(db: Path, ident: str) -> None:
    """Flip one byte inside a checkpoint record of a SQLite store (not its digest column)."""
    con = sqlite3.connect(db)
    (body,) = con.execute("SELECT body FROM checkpoints WHERE id = ?", (ident,)).fetchone()
    at = bytes(body).index(b'"step":') + 7
    bad = bytearray(body)
    bad[at] ^= 0x01  # "step":0 -> "step":1
    con.execute("UPDATE checkpoints SET body = ? WHERE id = ?", (bytes(bad), ident))
    con.commit()
    con.close()


def _flip_blob(db: Path, content: bytes) -> None:
    """Flip one byte of the stored copy of ``content`` (an inline blob row of SQLite)."""
    digest = hashlib.sha256(content).digest()
    con = sqlite3.connect(db)
    (data,) = con.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    n = con.execute("UPDATE blobs SET data = ? WHERE digest = ?", (bytes(bad), digest)).rowcount
    assert n == 1
    con.commit()
    con.close()


def test_every_checkpoint_reaches_the_mirror_and_verifies_there(
    tmp_path: Path, mirror_url: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    (ws / "big.bin").write_bytes(bytes(range(256)) * 9000)  # > 1 chunk: chunk files locally
    (ws / "sub").mkdir()
    (ws / "sub" / "b.txt").write_text("bee")
    msgs = [{"role": "user", "content": "hi"}]
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        assert isinstance(store, MirroredStore)
        run = store.session("s", workspace=ws)
        first = run.checkpoint({"messages": msgs, "plan": [1]}, label="first")
        expected = snapshot_tree(ws)
        (ws / "a.txt").write_text("two")
        second = run.checkpoint({"messages": [*msgs, {"role": "ai", "content": "yo"}]})
        run.fork(first.id, branch="alt")
        report = compare_stores(store, store.mirror)  # type: ignore[arg-type]
        assert report.ok and not report.behind, report.to_dict()
        assert report.to_dict()["in_sync"] is True
    with stashpoint.open(mirror_url) as mirror:  # the mirror alone is a complete store
        assert verify_store(mirror).ok
        assert {c.id for c in mirror.session("s").history()} >= {first.id, second.id}
        assert mirror.meta.labels("s") == {first.id: "first"}
        assert mirror.meta.branches("s").keys() == {"main", "alt"}
        run = mirror.session("s", workspace=ws)
        run.rewind(first.id)
        assert snapshot_tree(ws) == expected
        assert run.state() == {"messages": msgs, "plan": [1]}


def test_reads_fall_back_to_the_mirror_when_the_primary_is_damaged(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("precious content\n" * 20)
    mirror_url = f"file://{tmp_path / 'mirror'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        cp = store.session("s", workspace=ws).checkpoint({"n": 1})
    _flip_record(tmp_path / "primary" / "store.db", cp.id)
    _flip_blob(tmp_path / "primary" / "store.db", ("precious content\n" * 20).encode())
    with stashpoint.open(tmp_path / "primary") as alone, pytest.raises(IntegrityError, match=cp.id):
        alone.get(cp.id)
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        with pytest.warns(MirrorWarning, match="mirror"):
            assert store.get(cp.id).digest == cp.digest
        (ws / "a.txt").write_text("overwritten")
        with pytest.warns(MirrorWarning):
            store.session("s", workspace=ws).rewind(cp.id)
        assert (ws / "a.txt").read_text() == "precious content\n" * 20
        assert not verify_store(store).ok, "verify judges the primary, never the fallback"


def test_a_mirror_that_is_down_loses_no_primary_write_and_catches_up(tmp_path: Path) -> None:
    blocker = tmp_path / "mirror"
    blocker.write_text("a file where the mirror directory should be")  # cannot be opened
    mirror_url = f"file://{blocker}"
    with pytest.warns(MirrorWarning, match="unavailable"):
        store = stashpoint.open(tmp_path / "primary", mirror=mirror_url)
    with store:
        run = store.session("s")
        with pytest.warns(MirrorWarning, match="behind"):
            a = run.checkpoint({"n": 1})
        b = run.checkpoint({"n": 2})
        assert [c.id for c in run.history()] == [b.id, a.id], "the primary has both"
        behind = json.loads(store.primary.meta.get_meta(BEHIND_KEY) or "{}")
        assert behind["mirror"] == mirror_url and "cannot open" in behind["error"]
    blocker.unlink()  # the mirror is back
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        report = compare_stores(store, store.mirror)  # type: ignore[arg-type]
        assert report.ok and report.behind_since is not None
        assert {p.checkpoint for p in report.behind} >= {a.id, b.id}
        c = store.session("s").checkpoint({"n": 3})  # the next write catches up first
        assert store.primary.meta.get_meta(BEHIND_KEY) is None
        report = compare_stores(store, store.mirror)  # type: ignore[arg-type]
        assert report.ok and not report.behind and report.behind_since is None
    with stashpoint.open(mirror_url) as mirror:
        assert [x.id for x in mirror.session("s").history()] == [c.id, b.id, a.id]


def test_a_mirror_failing_mid_run_is_marked_behind(tmp_path: Path) -> None:
    mirror_url = f"file://{tmp_path / 'mirror'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        run = store.session("s")
        run.checkpoint({"n": 1})
        assert isinstance(store, MirroredStore) and store.mirror is not None
        store.mirror.meta.close()  # the mirror goes away under us
        with pytest.warns(MirrorWarning, match="behind"):
            cp = run.checkpoint({"n": 2})
        assert run.head is not None and run.head.id == cp.id
        assert store.primary.meta.get_meta(BEHIND_KEY) is not None


def test_the_mirror_cannot_be_the_primary(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="primary store itself"):
        stashpoint.open(f"file://{tmp_path / 'x'}", mirror=f"file://{tmp_path / 'x'}")


def test_cli_reads_survive_a_damaged_primary_and_verify_names_it(
    tmp_path: Path,
    sp,  # type: ignore[no-untyped-def]
    mirror_url: str,
) -> None:
    """SQLite primary (the default .stashpoint), mirror on files or PostgreSQL, as typed."""
    ws = tmp_path / "proj"
    ws.mkdir()
    text = "the original text, long enough to be stored compressed\n" * 10
    (ws / "doc.txt").write_text(text)
    m = ["--mirror", mirror_url]
    one = json.loads(sp(*m, "snap", "-m", "first", "--json", cwd=ws).out)
    (ws / "doc.txt").write_text("rewritten\n")
    two = json.loads(sp(*m, "snap", "-m", "second", "--json", cwd=ws).out)
    ok = sp(*m, "verify", "--mirror", "--json", cwd=ws)
    assert json.loads(ok.out)["in_sync"] is True

    db = ws / ".stashpoint" / "store.db"
    _flip_record(db, one["id"])
    _flip_blob(db, text.encode())

    res = sp("verify", cwd=ws, check=False)  # no mirror: the damage is there
    assert res.code == 2
    res = sp(*m, "show", one["id"], "--json", cwd=ws)  # served by the mirror
    assert json.loads(res.out)["id"] == one["id"]
    assert "mirror" in res.err
    sp(*m, "rewind", one["id"], cwd=ws)
    assert (ws / "doc.txt").read_text() == text
    assert two["id"][:12] in sp(*m, "log", cwd=ws).out

    res = sp(*m, "verify", "--mirror", "--json", cwd=ws, check=False)
    assert res.code == 2
    report = json.loads(res.out)
    damage = [p["message"] for p in report["damaged"]]
    assert any(one["id"] in d and d.startswith("primary:") for d in damage), damage
    blob = hashlib.sha256(text.encode()).hexdigest()
    assert any(blob in d and d.startswith("primary:") for d in damage), damage
    assert not any(d.startswith("mirror:") for d in damage), "the mirror is intact"

    res = sp("verify", "--mirror", mirror_url, cwd=ws, check=False)  # URL given to verify
    assert res.code == 2 and "damaged: primary:" in res.err
    res = sp("verify", "--mirror", cwd=ws, check=False)
    assert res.code == 1 and "needs a URL" in res.err


def test_cli_mirror_from_the_environment(tmp_path: Path, sp) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess

    from .conftest import STASHPOINT

    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    mirror_url = f"file://{tmp_path / 'm'}"
    env = {**os.environ, "STASHPOINT_MIRROR": mirror_url, "HOME": str(tmp_path)}
    env.pop("STASHPOINT_STORE", None)
    for args in (["snap", "-m", "one"], ["verify", "--mirror", "--json"]):
        proc = subprocess.run([*STASHPOINT, *args], cwd=ws, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["in_sync"] is True
    assert len(list((tmp_path / "m" / "checkpoints").glob("*/*.json"))) == 1


def _mirrored_writer(primary: str, mirror: str, n: int) -> None:
    import os

    with stashpoint.open(primary, mirror=mirror) as store:
        run = store.session("shared")
        for i in range(n):
            run.checkpoint({"messages": [{"pid": os.getpid(), "i": i}], "i": i})


def test_concurrent_writer_processes_share_one_mirror(tmp_path: Path) -> None:
    import multiprocessing

    primary, mirror = str(tmp_path / "primary"), f"file://{tmp_path / 'mirror'}"
    stashpoint.open(primary, mirror=mirror).close()
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_mirrored_writer, args=(primary, mirror, 15)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
        assert w.exitcode == 0
    with stashpoint.open(primary, mirror=mirror) as store:
        assert store.primary.meta.get_meta(BEHIND_KEY) is None, "no copy failed"
        report = compare_stores(store, store.mirror)  # type: ignore[arg-type]
        assert report.ok and not report.behind, report.to_dict()
        assert report.checkpoints == 60


def test_reads_fall_back_when_the_primary_is_unreachable(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha")
    msgs = [{"role": "user", "content": "hi"}]
    with stashpoint.open(tmp_path / "primary", mirror=f"file://{tmp_path / 'm'}") as store:
        cp = store.session("s", workspace=ws).checkpoint({"messages": msgs, "n": 1})
        store.primary.meta.close()  # the primary's database connection is gone
        with pytest.warns(MirrorWarning, match="unreachable"):
            run = store.session("s")
            assert run.head is not None and run.head.id == cp.id
            assert run.state() == {"messages": msgs, "n": 1}
            assert [c.id for c in run.history()] == [cp.id]


def test_the_async_api_takes_a_mirror(tmp_path: Path) -> None:
    import asyncio

    async def main() -> str:
        url, mirror = str(tmp_path / "p"), f"file://{tmp_path / 'm'}"
        async with await stashpoint.open_async(url, mirror=mirror) as store:
            run = await store.session("s")
            cp = await run.checkpoint({"n": 1})
        return cp.id

    ident = asyncio.run(main())
    with stashpoint.open(f"file://{tmp_path / 'm'}") as mirror:
        assert mirror.get(ident).id == ident


def test_cli_refuses_a_bad_mirror_url_and_records_nothing(tmp_path: Path, sp) -> None:  # type: ignore[no-untyped-def]
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    res = sp("--mirror", "bogus://nowhere", "snap", cwd=ws, check=False)
    assert res.code == 1 and "unsupported store URL scheme 'bogus'" in res.err
    if (ws / ".stashpoint").exists():
        with stashpoint.open(ws / ".stashpoint") as store:
            assert store.sessions() == []
    res = sp("--store", "file://", "snap", cwd=ws, check=False)
    assert res.code == 1 and "file:// needs a directory" in res.err


def test_a_checkpoint_copies_only_its_own_branch_head_to_the_mirror(tmp_path: Path) -> None:
    """Replicating a write reads the head of the branch it moved, not every branch's."""
    mirror_url = f"file://{tmp_path / 'm'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        assert isinstance(store, MirroredStore) and store.replicator is not None
        run = store.session("s")
        root = run.checkpoint({"step": 0})
        for i in range(5):
            run.fork(root.id, branch=f"b{i}")
        primary = store.replicator.p.meta
        read: list[str] = []
        get_head = primary.get_head

        def counting(session: str, branch: str) -> str | None:
            read.append(branch)
            return get_head(session, branch)

        primary.get_head = counting  # type: ignore[method-assign]
        on_b2 = store.session("s", branch="b2").checkpoint({"step": 1})
        primary.get_head = get_head  # type: ignore[method-assign]
        assert set(read) == {"b2"}, read
        report = compare_stores(store, store.mirror)  # type: ignore[arg-type]
        assert report.ok and not report.behind, report.to_dict()
    with stashpoint.open(mirror_url) as mirror:
        assert mirror.meta.branches("s")["b2"] == on_b2.id
        assert len(mirror.meta.branches("s")) == 6


def test_artifacts_reach_the_mirror(tmp_path: Path) -> None:
    """An artifact (a chunk list, several content-defined chunks) is copied with its record."""
    import random

    art = tmp_path / "weights.bin"
    content = random.Random(7).randbytes(3 << 20)  # ~6 chunks of 512 KiB on average
    art.write_bytes(content)
    mirror_url = f"file://{tmp_path / 'm'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        cp = store.session("s").checkpoint({"n": 1}, files=False, artifacts={"weights": art})
        assert cp.artifacts["weights"].chunks > 1
        assert isinstance(store, MirroredStore) and store.mirror is not None
        report = compare_stores(store, store.mirror)
        assert report.to_dict()["in_sync"] is True, report.to_dict()
    with stashpoint.open(mirror_url) as mirror:
        assert verify_store(mirror).ok
        got = b"".join(mirror.blobs.iter_content(bytes.fromhex(cp.artifacts["weights"].digest)))
        assert got == content


def test_a_mirror_added_after_prune_and_gc_catches_up(tmp_path: Path) -> None:
    """Pruned records whose contents GC freed are copied without contents, with their marks."""
    from stashpoint import gc, retention

    ws = tmp_path / "ws"
    ws.mkdir()
    primary = tmp_path / "primary"
    with stashpoint.open(primary) as store:
        run = store.session("s", workspace=ws)
        for i in range(4):
            (ws / "f.bin").write_bytes(bytes([i]) * 5000)
            run.checkpoint({"i": i})
        retention.apply(store, retention.plan_session(store, "s", retention.Policy(keep_last=1)))
        assert gc.collect(store, grace=0).freed_blobs > 0
        pruned = store.meta.pruned("s")
    assert len(pruned) == 3
    mirror_url = f"file://{tmp_path / 'm'}"
    with stashpoint.open(primary, mirror=mirror_url) as store:
        (ws / "f.bin").write_text("new")
        store.session("s", workspace=ws).checkpoint({"i": 4})
        assert isinstance(store, MirroredStore) and store.mirror is not None
        assert store.primary.meta.get_meta(BEHIND_KEY) is None
        report = compare_stores(store, store.mirror)
        assert report.to_dict()["in_sync"] is True, report.to_dict()
    with stashpoint.open(mirror_url) as mirror:
        assert mirror.meta.pruned("s") == pruned
        assert verify_store(mirror).ok


def test_pruning_through_a_mirrored_store_marks_the_mirror_too(tmp_path: Path) -> None:
    from stashpoint import retention

    mirror_url = f"file://{tmp_path / 'm'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        run = store.session("s")
        for i in range(3):
            run.checkpoint({"i": i})
        retention.apply(store, retention.plan_session(store, "s", retention.Policy(keep_last=1)))
        assert isinstance(store, MirroredStore) and store.mirror is not None
        assert len(store.primary.meta.pruned("s")) == 2
        assert store.mirror.meta.pruned("s") == store.primary.meta.pruned("s")


def test_a_failure_during_another_writers_catch_up_stays_marked(tmp_path: Path) -> None:
    """Writer 1 syncs a behind mirror; meanwhile writer 2's copy fails. Writer 1 must not
    clear the mark it did not see, so a later write copies writer 2's checkpoint."""
    from stashpoint.errors import StoreError

    primary, mirror_url = tmp_path / "primary", f"file://{tmp_path / 'm'}"
    s1 = stashpoint.open(primary, mirror=mirror_url)
    s2 = stashpoint.open(primary, mirror=mirror_url)
    assert isinstance(s1, MirroredStore) and isinstance(s2, MirroredStore)
    assert s1.replicator is not None and s2.replicator is not None
    s1.primary.meta.set_meta(BEHIND_KEY, json.dumps({"error": "an earlier outage"}))
    real_sync = s1.replicator.sync
    made: list[str] = []

    def boom(ident: str, marks: object = None) -> None:
        raise StoreError("mirror connection reset")

    def sync_then_writer_2() -> None:  # writer 2 runs between writer 1's sync and its clear
        real_sync()
        with pytest.warns(MirrorWarning, match="behind"):
            made.append(s2.session("b").checkpoint({"y": 1}, files=False).id)

    s1.replicator.sync = sync_then_writer_2  # type: ignore[method-assign]
    s2.replicator.checkpoint = boom  # type: ignore[method-assign]
    try:
        s1.session("a").checkpoint({"x": 1}, files=False)
        assert s1.primary.meta.get_meta(BEHIND_KEY) is not None, "writer 2's failure kept"
        s1.replicator.sync = real_sync  # type: ignore[method-assign]
        s1.session("a").checkpoint({"x": 2}, files=False)  # catches up
        assert s1.primary.meta.get_meta(BEHIND_KEY) is None
        assert s1.mirror is not None and s1.mirror.meta.get_checkpoint(made[0]) is not None
        report = compare_stores(s1, s1.mirror)
        assert report.to_dict()["in_sync"] is True, report.to_dict()
    finally:
        s2.close()
        s1.close()


def test_a_label_changed_while_another_writer_copies_it_ends_equal(tmp_path: Path) -> None:
    """Writer 1 reads the primary's label, writer 2 removes it (primary and mirror), then
    writer 1 writes its stale copy to the mirror: writer 1 must notice and copy again."""
    primary, mirror_url = tmp_path / "primary", f"file://{tmp_path / 'm'}"
    s1 = stashpoint.open(primary, mirror=mirror_url)
    s2 = stashpoint.open(primary, mirror=mirror_url)
    assert isinstance(s1, MirroredStore) and s1.replicator is not None
    try:
        cp = s1.session("s").checkpoint({"x": 1}, files=False)
        rep = s1.replicator
        pmeta = rep.p.meta
        real_labels, real_copy = pmeta.labels, rep.labels
        calls: list[int] = []
        copying: list[bool] = []

        def copy_labels(session: str) -> None:
            copying.append(True)
            try:
                real_copy(session)
            finally:
                copying.pop()

        def labels(session: str) -> dict[str, str]:
            out = real_labels(session)
            if copying:
                calls.append(1)
            if len(calls) == 1 and copying:  # writer 1's read for the mirror: writer 2 acts
                s2.session("s").label(cp.id, None)
            return out

        pmeta.labels = labels  # type: ignore[method-assign]
        rep.labels = copy_labels  # type: ignore[method-assign]
        s1.session("s").label(cp.id, "release")
        pmeta.labels = real_labels  # type: ignore[method-assign]
        rep.labels = real_copy  # type: ignore[method-assign]
        assert calls, "the interleaving happened"
        assert s1.primary.meta.labels("s") == {}
        assert s1.mirror is not None and s1.mirror.meta.labels("s") == {}
        assert compare_stores(s1, s1.mirror).to_dict()["in_sync"] is True
    finally:
        s2.close()
        s1.close()


def test_verify_mirror_compares_labels(tmp_path: Path) -> None:
    mirror_url = f"file://{tmp_path / 'm'}"
    with stashpoint.open(tmp_path / "primary", mirror=mirror_url) as store:
        cp = store.session("s").checkpoint({"x": 1}, files=False, label="v1")
        assert isinstance(store, MirroredStore) and store.mirror is not None
        assert compare_stores(store, store.mirror).to_dict()["in_sync"] is True
        store.mirror.meta.set_label(cp.id, "s", "other")  # diverged behind our back
        report = compare_stores(store, store.mirror)
        assert report.ok and not report.to_dict()["in_sync"]
        assert any(p.checkpoint == cp.id and "label" in p.message for p in report.behind)
