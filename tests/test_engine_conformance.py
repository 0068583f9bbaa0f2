"""The engine-level conformance suite (``stashpoint.testing.engine``) on every backend here.

PostgreSQL and Redis run it in tests/test_postgres.py and tests/test_redis.py (and through
PgBouncer in tests/test_pgbouncer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stashpoint.testing.engine import EngineConformance


class TestSqliteEngine(EngineConformance):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite://{tmp_path / 'store'}"


class TestMemoryEngine(EngineConformance):
    multiprocess = False

    @pytest.fixture
    def store_url(self) -> str:
        return "memory://"
