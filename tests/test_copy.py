"""``stashpoint copy`` between real stores: SQLite -> PostgreSQL -> Redis -> SQLite, conflicts,
idempotent re-runs, and a destination that does not verify."""

from __future__ import annotations

import json
import os
import random
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

import stashpoint
from stashpoint.blobs.objects import CHUNK_SIZE
from stashpoint.errors import ConflictError, NotFoundError
from stashpoint.restore_target import RestoreRefused
from stashpoint.stores.base import CheckpointRow, Commit

from .conftest import snapshot_tree
from .test_postgres import pg_url  # noqa: F401 - fixture: a fresh schema per test
from .test_redis import redis_url  # noqa: F401 - fixture: a fresh key prefix per test


def _history(sp: Any, ws: Path) -> None:
    """Two sessions: files (one chunked), a label, a conversation, a rewind and a fork."""
    rng = random.Random(7)
    (ws / "notes.txt").write_text("one\n")
    (ws / "big.bin").write_bytes(rng.randbytes(CHUNK_SIZE + 4321))
    sp("snap", "-m", "one", "--label", "start", cwd=ws)
    (ws / "notes.txt").write_text("two\n")
    sp("snap", "-m", "two", cwd=ws)
    sp("rewind", "start", cwd=ws)
    with stashpoint.open(ws / ".stashpoint") as store:
        run = store.session("agent")
        msgs = [{"role": "user", "content": "hi"}]
        run.checkpoint({"messages": msgs, "plan": [1]})
        run.checkpoint({"messages": [*msgs, {"role": "assistant", "content": "yo"}]})


def _view(sp: Any, store: str, ws: Path) -> dict[str, Any]:
    out = {}
    for session in ("main", "agent"):
        log = json.loads(sp("--store", store, "--session", session, "log", "--json", cwd=ws).out)
        out[session] = log
    return out


def test_round_trip_sqlite_postgres_redis_sqlite(
    sp: Any,
    tmp_path: Path,
    pg_url: str,  # noqa: F811
    redis_url: str,  # noqa: F811
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _history(sp, ws)
    src = str(ws / ".stashpoint")
    back = str(tmp_path / "back")
    want = _view(sp, src, ws)
    hops = [(src, pg_url), (pg_url, redis_url), (redis_url, back)]
    for a, b in hops:
        rep = json.loads(sp("copy", "--from", a, "--to", b, "--json", cwd=tmp_path).out)
        assert rep["verified"] is True and rep["problems"] == []
        assert sorted(rep["sessions"]) == ["agent", "main"]
        assert rep["checkpoints"] == sum(len(v) for v in want.values())
        assert rep["blobs"] > 0 and rep["bytes"] >= CHUNK_SIZE
        assert json.loads(sp("--store", b, "verify", "--json", cwd=tmp_path).out)["ok"]
        assert _view(sp, b, ws) == want  # ids, parents, labels, messages: the same history

    # Idempotent: a re-run writes nothing and still verifies.
    again = json.loads(sp("copy", "--from", src, "--to", pg_url, "--json", cwd=tmp_path).out)
    assert again["checkpoints"] == 0 and again["blobs"] == 0 and again["verified"] is True
    assert again["present"] == sum(len(v) for v in want.values())

    # What came back restores the same files and state.
    with stashpoint.open(back) as store:
        other = tmp_path / "other"
        other.mkdir()
        with pytest.raises(RestoreRefused, match="bound to no directory"):
            store.session("main", workspace=other).rewind(store.resolve("start", "main"))
        assert list(other.iterdir()) == []  # a copied session chooses no directory itself
        run = store.session("main", workspace=other, bind=True)  # named: restored there
        run.rewind(store.resolve("start", "main"))
        assert snapshot_tree(other) == {
            k: v for k, v in snapshot_tree(ws).items() if k in ("notes.txt", "big.bin")
        }
        assert store.session("agent").state()["messages"][-1]["content"] == "yo"


def test_one_session_and_human_output(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _history(sp, ws)
    dest = tmp_path / "dest"
    res = sp("copy", "--from", str(ws / ".stashpoint"), "--to", str(dest), "--session", "agent")
    assert "copied 1 session(s) (agent): 2 checkpoint(s)" in res.out and "verified" in res.out
    with stashpoint.open(dest) as store:
        assert store.sessions() == ["agent"]
    missing = sp(
        "copy",
        "--from",
        str(ws / ".stashpoint"),
        "--to",
        str(dest),
        "--session",
        "nope",
        check=False,
    )
    assert missing.code == 1 and "no checkpoints" in missing.err
    nowhere = sp("copy", "--from", str(tmp_path / "absent"), "--to", str(dest), check=False)
    assert nowhere.code == 1 and not (tmp_path / "absent").exists()
    typo = sp("copy", "--from", f"file://{tmp_path / 'abs'}", "--to", str(dest), check=False)
    assert typo.code == 1 and "no store at" in typo.err and not (tmp_path / "abs").exists()


def test_conflicting_id_is_refused_and_nothing_is_lost(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _history(sp, ws)
    src, dest = str(ws / ".stashpoint"), str(tmp_path / "dest")
    with stashpoint.open(src) as s, stashpoint.open(dest) as d:
        # The destination holds a record with one of the source's ids but other contents
        # (validly sealed there: not damage, a different record).
        first = s.session("agent").history()[-1]
        forged = msgspec.structs.replace(first, meta={"other": "store"}, digest="")
        sealed, body = d.hasher.seal(forged)
        row = CheckpointRow(sealed.id, "agent", sealed.branch, None, body, sealed.digest)
        d.meta.commit(Commit(row, None))
        before = d.meta.get_checkpoint(first.id)
    res = sp("copy", "--from", src, "--to", dest, "--json", check=False)
    assert res.code == 3, res.err
    assert first.id in res.err and "other contents" in res.err
    with stashpoint.open(dest) as d:
        assert d.meta.get_checkpoint(first.id) == before  # not overwritten
        assert len(d.meta.list_checkpoints("agent")) == 1  # nothing of that session written


def test_diverged_branch_is_a_conflict(tmp_path: Path) -> None:
    from stashpoint.copy import copy_sessions

    with stashpoint.open(tmp_path / "a") as a, stashpoint.open(tmp_path / "b") as b:
        a.session("s").checkpoint({"v": 1})
        copy_sessions(a, b)
        a.session("s").checkpoint({"v": "a"})
        b.session("s").checkpoint({"v": "b"})
        with pytest.raises(ConflictError, match="another history"):
            copy_sessions(a, b)
        with pytest.raises(NotFoundError):
            copy_sessions(a, b, sessions=["nope"])
        with pytest.raises(ConflictError, match="same store"):
            copy_sessions(a, a)


def test_destination_that_does_not_verify_exits_2(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _history(sp, ws)
    src, dest = str(ws / ".stashpoint"), tmp_path / "dest"
    sp("copy", "--from", src, "--to", str(dest))
    # Damage a blob in the destination: a re-run skips it as present, then verify catches it.
    db = sqlite3.connect(dest / "store.db")
    digest, data = db.execute("SELECT digest, data FROM blobs WHERE length(data) > 8").fetchone()
    db.execute("UPDATE blobs SET data=? WHERE digest=?", (bytes(data[:-1]) + b"!", digest))
    db.commit()
    db.close()
    res = sp("copy", "--from", src, "--to", str(dest), "--json", check=False)
    assert res.code == 2, res.err
    rep = json.loads(res.out)
    assert rep["verified"] is False and rep["problems"]
    assert "does not verify" in res.err


def test_printable_url_masks_every_password() -> None:
    from stashpoint.copy import printable_url

    assert printable_url("redis://:s3cret@cache:6379/0") == "redis://:***@cache:6379/0"
    assert printable_url("postgresql://u:s3cret@h/db?x=1") == "postgresql://u:***@h/db?x=1"
    assert (
        printable_url("postgresql://h/db?password=s3cret&options=-c%3D1&sslPassword=s3cret")
        == "postgresql://h/db?password=***&options=-c%3D1&sslPassword=***"
    )
    assert printable_url("redis://h/0?auth_token=s3cret&client_secret=s3cret&db=0") == (
        "redis://h/0?auth_token=***&client_secret=***&db=0"
    )
    for plain in ("sqlite:///tmp/x?blobs=s3://b/p", "/tmp/a/.stashpoint", "redis://user@h/0"):
        assert printable_url(plain) == plain


def test_copy_output_and_errors_never_show_a_password(
    sp: Any,
    tmp_path: Path,
    pg_url: str,  # noqa: F811
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hi\n")
    sp("snap", "-m", "one", cwd=ws)
    src = str(ws / ".stashpoint")
    # The test server trusts local connections: the passwords are ignored, yet must not show.
    in_userinfo = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert "s3cret" in in_userinfo
    in_query = f"{pg_url}&password=s3cret"
    for url in (in_query, in_userinfo):
        res = sp("copy", "--from", src, "--to", url, cwd=tmp_path)
        assert "s3cret" not in res.out + res.err and "***" in res.out
        rep = json.loads(sp("copy", "--from", src, "--to", url, "--json", cwd=tmp_path).out)
        assert "s3cret" not in json.dumps(rep) and rep["verified"]
        missing = sp(
            "copy", "--from", url, "--to", str(tmp_path / "x"), "--session", "nope", check=False
        )
        assert missing.code == 1 and "no checkpoints" in missing.err
        assert "s3cret" not in missing.out + missing.err


def test_rerun_carries_label_changes(tmp_path: Path) -> None:
    from stashpoint.copy import copy_sessions

    with stashpoint.open(tmp_path / "a") as a, stashpoint.open(tmp_path / "b") as b:
        run = a.session("s")
        one = run.checkpoint({"x": 1}, files=False, label="v1")
        two = run.checkpoint({"x": 2}, files=False, label="draft")
        three = run.checkpoint({"x": 3}, files=False)
        copy_sessions(a, b)
        assert b.session("s").labels() == a.session("s").labels()
        run.label(one.id, "release")  # changed
        run.label(two.id, None)  # removed
        run.label(three.id, "good")  # added to a record the destination already has
        rep = copy_sessions(a, b)
        assert rep.checkpoints == 0 and rep.present == 3 and rep.verified
        assert b.session("s").labels() == {one.id: "release", three.id: "good"}
        assert b.session("s").labels() == a.session("s").labels()


def test_copy_into_a_leased_session_writes_nothing(tmp_path: Path) -> None:
    from stashpoint.copy import copy_sessions
    from stashpoint.errors import LeaseHeld

    with stashpoint.open(tmp_path / "a") as a, stashpoint.open(tmp_path / "b") as b:
        hi = {"role": "user", "content": "hi"}
        cp = a.session("s").checkpoint({"messages": [hi]}, files=False)
        copy_sessions(a, b)
        a.session("s").checkpoint(
            {"messages": [hi, {"role": "assistant", "content": "yo"}]}, files=False
        )
        a.session("s").label(cp.id, "start")
        assert cp.state.conversation is not None
        log = cp.state.conversation.log
        before = (b.meta.log_info(log), b.meta.labels("s"), b.meta.list_checkpoints("s"))
        lease = b.lease("s", ttl=60)  # another worker owns the session in the destination
        try:
            with pytest.raises(LeaseHeld):
                copy_sessions(a, b)
            assert (b.meta.log_info(log), b.meta.labels("s"), b.meta.list_checkpoints("s")) == (
                before
            )
        finally:
            lease.release()
        copy_sessions(a, b)  # once released, the copy goes through
        assert b.meta.log_info(log) == a.meta.log_info(log)


def test_stores_sealed_under_different_keys_copy_a_session_as_a_new_one(
    tmp_path: Path,
) -> None:
    """A keyed chain verifies only under its own key: a copy between a plain and an encrypted
    store (or two keys) is refused up front, naming --as; copied as a new session, its
    records are sealed again under the destination's key, with new ids, and verify there."""
    import secrets

    from stashpoint.copy import copy_sessions
    from stashpoint.errors import UsageError

    key = secrets.token_bytes(32)
    with stashpoint.open(tmp_path / "plain") as plain:
        run = plain.session("agent")
        run.checkpoint({"x": 1})
        last = run.checkpoint({"x": 2})
        with stashpoint.open(tmp_path / "enc", encryption_key=key) as enc:
            with pytest.raises(UsageError, match="--as NEW"):
                copy_sessions(plain, enc)
            assert enc.sessions() == []
            report = copy_sessions(plain, enc, sessions=["agent"], as_session="vault")
            assert report.verified and report.sessions == ["vault"]
            copied = enc.session("vault")
            history = copied.history()  # verified under the store's key
            assert [copied.state(cp)["x"] for cp in history] == [2, 1]
            assert history[0].meta["stashpoint_import"]["id"] == last.id
            assert last.id not in {cp.id for cp in history}
            # ... and back out, from the encrypted store into a plain one
            with stashpoint.open(tmp_path / "plain2") as back:
                copy_sessions(enc, back, sessions=["vault"], as_session="agent")
                assert [
                    back.session("agent").state(c)["x"] for c in back.session("agent").history()
                ] == [2, 1]


def test_cli_copy_into_an_encrypted_store_as_a_new_session(tmp_path: Path) -> None:
    import secrets
    import subprocess

    from .conftest import STASHPOINT

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("plain words\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    env["HOME"] = str(tmp_path)

    def sp(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
        e = dict(env, **({"STASHPOINT_KEY": key} if key else {}))
        return subprocess.run([*STASHPOINT, *args], cwd=ws, env=e, capture_output=True, text=True)

    assert sp("snap", "-m", "one").returncode == 0
    key = secrets.token_hex(32)
    vault = str(tmp_path / "vault")
    refused = sp("copy", "--from", ".stashpoint", "--to", vault, key=key)
    assert refused.returncode == 1 and "--as NEW" in refused.stderr
    done = sp(
        "copy",
        "--from",
        ".stashpoint",
        "--to",
        vault,
        "--session",
        "main",
        "--as",
        "main",
        "--json",
        key=key,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verified"] is True
    assert sp("--store", vault, "verify", key=key).returncode == 0
    assert b"plain words" not in b"".join(
        p.read_bytes() for p in Path(vault).rglob("*") if p.is_file()
    )
