"""The shared conformance suite and engine tests against a real Redis server.

Found through STASHPOINT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0); each test uses its
own key prefix and deletes it afterwards. Off CI a missing server skips; under CI=true it fails.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

from stashpoint.errors import ConflictError, StoreError, UsageError
from stashpoint.stores.base import BlobRow, CheckpointRow, Commit, LogAppend, LogInfo, MetadataStore
from stashpoint.testing.conformance import MetadataStoreConformance
from stashpoint.testing.engine import EngineConformance

BASE_URL = os.environ.get("STASHPOINT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_url() -> Iterator[str]:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(BASE_URL)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"Redis at {BASE_URL} is required under CI: {exc}")
        pytest.skip(f"no Redis at {BASE_URL}: {exc}")
    prefix = f"sptest{uuid.uuid4().hex[:10]}:"
    yield f"{BASE_URL}?prefix={prefix}"
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    client.close()


class TestRedisStore(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, redis_url: str) -> Callable[[], MetadataStore]:
        from stashpoint.stores.redis import RedisStore

        return lambda: RedisStore(redis_url)


class TestRedisEngine(EngineConformance):
    @pytest.fixture
    def store_url(self, redis_url: str) -> str:
        return redis_url


def _blob(content: bytes) -> BlobRow:
    return BlobRow(hashlib.sha256(content).digest(), 0, len(content), content)


def test_has_blobs_never_reports_a_blob_swept_between_round_trips(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GC sweep deletes a condemned blob and its mark together; if it lands between two
    round trips of has_blobs, the writer must still see the blob as absent (else it commits
    a reference to a deleted blob)."""
    from stashpoint.stores.redis import RedisStore

    writer, gc = RedisStore(redis_url), RedisStore(redis_url)
    b = _blob(b"content")
    writer.put_blobs([b])
    gc.condemn([b.digest], time.time() - 3600)  # grace long over
    pool = writer._r.connection_pool
    real, trips = pool.get_connection, [0]

    def sweep_before_second_trip(*args: Any, **kwargs: Any) -> Any:
        trips[0] += 1
        if trips[0] == 2:
            gc.sweep_blobs([b.digest], time.time())
        return real(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", sweep_before_second_trip)
    assert writer.has_blobs([b.digest]) == set()
    monkeypatch.undo()
    assert writer.has_blobs([b.digest]) == set()  # swept or still condemned: absent either way
    writer.close()
    gc.close()


def test_url_passes_redis_parameters_through(redis_url: str) -> None:
    import redis

    from stashpoint.stores.redis import RedisStore

    st = RedisStore(f"{redis_url}&db=5")
    other = redis.Redis.from_url(f"{BASE_URL}?db=5")  # a query db wins over the path's
    try:
        st.set_meta("k", "v")
        key = st.prefix + b"meta"
        assert other.exists(key) and not redis.Redis.from_url(BASE_URL).exists(key)
        with pytest.raises(UsageError):
            RedisStore(f"{redis_url}&nosuch=1")  # no longer ignored: it reaches redis-py
    finally:
        other.delete(st.prefix + b"meta")
        other.close()
        st.close()


def test_blob_scans_raise_store_error(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    from stashpoint.stores.redis import RedisStore

    st = RedisStore(redis_url)

    def gone(*args: Any, **kwargs: Any) -> Any:
        raise redis.exceptions.ConnectionError("Connection refused")

    monkeypatch.setattr(st._r, "scan", gone)
    with pytest.raises(StoreError):
        list(st.iter_blob_digests())
    with pytest.raises(StoreError):
        list(st.iter_blob_info())
    st.close()


def test_refused_new_log_leaves_nothing_behind(redis_url: str) -> None:
    """A write that creates a log but fails its tip check writes nothing, log included."""
    from stashpoint.stores.redis import RedisStore

    st = RedisStore(redis_url)
    msgs = [(b"\0" * 32, b"m")]
    with pytest.raises(ConflictError):  # start 1, but a new log's tip is its parent_len 0
        st.append_log(LogAppend("L1", 1, msgs, LogInfo("s", None, 0, 0)))
    row = CheckpointRow("01A", "s", "main", None, b"body", "digest")
    with pytest.raises(ConflictError):
        st.commit(Commit(row, None, LogAppend("L2", 1, msgs, LogInfo("s", None, 0, 0))))
    assert st.log_info("L1") is None and st.log_info("L2") is None
    assert list(st.iter_logs()) == [] and st.get_checkpoint("01A") is None
    st.close()


def test_prefix_glob_characters_do_not_match_other_stores(redis_url: str) -> None:
    """SCAN MATCH is a glob: prefixes ``p?:``, ``p*``, ``p[A]:`` and ``p\\A:`` would all match
    the blobs of store ``pA:``, which GC would then count as its own garbage."""
    from stashpoint.stores.redis import RedisStore

    base = redis_url.rpartition("prefix=")[2]  # fixture's prefix: cleaned up afterwards

    def store(suffix: str) -> RedisStore:
        return RedisStore(f"{BASE_URL}?prefix={quote(base + suffix)}")

    owner = store("A:")
    owner.put_blobs([_blob(b"owner's")])
    for suffix in ("?:", "*", "[A]:", "\\A:"):
        st = store(suffix)
        own = _blob(suffix.encode())
        st.put_blobs([own])
        assert list(st.iter_blob_digests()) == [own.digest], suffix
        assert [i.digest for i in st.iter_blob_info()] == [own.digest], suffix
        st.close()
    owner.close()
