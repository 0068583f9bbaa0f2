"""The same conformance suite and engine tests against a real PostgreSQL server.

The server is found through STASHPOINT_TEST_POSTGRES_URL (default: the local trust-auth
server, database ``test``). Each test gets its own schema. Off CI a missing server skips with
the reason; under CI=true it fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stashpoint.stores.base import MetadataStore
from stashpoint.stores.postgres import _COMMIT
from stashpoint.testing.conformance import MetadataStoreConformance
from stashpoint.testing.engine import EngineConformance

BASE_URL = os.environ.get(
    "STASHPOINT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _server_or_skip() -> None:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(BASE_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL at {BASE_URL} is required under CI: {exc}")
        pytest.skip(f"no PostgreSQL at {BASE_URL}: {exc}")


@pytest.fixture
def pg_url() -> Iterator[str]:
    _server_or_skip()
    import psycopg

    schema = "sp_" + uuid.uuid4().hex[:12]
    with psycopg.connect(BASE_URL, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in BASE_URL else "?"
    yield f"{BASE_URL}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(BASE_URL, autocommit=True) as db:
        db.execute(f"DROP SCHEMA {schema} CASCADE")


class TestPostgresStore(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, pg_url: str) -> Callable[[], MetadataStore]:
        from stashpoint.stores.postgres import PostgresStore

        return lambda: PostgresStore(pg_url)


def _open_and_count(url: str) -> int:
    import stashpoint

    with stashpoint.open(url) as store:
        return len(store.sessions())


def test_many_processes_opening_a_new_store_at_once_migrate_it_once(pg_url: str) -> None:
    import multiprocessing

    import psycopg

    from stashpoint.stores.postgres import SCHEMA_VERSION

    with multiprocessing.get_context("spawn").Pool(6) as pool:
        assert pool.map(_open_and_count, [pg_url] * 6) == [0] * 6
    with psycopg.connect(pg_url) as db:
        assert db.execute("SELECT version FROM sp_version").fetchall() == [(SCHEMA_VERSION,)]


def test_an_older_schema_is_read_as_it_is_and_upgraded_on_request(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store written by an older schema version (no leases, no server-side commit, no ref
    auth) keeps its checkpoints: a newer stashpoint brings it to format 1's schema as that
    version did, reads it without writing, refuses writes until `upgrade`, and afterwards
    writes, leases and commits on the server as usual."""
    import psycopg

    import stashpoint
    from stashpoint.errors import UpgradeRequired

    # An older version kept no rollback witness; this one must not compare the store, whose
    # head loses its sequence number below, with what it saw a moment ago.
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")

    with stashpoint.open(pg_url) as store:
        first = store.session("s").checkpoint({"n": 1})
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("DROP FUNCTION sp_commit")
        db.execute("DROP FUNCTION sp_append")
        db.execute("DROP TABLE sp_leases")
        db.execute("ALTER TABLE sp_heads DROP COLUMN auth")
        db.execute("ALTER TABLE sp_labels DROP COLUMN auth")
        db.execute("UPDATE sp_version SET version = 2")
    with stashpoint.open(pg_url) as store:
        assert store.format == 1
        run = store.session("s")
        assert run.state(first.id) == {"n": 1}
        with pytest.raises(UpgradeRequired):
            run.checkpoint({"n": 2})
    assert stashpoint.upgrade_store(pg_url).format_after == 2
    with stashpoint.open(pg_url) as store:
        run = store.session("s")
        second = run.checkpoint({"n": 2})
        assert second.parent == first.id and run.state(first.id) == {"n": 1}
        lease = store.lease("s")
        assert lease.token == 1
        lease.release()


class TestPostgresEngine(EngineConformance):
    @pytest.fixture
    def store_url(self, pg_url: str) -> str:
        return pg_url


def test_libpq_options_with_spaces_survive_the_url(pg_url: str) -> None:
    """Several ``-c`` settings in ``options`` are separated by spaces; stashpoint takes its own
    parameters out of the query and must hand the rest to libpq as %20, not "+"."""
    import stashpoint

    url = pg_url + "%20-cstatement_timeout%3D4321&pool_max=2"
    with stashpoint.open(url) as store:
        rows = store.backend._read("SHOW statement_timeout")  # type: ignore[attr-defined]
        assert rows[0][0] == "4321ms"
        store.session("s").checkpoint({"ok": True})


def test_a_store_whose_pool_is_gone_says_so_on_every_path(pg_url: str) -> None:
    """Reads, transactions and the libpq hot path (a checkpoint's commit) all take their
    connection the same way: a closed pool is a StoreError naming the cause, never
    psycopg_pool's own exception."""
    import stashpoint
    from stashpoint.errors import StoreError

    store = stashpoint.open(pg_url)
    session = store.session("s")
    session.checkpoint({"n": 0})  # the head is known: the next checkpoint goes to commit
    meta = store.meta
    meta.close()  # type: ignore[attr-defined]
    for attempt in (
        lambda: session.checkpoint({"n": 1}),
        lambda: meta.get_meta("x"),
        lambda: meta.set_meta("x", "1"),
        lambda: meta.sessions(),
    ):
        with pytest.raises(StoreError, match="no PostgreSQL connection"):
            attempt()


def _prepared_names(store: object) -> list[str]:
    """The statements prepared on the store's one pooled connection (``pool_max=1``)."""
    with store._conn() as conn:  # type: ignore[attr-defined]
        rows = conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name").fetchall()
    return [r[0] for r in rows]


def test_a_checkpoint_runs_as_a_prepared_statement_and_survives_the_server_forgetting_it(
    pg_url: str,
) -> None:
    import stashpoint

    with stashpoint.open(pg_url + "&pool_max=1") as store:
        session = store.session("s")
        session.checkpoint({"step": 0})
        session.checkpoint({"step": 1})
        names = _prepared_names(store.backend)
        assert names and all(n.startswith("stashpoint_") for n in names)
        commit = store.backend._names[_COMMIT].decode()  # type: ignore[attr-defined]
        assert commit in names  # besides it: store values read and set at open
        # What a transaction pooler does to us: the next server connection lacks the statement.
        with store.backend._conn() as conn:  # type: ignore[attr-defined]
            conn.execute("DEALLOCATE ALL")
        third = session.checkpoint({"step": 2})  # runs unprepared; nothing lost, nothing twice
        session.checkpoint({"step": 3})
        assert _prepared_names(store.backend) == []  # turned off for the store: never again
        history = session.history()
        assert [c.id for c in history][1] == third.id
        assert [session.state(c)["step"] for c in history] == [3, 2, 1, 0]


def test_prepare_false_in_the_url_prepares_nothing(pg_url: str) -> None:
    import stashpoint

    with stashpoint.open(pg_url + "&pool_max=1&prepare=false") as store:
        for i in range(3):
            store.session("s").checkpoint({"step": i})
        assert _prepared_names(store.backend) == []
        assert len(store.session("s").history()) == 3


def test_commits_storing_the_same_new_blobs_in_opposite_orders_all_land(pg_url: str) -> None:
    """Each writer inserts blobs in digest order: in caller order, two commits sharing new
    blobs waited for each other's rows and PostgreSQL killed one (a lost checkpoint)."""
    import hashlib
    import threading

    from stashpoint.stores.base import BlobRow, CheckpointRow, Commit
    from stashpoint.stores.postgres import PostgresStore

    store = PostgresStore(pg_url + "&pool_max=2")
    failures: list[BaseException] = []
    for rnd in range(3):
        blobs = [
            BlobRow(hashlib.sha256(f"{rnd}-{i}".encode()).digest(), 0, 10, b"x" * 10)
            for i in range(800)
        ]
        barrier = threading.Barrier(2)

        def commit(
            name: str, rows: list[BlobRow], rnd: int = rnd, barrier: threading.Barrier = barrier
        ) -> None:
            row = CheckpointRow(f"0{rnd}{name}", f"s{rnd}{name}", "main", None, b"b", "d")
            barrier.wait()
            try:
                store.commit(Commit(row, None, blobs=rows))
            except BaseException as exc:
                failures.append(exc)

        threads = [
            threading.Thread(target=commit, args=("A", blobs)),
            threading.Thread(target=commit, args=("B", blobs[::-1])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert failures == []
    assert len(store.has_blobs(b.digest for b in blobs)) == 800
    store.close()


def test_a_deadlock_the_server_broke_is_a_conflict_to_retry(pg_url: str) -> None:
    """PostgreSQL rolls a deadlock victim back whole: the session may retry it, so it is a
    ConflictError, not a StoreError that would end the agent's checkpoint."""
    import threading

    from stashpoint.errors import ConflictError
    from stashpoint.stores.postgres import PostgresStore

    store = PostgresStore(pg_url + "&pool_max=2")
    store.set_meta("a", "0")
    store.set_meta("b", "0")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def cross(first: str, second: str) -> None:
        def do(cur: object) -> None:
            store._exec(cur, "UPDATE {t}meta SET value='1' WHERE key=?", (first,))
            barrier.wait()
            store._exec(cur, "UPDATE {t}meta SET value='1' WHERE key=?", (second,))

        try:
            store._tx(do)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=cross, args=p) for p in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and isinstance(errors[0], ConflictError), errors
    assert "deadlock" in str(errors[0])
    store.close()


def test_a_pooled_connection_that_died_while_idle_fails_a_commit_with_a_store_error(
    pg_url: str,
) -> None:
    """The first commit on a connection prepares its statement; on a dead connection the
    prepare fails and the plain call raised psycopg's own error, past the error mapping."""
    import psycopg

    from stashpoint.errors import StoreError
    from stashpoint.stores.base import CheckpointRow, Commit
    from stashpoint.stores.postgres import PostgresStore

    store = PostgresStore(pg_url + "&pool_max=1")
    (pid,) = store._read("SELECT pg_backend_pid()")[0]
    with psycopg.connect(BASE_URL, autocommit=True) as db:
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    row = CheckpointRow("01A", "s", "main", None, b"body", "d")
    with pytest.raises(StoreError, match="PostgreSQL failed"):
        store.commit(Commit(row, None))
    store.commit(Commit(row, None))  # the pool replaced the broken connection
    assert store.get_head("s", "main") == "01A"
    store.close()


def test_an_application_role_without_create_rights_opens_an_up_to_date_store(
    pg_url: str,
) -> None:
    """The usual deployment: the owner migrates, the agents connect as a role that may read
    and write the tables and call the functions but not create anything."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    import stashpoint

    if urlsplit(pg_url).password:
        pytest.skip("the test role logs in without a password (a trust-auth server)")
    schema = pg_url.rsplit("%3D", 1)[1]
    role = "sp_app_" + uuid.uuid4().hex[:8]
    stashpoint.open(pg_url).close()  # migrated by the owner
    with psycopg.connect(BASE_URL, autocommit=True) as db:
        db.execute(f"CREATE ROLE {role} LOGIN")
        db.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        db.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
        db.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}")
    try:
        parts = urlsplit(pg_url)
        app_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))
        with stashpoint.open(app_url) as store:
            session = store.session("s")
            session.checkpoint({"n": 1})
            assert session.state() == {"n": 1}
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as db:
            db.execute(f"DROP OWNED BY {role}")
            db.execute(f"DROP ROLE {role}")


def test_a_rewind_racing_retention_never_leaves_a_pruned_head(pg_url: str) -> None:
    """mark_pruned checks the heads and then inserts its mark; READ COMMITTED let a head move
    to that checkpoint commit in between (a pruned head: GC frees what it points to). The
    race is made certain: another transaction holds a mark row for the same checkpoint, so
    mark_pruned waits at its insert while the head move runs."""
    import threading
    import time

    import psycopg

    from stashpoint.errors import PrunedError
    from stashpoint.stores.base import CheckpointRow, Commit
    from stashpoint.stores.postgres import PostgresStore

    store = PostgresStore(pg_url + "&pool_max=3")
    store.commit(Commit(CheckpointRow("01X", "s", "main", None, b"b", "d"), None))
    store.commit(Commit(CheckpointRow("01Y", "s", "main", "01X", b"b", "d"), "01X"))
    parked = psycopg.connect(pg_url)  # a transaction left open
    parked.execute("INSERT INTO sp_pruned VALUES ('01X', 's', 'parked')")

    def waiting() -> int:
        with psycopg.connect(BASE_URL, autocommit=True) as db:
            row = db.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone()
        return int(row[0]) if row else 0

    out: dict[str, object] = {}

    def prune() -> None:
        out["pruned"] = store.mark_pruned("s", ["01X"], "now")

    def rewind() -> None:
        try:
            store.set_head("s", "main", "01X", "01Y")
            out["rewind"] = "moved"
        except PrunedError:
            out["rewind"] = "refused"

    pruner = threading.Thread(target=prune)
    pruner.start()
    deadline = time.monotonic() + 30
    while waiting() < 1 and time.monotonic() < deadline:  # parked at its insert
        time.sleep(0.02)
    mover = threading.Thread(target=rewind)
    mover.start()
    while mover.is_alive() and waiting() < 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # the move waits for the pruner's session lock (or has finished)
    parked.rollback()
    parked.close()
    pruner.join(30)
    mover.join(30)
    heads, pruned = store.branches("s"), store.pruned("s")
    assert not ("01X" in heads.values() and "01X" in pruned), (heads, pruned)
    assert (out, heads, list(pruned)) == (
        {"pruned": ["01X"], "rewind": "refused"},
        {"main": "01Y"},
        ["01X"],
    )
    store.close()


def test_a_head_or_label_moved_in_the_database_is_refused_in_a_keyed_store(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker edits sp_heads / sp_labels directly (no key): the MAC on the row fails,
    on read and in verify. Put back, the store reads again."""
    import psycopg

    import stashpoint
    from stashpoint.errors import IntegrityError
    from stashpoint.verify import verify_store

    monkeypatch.setenv("STASHPOINT_WITNESS_DIR", str(tmp_path / "witness"))
    key = bytes(range(32))
    with stashpoint.open(pg_url, key=key) as store:
        run = store.session("s")
        ids = [run.checkpoint({"n": i}).id for i in range(4)]
        run.label(ids[3], "L3")
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("UPDATE sp_heads SET checkpoint=%s WHERE session='s'", (ids[1],))
    with stashpoint.open(pg_url, key=key) as store:
        assert not verify_store(store).ok
        with pytest.raises(IntegrityError, match="does not match its MAC"):
            store.session("s").state()
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute("UPDATE sp_heads SET checkpoint=%s WHERE session='s'", (ids[3],))
        db.execute("UPDATE sp_labels SET checkpoint=%s WHERE label='L3'", (ids[0],))
    with stashpoint.open(pg_url, key=key) as store:
        assert store.session("s").state() == {"n": 3}
        with pytest.raises(IntegrityError, match="label 'L3'"):
            store.resolve("L3", "s")
