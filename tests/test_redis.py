"""The shared conformance suite and engine tests against a real Redis server.

Found through STASHPOINT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0); each test uses its
own key prefix and deletes it afterwards. Off CI a missing server skips; under CI=true it fails.
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


def test_checkpoint_rewind_and_verify_on_redis(redis_url: str, tmp_path: Path) -> None:
    from stashpoint.verify import verify_store

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    (ws / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))
    with stashpoint.open(redis_url) as store:
        run = store.session("s", workspace=ws)
        before = snapshot_tree(ws)
        cp = run.checkpoint({"messages": [{"role": "user", "content": "hi"}], "plan": [1]})
        (ws / "a.txt").write_text("two")
        (ws / "big.bin").unlink()
        run.checkpoint({"messages": [{"role": "user", "content": "hi"}, {"role": "ai"}]})
        run.rewind(cp.id)
        assert snapshot_tree(ws) == before
        assert run.state() == {"messages": [{"role": "user", "content": "hi"}], "plan": [1]}
        assert verify_store(store).ok


def _writer(url: str, n: int) -> None:
    with stashpoint.open(url) as store:
        run = store.session("shared")
        for i in range(n):
            run.checkpoint({"messages": [{"pid": os.getpid(), "i": i}], "i": i})


def test_concurrent_writers_on_redis_lose_nothing(redis_url: str) -> None:
    procs, per = 4, 20
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(redis_url, per)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(180)
        assert w.exitcode == 0
    with stashpoint.open(redis_url) as store:
        history = store.session("shared").history()
    assert len(history) == procs * per
    parents = [c.parent for c in history if c.parent]
    assert len(parents) == len(set(parents)) == procs * per - 1
