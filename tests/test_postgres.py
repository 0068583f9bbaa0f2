"""The same conformance suite and engine tests against a real PostgreSQL server.

The server is found through STASHPOINT_TEST_POSTGRES_URL (default: the local trust-auth
server, database ``test``). Each test gets its own schema. Off CI a missing server skips with
the reason; under CI=true it fails.
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import stashpoint
from stashpoint.stores.base import MetadataStore
from stashpoint.testing.conformance import MetadataStoreConformance

from .conftest import snapshot_tree

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


@pytest.fixture
def request_close() -> Iterator[Callable[[stashpoint.Store], None]]:
    opened: list[stashpoint.Store] = []
    yield opened.append
    for store in opened:
        store.close()


def test_checkpoint_rewind_and_verify_on_postgres(
    pg_url: str, tmp_path: Path, request_close: Callable[[stashpoint.Store], None]
) -> None:
    from stashpoint.verify import verify_store

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    (ws / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # chunks go to the database too
    store = stashpoint.open(pg_url)
    request_close(store)
    run = store.session("s", workspace=ws)
    before = snapshot_tree(ws)
    cp = run.checkpoint({"messages": [{"role": "user", "content": "hi"}], "plan": [1, 2]})
    (ws / "a.txt").write_text("two")
    (ws / "big.bin").unlink()
    run.checkpoint(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "ai", "content": "yo"}]}
    )
    run.rewind(cp.id)
    assert snapshot_tree(ws) == before
    assert run.state() == {"messages": [{"role": "user", "content": "hi"}], "plan": [1, 2]}
    assert verify_store(store).ok


def _writer(url: str, n: int) -> None:
    with stashpoint.open(url) as store:
        run = store.session("shared")
        for i in range(n):
            run.checkpoint({"messages": [{"pid": os.getpid(), "i": i}], "i": i})


def test_concurrent_writers_on_postgres_lose_nothing(pg_url: str) -> None:
    stashpoint.open(pg_url).close()  # create the schema once, before the race
    procs, per = 4, 20
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(pg_url, per)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(180)
        assert w.exitcode == 0
    with stashpoint.open(pg_url) as store:
        history = store.session("shared").history()
    assert len(history) == procs * per
    parents = [c.parent for c in history if c.parent]
    assert len(parents) == len(set(parents)) == procs * per - 1
