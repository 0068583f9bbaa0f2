"""The shared metadata-store conformance suite, run against every backend available here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stashpoint.stores.base import Capability, Fence, LeaseInfo, MetadataStore
from stashpoint.stores.memory import MemoryStore
from stashpoint.stores.sqlite import SqliteStore
from stashpoint.testing.conformance import (
    BlobBackendConformance,
    LeaseConformance,
    MetadataStoreConformance,
    RetentionConformance,
)


class TestMemoryStore(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], MetadataStore]:
        return MemoryStore


class _NoLeases(MemoryStore):
    """A backend that declares no leases: the suite must not run that tier on it."""

    capabilities = frozenset(Capability) - {Capability.LEASES}

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        raise NotImplementedError

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        raise NotImplementedError

    def release_lease(self, fence: Fence) -> None:
        raise NotImplementedError


class TestStoreWithoutLeases(LeaseConformance, RetentionConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], MetadataStore]:
        return _NoLeases


class TestSqliteStore(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], MetadataStore]:
        return lambda: SqliteStore(tmp_path / "store.db")

    def test_file_is_private_and_reopens(self, tmp_path: Path) -> None:
        path = tmp_path / "p.db"
        s = SqliteStore(path)
        s.set_meta("k", "v")
        s.close()
        assert path.stat().st_mode & 0o777 == 0o600
        s2 = SqliteStore(path)
        assert s2.get_meta("k") == "v"
        s2.close()

    def test_newer_schema_is_refused(self, tmp_path: Path) -> None:
        import sqlite3

        from stashpoint.errors import SchemaVersionError

        path = tmp_path / "new.db"
        SqliteStore(path).close()
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version=99")
        db.commit()
        db.close()
        with pytest.raises(SchemaVersionError, match="upgrade stashpoint"):
            SqliteStore(path)


class TestLocalBlobStore(BlobBackendConformance):
    @pytest.fixture
    def make_backend(self, tmp_path: Path) -> Callable[[], object]:
        from stashpoint.blobs.local import LocalBlobStore

        return lambda: LocalBlobStore(tmp_path / "blobs")


class TestFileStore(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], MetadataStore]:
        from stashpoint.stores.files import FileStore

        return lambda: FileStore(tmp_path / "files")
