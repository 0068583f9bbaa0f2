"""Pending writes of one LangGraph checkpoint stored by two savers at once (two processes,
or two saver objects): none is lost, and a regular channel keeps the write stored first.

The saver keeps a thread's pending writes in one store value; a write reads it, adds to it
and stores it back. Stored with a plain set, the writes another saver stored between that
read and that set were lost. The tests put the other saver's write exactly there (a hook on
the first saver's store, before its write reaches the store), and also let two threads race.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.metakeys import LANGGRAPH_PENDING

from .test_postgres import pg_url  # noqa: F401 - fixture
from .test_redis import redis_url  # noqa: F401 - fixture


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "store")
    return str(request.getfixturevalue(f"{'pg' if request.param == 'postgres' else 'redis'}_url"))


@pytest.fixture
def savers(store_url: str) -> Iterator[tuple[StashpointSaver, StashpointSaver, Any]]:
    """Two savers, each with its own store connection, both having read the thread: a
    checkpoint with no writes yet, and the config of that checkpoint."""
    a, b = StashpointSaver(store_url), StashpointSaver(store_url)
    config = a.put(
        {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
    )
    assert a.get_tuple(config) is not None and b.get_tuple(config) is not None
    yield a, b, config
    a.close()
    b.close()


def _before_its_store_write(saver: StashpointSaver, then: Callable[[], None]) -> None:
    """Run ``then`` once, when ``saver`` is about to store its pending writes (after it read
    them), whichever store call it stores them with."""
    meta = saver.store.meta
    fired: list[bool] = []

    def hook(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(key: str, *args: Any) -> Any:
            if key.startswith(LANGGRAPH_PENDING) and not fired:
                fired.append(True)
                then()
            return real(key, *args)

        return call

    for name in ("set_meta", "swap_meta"):
        real = getattr(meta, name, None)
        if real is not None:
            setattr(meta, name, hook(real))


def _stored(store_url: str, config: Any) -> list[tuple[str, str, Any]]:
    """The checkpoint's pending writes as a new saver reads them from the store."""
    with StashpointSaver(store_url) as fresh:
        got = fresh.get_tuple(config)
        assert got is not None
        return sorted(got.pending_writes or [])


def test_a_write_another_saver_stores_meanwhile_is_kept(
    store_url: str, savers: tuple[StashpointSaver, StashpointSaver, Any]
) -> None:
    a, b, config = savers
    _before_its_store_write(a, lambda: b.put_writes(config, [("ch", "from b")], "task-b"))
    a.put_writes(config, [("ch", "from a")], "task-a")
    assert _stored(store_url, config) == [("task-a", "ch", "from a"), ("task-b", "ch", "from b")]
    # each saver's own view has both, and the next write of each keeps both
    b.put_writes(config, [("ch", "b again")], "task-b2")
    a.put_writes(config, [("ch", "a again")], "task-a2")
    assert [t for t, _c, _v in _stored(store_url, config)] == [
        "task-a",
        "task-a2",
        "task-b",
        "task-b2",
    ]


def test_a_regular_channel_keeps_the_write_stored_first_a_special_one_the_last(
    store_url: str, savers: tuple[StashpointSaver, StashpointSaver, Any]
) -> None:
    a, b, config = savers
    _before_its_store_write(
        a, lambda: b.put_writes(config, [("ch", "b first"), ("__error__", "b's")], "task")
    )
    a.put_writes(config, [("ch", "a second"), ("__error__", "a's")], "task")
    assert _stored(store_url, config) == [("task", "__error__", "a's"), ("task", "ch", "b first")]
    got = a.get_tuple(config)
    assert got is not None and sorted(got.pending_writes or []) == _stored(store_url, config)


def test_two_savers_writing_at_once_lose_no_write(
    store_url: str, savers: tuple[StashpointSaver, StashpointSaver, Any]
) -> None:
    a, b, config = savers
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(saver: StashpointSaver, name: str) -> None:
        try:
            start.wait()
            for i in range(25):
                saver.put_writes(config, [("ch", i)], f"{name}-{i:02}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [t for t, _c, _v in _stored(store_url, config)] == [
        f"{n}-{i:02}" for n in "ab" for i in range(25)
    ]
