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
from stashpoint.testing.conformance import MetadataStoreConformance

from .backend_checks import (
    check_concurrent_writers,
    check_durable_run_resumes,
    check_rewind_round_trip,
)

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


def test_checkpoint_rewind_and_verify_on_postgres(pg_url: str, tmp_path: Path) -> None:
    check_rewind_round_trip(pg_url, tmp_path)


def test_concurrent_writers_on_postgres_lose_nothing(pg_url: str) -> None:
    check_concurrent_writers(pg_url)


def test_a_durable_run_resumes_on_postgres(pg_url: str) -> None:
    check_durable_run_resumes(pg_url)
