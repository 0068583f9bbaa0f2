"""Store format 1 -> 2: stores written by an older stashpoint are read as they are and converted
by ``stashpoint upgrade``, crash-safely.

The format-1 stores are real ones, written by the code that defined the format (commit
71a6899), checked in under tests/data/v1 with the script that made them. PostgreSQL and Redis
format-1 stores are built from the SQLite one: copied by today's code, then stripped of what
format 2 added to those backends (the ``auth`` column and the new ``sp_commit`` on PostgreSQL,
the ``headauth:``/``labelauth:`` hashes on Redis, the format key): the only differences
between the two versions' backends (``git diff 71a6899 -- src/stashpoint/stores``).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import IntegrityError, UpgradeRequired, UsageError
from stashpoint.stores.base import MetadataStore
from stashpoint.stores.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from stashpoint.testing.conformance import MetadataStoreConformance
from stashpoint.testing.engine import EngineConformance

from .conftest import Result
from .test_crash import NARROW, cli_env, measure, run_killed
from .test_postgres import pg_url  # noqa: F401 - fixture
from .test_redis import redis_url  # noqa: F401 - fixture

Sp = Callable[..., Result]
V1 = Path(__file__).parent / "data" / "v1"
KEY = bytes(range(32))  # the keyed fixture's integrity key (make_v1_fixture.KEY)
RUNTIME = {".gitignore", "lock", "store.db-wal", "store.db-shm", "store.db-writers", "gc.lock"}
"""Files an open makes beside a store (locks, an empty WAL, the never-commit-me note)."""


@pytest.fixture(autouse=True)
def own_witness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every copy of a fixture is the same store to a rollback witness (same store id): each
    test keeps its own witness, so one test's upgraded copy is not compared with another's."""
    monkeypatch.setenv("STASHPOINT_WITNESS_DIR", str(tmp_path / "witness"))


def v1_copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / f"v1-{name}"
    shutil.copytree(V1 / name, dest)
    return dest


def url_of(store: Path) -> str:
    return f"file://{store}" if (store / "meta.json").exists() else str(store)


def files_of(root: Path) -> dict[str, str]:
    """Every file of a store and its SHA-256, without what an open adds beside the data."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or rel.parts[0] in ("cache", "locks") or path.name in RUNTIME:
            continue
        out[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
    wal = root / "store.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "a read wrote to the WAL"
    return out


def history(sp: Sp, url: str, cwd: Path) -> dict[str, Any]:
    """What a user sees of the fixture's history: ids, digests, labels, states per session."""
    out = {}
    for session in ("main", "other"):
        log = json.loads(sp("--store", url, "--session", session, "log", "--json", cwd=cwd).out)
        out[session] = [(e["id"], e.get("digest"), e.get("label"), e["branch"]) for e in log]
    return out


def head_of(seen: dict[str, Any]) -> str:
    """The ``main`` branch's head in a :func:`history` (its newest entry on that branch)."""
    return str(next(e[0] for e in seen["main"] if e[3] == "main"))


@pytest.fixture(params=["plain", "files"])
def v1_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return v1_copy(request.param, tmp_path)


# -- reading without upgrading --------------------------------------------------------------


def test_reading_a_v1_store_works_and_changes_no_byte(
    sp: Sp, v1_store: Path, tmp_path: Path
) -> None:
    url = url_of(v1_store)
    before = files_of(v1_store)
    seen = history(sp, url, tmp_path)
    assert [e[2] for e in seen["main"]].count("done") == 1 and len(seen["other"]) == 2
    main = seen["main"]
    sp("--store", url, "log", "--graph", cwd=tmp_path)
    shown = json.loads(sp("--store", url, "show", "HEAD", "--json", cwd=tmp_path).out)
    assert shown["state"]["step"] == 2 and len(shown["state"]["messages"]) == 3
    diff = sp("--store", url, "diff", "HEAD~1", "HEAD", cwd=tmp_path).out
    assert "second notes" in diff and "thanks" in diff
    report = json.loads(sp("--store", url, "verify", "--json", cwd=tmp_path).out)
    assert report["ok"] and report["format"] == 1
    assert "stashpoint upgrade" in sp("--store", url, "verify", cwd=tmp_path).out
    with stashpoint.open(url) as store:
        assert store.format == 1
        run = store.session("main")
        assert run.state("start")["step"] == 1
        assert set(store.branches("main")) == {"main", "alt"}
        assert {cp.id for cp in store.records("main")} == {e[0] for e in main}
    assert files_of(v1_store) == before


def test_the_web_ui_reads_a_v1_store_without_writing(v1_store: Path) -> None:
    from starlette.testclient import TestClient

    from stashpoint.webui import create_app

    token, port = "t" * 32, 8765
    before = files_of(v1_store)
    with stashpoint.open(url_of(v1_store)) as store:
        head = store.branches("main")["main"]
        client = TestClient(
            create_app(store, token=token, port=port),
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token}"},
        )
        for page in ("/", "/s/main", f"/s/main/c/{head}", "/s/other", "/s/main/live.json"):
            got = client.get(page)
            assert got.status_code == 200, (page, got.text[:500])
        assert "thanks" in client.get(f"/s/main/c/{head}").text
    assert files_of(v1_store) == before


def test_a_write_to_a_v1_store_is_refused_and_creates_nothing(
    sp: Sp, v1_store: Path, tmp_path: Path
) -> None:
    url = url_of(v1_store)
    before = files_of(v1_store)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(random.Random(1).randbytes(3 << 20))  # chunks, loose files
    for f in range(40):
        (ws / f"f{f}.txt").write_text(f"file {f}\n")  # packs
    for args in (
        ["snap", "-m", "x"],
        ["label", "HEAD", "new"],
        ["gc"],
        ["prune", "--all", "--keep-last", "1"],
    ):
        res = sp("--store", url, *args, cwd=ws, check=False)
        assert res.code == 1, (args, res.err)
        assert "stashpoint" in res.err and "upgrade" in res.err, (args, res.err)
    with stashpoint.open(url) as store, pytest.raises(UpgradeRequired):
        store.session("main").checkpoint({"n": 1})
    assert files_of(v1_store) == before


# -- upgrading ------------------------------------------------------------------------------


def test_upgrade_converts_a_v1_store_and_keeps_its_history(
    sp: Sp, v1_store: Path, tmp_path: Path
) -> None:
    url = url_of(v1_store)
    seen = history(sp, url, tmp_path)
    before = files_of(v1_store)
    dry = json.loads(sp("--store", url, "upgrade", "--dry-run", "--json", cwd=tmp_path).out)
    assert dry == {
        **dry,
        "format_before": 1,
        "format_after": 1,
        "heads": 3,
        "labels": 2,
        "signed": 5,
        "dry_run": True,
    }
    assert files_of(v1_store) == before, "--dry-run wrote"
    done = json.loads(sp("upgrade", "--store", url, "--json", cwd=tmp_path).out)
    assert done["format_after"] == 2 and done["signed"] == 5 and done["refs_checked"] == 5
    report = json.loads(sp("--store", url, "verify", "--json", cwd=tmp_path).out)
    assert report["ok"] and report["format"] == 2
    assert history(sp, url, tmp_path) == seen
    # The backend's own version moved on: a program that wrote format 1 refuses the store.
    if (v1_store / "store.db").exists():
        db = sqlite3.connect(v1_store / "store.db")
        assert db.execute("PRAGMA user_version").fetchone()[0] == SQLITE_SCHEMA > 3
        assert db.execute("SELECT COUNT(*) FROM heads WHERE auth = '1'").fetchone()[0] == 3
        db.close()
    else:
        meta = json.loads((v1_store / "meta.json").read_text())
        assert meta["layout_version"] == "2" and meta["format"] == "2"
    again = sp("--store", url, "upgrade", cwd=tmp_path).out
    assert "nothing to do" in again
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("after\n")
    snap = json.loads(sp("--store", url, "snap", "-m", "after", "--json", cwd=ws).out)
    with stashpoint.open(url) as store:
        assert store.format == 2
        assert store.get(snap["id"]).parent == head_of(seen)
        assert store.meta.head_row("main", "main") == (snap["id"], "2")  # numbered 1, moved


def test_keyed_v1_store_is_upgraded_only_with_its_key(tmp_path: Path) -> None:
    store_dir = v1_copy("keyed", tmp_path)
    before = files_of(store_dir)
    # Format 1 did not record that a chain is keyed: the upgrade checks the records instead,
    # and refuses to sign refs it could not verify.
    with pytest.raises(IntegrityError, match="nothing was upgraded"):
        stashpoint.upgrade_store(store_dir, key=b"")
    with pytest.raises(IntegrityError):
        stashpoint.upgrade_store(store_dir, key=bytes(32))  # another key
    assert files_of(store_dir) == before
    with stashpoint.open(store_dir, key=KEY) as store:  # read as it is, with the key
        assert store.format == 1 and len(store.records("main")) == 4
    assert files_of(store_dir) == before
    report = stashpoint.upgrade_store(store_dir, key=KEY)
    assert report.keyed and report.signed == 5 and report.format_after == 2
    with stashpoint.open(store_dir, key=KEY) as store:
        assert store.refs.signer.strict  # marked: every ref must carry a MAC from now on
        head = store.branches("main")["main"]
        start = store.resolve("start", "main")
    with pytest.raises(UsageError, match="keyed hash chain"):
        stashpoint.open(store_dir, key=b"")  # now the store says it is keyed
    db = sqlite3.connect(store_dir / "store.db")
    with db:  # an attacker moves the head back, keeping its MAC'd auth string
        db.execute("UPDATE heads SET checkpoint=? WHERE checkpoint=?", (start, head))
    db.close()
    with (
        stashpoint.open(store_dir, key=KEY, accept_rollback=True) as store,
        pytest.raises(IntegrityError, match="MAC"),
    ):
        store.branches("main")


def test_encrypted_v1_store_is_read_and_upgraded_with_its_key(tmp_path: Path) -> None:
    """Encryption keys the chain: the refs are signed with the key derived from it."""
    from stashpoint.errors import EncryptionKeyError
    from stashpoint.verify import verify_store

    key = bytes(range(1, 33))  # make_v1_fixture.ENCRYPTION_KEY
    store_dir = v1_copy("encrypted", tmp_path)
    before = files_of(store_dir)
    with pytest.raises(EncryptionKeyError):
        stashpoint.upgrade_store(store_dir, encryption_key=b"")
    with stashpoint.open(store_dir, encryption_key=key) as store:
        assert store.format == 1
        assert store.session("main").state()["messages"][-1]["content"] == "noted"
    assert files_of(store_dir) == before
    report = stashpoint.upgrade_store(store_dir, encryption_key=key)
    assert report.keyed and report.signed == 2 and report.format_after == 2
    with stashpoint.open(store_dir, encryption_key=key) as store:
        assert store.refs.signer.strict and verify_store(store).ok
        assert store.session("main").state()["messages"][0]["content"] == "secret plan"


def test_v1_bundle_imports(sp: Sp, tmp_path: Path) -> None:
    source = v1_copy("plain", tmp_path)
    expected = history(sp, str(source), tmp_path)["main"]
    dest = tmp_path / "dest"
    dest.mkdir()
    sp("import", str(V1 / "main.spb"), cwd=dest)
    imported = json.loads(sp("log", "--json", cwd=dest).out)
    assert [(e["id"], e.get("digest")) for e in imported] == [(e[0], e[1]) for e in expected]
    report = json.loads(sp("verify", "--json", cwd=dest).out)
    assert report["ok"] and report["format"] == 2
    # Into a v1 store it is a write like any other: refused until the store is upgraded.
    res = sp("--store", str(source), "import", str(V1 / "main.spb"), "--as", "x", check=False)
    assert res.code == 1 and "upgrade" in res.err


# -- kill -9 at random instants of an upgrade -----------------------------------------------

UPGRADE_KILLS = 25
SEED = 20261126


def _kill_upgrades(
    sp: Sp,
    tmp_path: Path,
    url: Callable[[], str],
    fresh: Callable[[], None],
    env: dict[str, str],
    *,
    kills: int,
    seed: int,
    name: str,
) -> None:
    """``kill -9`` of ``stashpoint upgrade`` at random instants until ``kills`` were killed
    mid-way. After each kill the store opens as format 1 or 2 (never neither), verifies and
    shows the same history; the upgrade run again finishes it."""
    seen = history(sp, url(), tmp_path)
    duration = measure(lambda: sp("--store", url(), "upgrade"), 3, reset=fresh)
    rng = random.Random(seed)
    killed = 0
    outcomes: dict[int, int] = {1: 0, 2: 0}
    for i in range(4 * kills):
        if killed == kills:
            break
        fresh()
        code, _ = run_killed(["--store", url(), "upgrade"], tmp_path, env, rng.uniform(0, duration))
        killed += code != 0
        duration *= NARROW if code == 0 else 1  # finished first: see measure()
        report = json.loads(sp("--store", url(), "verify", "--json", cwd=tmp_path).out)
        assert report["ok"], (i, report)
        outcomes[report["format"]] += 1
        assert history(sp, url(), tmp_path) == seen, f"kill {i}"
        sp("--store", url(), "upgrade", cwd=tmp_path)
        report = json.loads(sp("--store", url(), "verify", "--json", cwd=tmp_path).out)
        assert report["ok"] and report["format"] == 2, (i, report)
        assert history(sp, url(), tmp_path) == seen, f"kill {i}, upgraded again"
    assert killed == kills, f"only {killed} upgrades were killed mid-way"
    print(f"upgrade kills ({name}): {killed}; opened afterwards as format 1/2: {outcomes}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "files"])
def test_upgrade_killed_at_random_instants_leaves_a_v1_or_v2_store(
    sp: Sp, tmp_path: Path, name: str
) -> None:
    """After each kill the store opens as format 1 or 2 (never neither), verifies, shows the
    same history, and the upgrade run again finishes it."""
    store = tmp_path / "store"

    def fresh() -> None:
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(V1 / name, store)

    fresh()
    _kill_upgrades(
        sp,
        tmp_path,
        lambda: url_of(store),
        fresh,
        cli_env(tmp_path),
        kills=UPGRADE_KILLS,
        seed=SEED,
        name=name,
    )


class _Crash(BaseException):
    """Stands for the process dying: nothing after it runs (not an Exception: no handler of
    the code under test catches it)."""


def _stop_after(monkeypatch: pytest.MonkeyPatch, cls: type, steps: int) -> list[str]:
    """Make the upgrade's writes through ``cls`` stop dead before write number ``steps``."""
    from stashpoint.stores import migrate

    done: list[str] = []

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def write(*args: Any, **kwargs: Any) -> Any:
            if len(done) == steps:
                raise _Crash
            done.append(name)
            return real(*args, **kwargs)

        return write

    for name in ("set_head", "set_label", "set_meta"):
        monkeypatch.setattr(cls, name, counted(name, getattr(cls, name)))
    finish = counted("finish", migrate._finish_file_store)
    monkeypatch.setattr(migrate, "_finish_file_store", finish)
    return done


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sql_upgrade_stopped_inside_its_transaction_leaves_v1(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """SQLite and PostgreSQL convert in one transaction: stopped after any number of ref
    updates, the store is exactly the v1 one (the transaction rolled back, the schema change
    with it)."""
    from stashpoint.stores.refauth import RefSigner

    if backend == "sqlite":
        store: str | Path = v1_copy("plain", tmp_path)
        snapshot: Callable[[], Any] = lambda: files_of(Path(store))  # noqa: E731
    else:
        store = request.getfixturevalue("pg_url")
        monkeypatch.setenv("STASHPOINT_WITNESS", "off")
        make_pg_v1(store, tmp_path)
        snapshot = lambda: pg_rows(str(store))  # noqa: E731
    before = snapshot()
    real = RefSigner.auth
    for stop in range(5):
        calls: list[int] = []

        def auth(self: RefSigner, *args: Any, stop: int = stop, calls: list[int] = calls) -> str:
            if len(calls) == stop:
                raise _Crash
            calls.append(1)
            return real(self, *args)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(RefSigner, "auth", auth)
            with pytest.raises(_Crash):
                stashpoint.upgrade_store(store)
        assert snapshot() == before, f"stopped after {stop} ref(s)"
        with stashpoint.open(store) as opened:
            assert opened.format == 1
    assert stashpoint.upgrade_store(store).format_after == 2


@pytest.mark.parametrize("backend", ["files", "redis"])
def test_upgrade_stopped_after_every_step_leaves_a_v1_or_v2_store(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """The step-by-step backends, stopped at every step boundary (each step itself is one
    atomic write): the store opens as format 1 until the last step and as 2 after it, reads
    the same history, verifies, and the upgrade run again finishes it."""
    from stashpoint.verify import verify_store

    if backend == "files":
        from stashpoint.stores.files import FileStore as cls

        def fresh() -> str:
            store = tmp_path / "store"
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(V1 / "files", store)
            return f"file://{store}"
    else:
        from stashpoint.stores.redis import RedisStore as cls

        url = request.getfixturevalue("redis_url")
        make_redis_v1(url, tmp_path)
        saved = redis_dump(url)

        def fresh() -> str:
            import redis

            client = redis.Redis.from_url(url.split("?")[0])
            for key in client.scan_iter(match=url.split("prefix=")[1] + "*"):
                client.delete(key)
            for key, value in saved.items():
                client.restore(key, 0, value)
            client.close()
            return url

    def state(url: str) -> tuple[int, Any]:
        with stashpoint.open(url, accept_rollback=True) as store:
            assert verify_store(store).ok
            return store.format, {
                s: (store.branches(s), store.refs.labels(s), [c.id for c in store.records(s)])
                for s in store.sessions()
            }

    _, seen = state(fresh())
    steps = 6  # 3 heads, 2 labels, the format key
    formats_seen = []
    for stop in range(steps + 1):
        url = fresh()
        with pytest.MonkeyPatch.context() as mp:
            done = _stop_after(mp, cls, stop)
            try:
                stashpoint.upgrade_store(url)
            except _Crash:
                pass
        assert len(done) == stop
        fmt, got = state(url)
        assert got == seen, f"stopped after {stop} step(s)"
        formats_seen.append(fmt)
        assert stashpoint.upgrade_store(url).format_after == 2
        assert state(url) == (2, seen)
    assert formats_seen == [1] * steps + [2]


# -- PostgreSQL and Redis -------------------------------------------------------------------


def _copy_v1(url: str, tmp_path: Path) -> None:
    from stashpoint.copy import copy_sessions

    with stashpoint.open(v1_copy("plain", tmp_path)) as src, stashpoint.open(url) as dest:
        copy_sessions(src, dest)


def make_pg_v1(url: str, tmp_path: Path) -> None:
    import psycopg

    _copy_v1(url, tmp_path)
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DROP FUNCTION sp_commit")
        db.execute("ALTER TABLE sp_heads DROP COLUMN auth")
        db.execute("ALTER TABLE sp_labels DROP COLUMN auth")
        db.execute("UPDATE sp_version SET version = 3")
        db.execute("DELETE FROM sp_meta WHERE key = 'format'")


def pg_rows(url: str) -> list[Any]:
    import psycopg

    with psycopg.connect(url) as db:
        return [
            sorted(db.execute(f"SELECT * FROM sp_{t}").fetchall(), key=repr)
            for t in ("meta", "heads", "labels", "checkpoints", "messages", "blobs", "version")
        ]


def make_redis_v1(url: str, tmp_path: Path) -> None:
    import redis

    _copy_v1(url, tmp_path)
    prefix = url.split("prefix=")[1]
    client = redis.Redis.from_url(url.split("?")[0])
    for pattern in ("headauth:*", "labelauth:*"):
        for key in client.scan_iter(match=prefix + pattern):
            client.delete(key)
    client.hdel(f"{prefix}meta", "format")
    client.close()


def redis_dump(url: str) -> dict[bytes, bytes]:
    import redis

    prefix = url.split("prefix=")[1]
    client = redis.Redis.from_url(url.split("?")[0])
    out = {k: client.dump(k) for k in sorted(client.scan_iter(match=prefix + "*"))}
    client.close()
    return out


@pytest.mark.parametrize("backend", ["postgresql", "redis"])
def test_v1_store_on_a_server_is_read_as_it_is_then_upgraded(
    request: pytest.FixtureRequest,
    sp: Sp,
    tmp_path: Path,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if backend == "postgresql":
        url = request.getfixturevalue("pg_url")
        make_pg_v1(url, tmp_path)
        snapshot: Callable[[str], Any] = pg_rows
    else:
        url = request.getfixturevalue("redis_url")
        make_redis_v1(url, tmp_path)
        snapshot = redis_dump
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")  # the copy's witness saw numbered heads
    before = snapshot(url)
    seen = history(sp, url, tmp_path)
    report = json.loads(sp("--store", url, "verify", "--json", cwd=tmp_path).out)
    assert report["ok"] and report["format"] == 1
    with stashpoint.open(url) as store, pytest.raises(UpgradeRequired):
        store.session("main").checkpoint({"n": 1})
    assert snapshot(url) == before, "reading (or a refused write) changed the store"
    done = json.loads(sp("--store", url, "upgrade", "--json", cwd=tmp_path).out)
    assert done["format_after"] == 2 and done["signed"] == 5
    report = json.loads(sp("--store", url, "verify", "--json", cwd=tmp_path).out)
    assert report["ok"] and report["format"] == 2
    assert history(sp, url, tmp_path) == seen
    with stashpoint.open(url) as store:
        run = store.session("main")
        cp = run.checkpoint({"n": 1})  # the server-side commit of format 2 is in place
        assert cp.parent == head_of(seen)


SERVER_KILLS = 12


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["redis", "postgresql"])
def test_server_upgrade_killed_at_random_instants(
    request: pytest.FixtureRequest,
    sp: Sp,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    """``kill -9`` of ``stashpoint upgrade`` against Redis (steps) and PostgreSQL (one
    transaction, which the server rolls back when the client dies)."""
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")
    if backend == "redis":
        import redis

        url = request.getfixturevalue("redis_url")
        make_redis_v1(url, tmp_path)
        prefix = url.split("prefix=")[1]
        saved = redis_dump(url)
        client = redis.Redis.from_url(url.split("?")[0])

        def fresh() -> None:
            for key in client.scan_iter(match=prefix + "*"):
                client.delete(key)
            for key, value in saved.items():
                client.restore(key, 0, value)
    else:
        import psycopg

        url = request.getfixturevalue("pg_url")
        schema = url.rsplit("%3D", 1)[1]

        def fresh() -> None:
            with psycopg.connect(url, autocommit=True) as db:
                db.execute(f"DROP SCHEMA {schema} CASCADE")
                db.execute(f"CREATE SCHEMA {schema}")
            make_pg_v1(url, tmp_path / "copy")
            shutil.rmtree(tmp_path / "copy")

        fresh()

    try:
        _kill_upgrades(
            sp,
            tmp_path,
            lambda: url,
            fresh,
            {**cli_env(tmp_path), "STASHPOINT_WITNESS": "off"},
            kills=SERVER_KILLS,
            seed=SEED + 1,
            name=backend,
        )
    finally:
        if backend == "redis":
            client.close()


# -- the conformance suites on upgraded v1 stores -------------------------------------------


@pytest.fixture(params=["empty", "plain"])
def upgraded_v1(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A store v1 code created and never wrote, and one holding v1 history, upgraded."""
    store = v1_copy(request.param, tmp_path)
    assert stashpoint.upgrade_store(store).format_after == 2
    yield store / "store.db"


class TestUpgradedV1Engine(EngineConformance):
    @pytest.fixture
    def store_url(self, upgraded_v1: Path) -> str:
        return f"sqlite://{upgraded_v1}"


class TestUpgradedV1FileEngine(EngineConformance):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        store = v1_copy("files", tmp_path)
        assert stashpoint.upgrade_store(f"file://{store}").format_after == 2
        return f"file://{store}"


class TestUpgradedV1SqliteStore(MetadataStoreConformance):
    """The backend suite counts what it wrote: an empty store (one v1 code created)."""

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], MetadataStore]:
        from stashpoint.stores.sqlite import SqliteStore

        store = v1_copy("empty", tmp_path)
        assert stashpoint.upgrade_store(store).format_after == 2
        return lambda: SqliteStore(store / "store.db")
