"""The shared conformance suite and engine tests against a real Redis server.

Found through STASHPOINT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0); each test uses its
own key prefix and deletes it afterwards. Off CI a missing server skips; under CI=true it fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from stashpoint.stores.base import MetadataStore
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
