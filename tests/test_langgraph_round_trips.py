"""What a LangGraph turn sends to the store: the saver does not fetch back the messages its own
puts just wrote; on PostgreSQL a store-level value is set in one statement, not a transaction
block of three, and a ``put_writes`` of a saver alone on its thread is one statement (a swap of
its pending writes, not a read and a set).

A turn of a chat graph starts with ``get_tuple`` of the thread's latest checkpoint; the saver
keeps the messages it read before, and its puts appended the turn's new ones: reading those back
from the store was one more query per turn, for bytes the saver had just sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.testing.graphs import chat_graph

from .test_postgres import pg_url  # noqa: F401 - fixture


def _graph(saver: StashpointSaver) -> Any:
    return chat_graph(saver)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "store")


def test_a_turn_reads_back_none_of_the_messages_its_puts_wrote(store_url: str) -> None:
    saver = StashpointSaver(store_url)
    graph = _graph(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    graph.invoke({"messages": [HumanMessage(content="hello")]}, config, durability="sync")
    saver.get_tuple(config)  # the saver's first read of the line: from the store
    read: list[tuple[str, int, int]] = []
    real = saver.store.read_messages

    def counted(log: str, start: int, stop: int) -> Any:
        read.append((log, start, stop))
        return real(log, start, stop)

    saver.store.read_messages = counted  # type: ignore[method-assign]
    for turn in range(2, 6):
        graph.invoke({"messages": [HumanMessage(content=f"q{turn}")]}, config, durability="sync")
    assert read == []  # every turn's get_tuple found its messages in the saver's view
    ours = saver.get_tuple(config)
    fresh = StashpointSaver(store_url)  # what the store holds, read and verified anew
    theirs = fresh.get_tuple(config)
    assert ours is not None and theirs is not None
    assert ours.checkpoint == theirs.checkpoint
    assert [m.content for m in ours.checkpoint["channel_values"]["messages"]] == [
        x for t in range(1, 6) for x in ("hello" if t == 1 else f"q{t}", f"answer {t}")
    ]
    assert list(saver.list(config)) == list(fresh.list(config))
    fresh.close()
    saver.close()


def test_a_view_is_not_extended_with_rows_that_do_not_match_the_record(store_url: str) -> None:
    """The rows a put would add to a view are its items chained from the view's last link:
    they are taken only when they end at the record's hash, else the view is left to the store."""
    from stashpoint.model import LogRef

    saver = StashpointSaver(store_url)
    graph = _graph(saver)
    config: Any = {"configurable": {"thread_id": "chat"}}
    graph.invoke({"messages": [HumanMessage(content="hello")]}, config, durability="sync")
    got = saver.get_tuple(config)
    assert got is not None
    conv = saver.record(got.config).state.conversation
    assert conv is not None
    view = saver._views.get(conv.log)
    assert view is not None and len(view.rows) == conv.length
    before = list(view.rows)
    wrong = LogRef(conv.log, conv.length + 1, "00" * 32)
    saver._views.wrote(wrong, ["x"] * (conv.length + 1))
    assert view.rows == before
    saver.close()


def test_setting_a_store_value_on_postgres_is_one_statement(pg_url: str) -> None:  # noqa: F811
    import psycopg

    from stashpoint.stores.postgres import PostgresStore

    store = PostgresStore(pg_url)
    sent: list[str] = []
    blocks: list[int] = []
    execute, transaction = psycopg.Cursor.execute, psycopg.Connection.transaction
    libpq = PostgresStore._libpq_call

    def counted_execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *a, **k)

    def counted_libpq(self: Any, sql: bytes, *a: Any) -> Any:
        sent.append(sql.decode())
        return libpq(self, sql, *a)

    def counted_transaction(self: Any, *a: Any, **k: Any) -> Any:
        blocks.append(1)
        return transaction(self, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(psycopg.Cursor, "execute", counted_execute)
    mp.setattr(psycopg.Connection, "transaction", counted_transaction)
    mp.setattr(PostgresStore, "_libpq_call", counted_libpq)
    try:
        store.set_meta("k", "one")
        store.set_meta("k", "two")  # over an existing value
        store.set_meta("gone", None)  # deleting what is not there
    finally:
        mp.undo()
    assert len(sent) == 3 and blocks == []  # one statement each, no BEGIN / COMMIT
    other = PostgresStore(pg_url)  # committed: another connection sees it
    assert other.get_meta("k") == "two"
    store.set_meta("k", None)
    assert other.get_meta("k") is None
    other.close()
    store.close()


def test_a_put_writes_of_a_saver_alone_on_its_thread_is_one_statement(
    pg_url: str,  # noqa: F811
) -> None:
    """The pending writes are swapped over the value the saver last stored, with no read
    before: a read is needed only when another saver's swap got there first."""
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint

    from stashpoint.stores.postgres import PostgresStore

    saver = StashpointSaver(pg_url)
    config = saver.put(
        {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
    )
    assert saver.get_tuple(config) is not None
    sent: list[str] = []
    execute, libpq = psycopg.Cursor.execute, PostgresStore._libpq_call

    def counted_execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        sent.append(str(query).split()[0])
        return execute(self, query, *a, **k)

    def counted_libpq(self: Any, sql: bytes, *a: Any) -> Any:
        sent.append(sql.decode().split()[0])
        return libpq(self, sql, *a)

    mp = pytest.MonkeyPatch()
    mp.setattr(psycopg.Cursor, "execute", counted_execute)
    mp.setattr(PostgresStore, "_libpq_call", counted_libpq)
    try:
        saver.put_writes(config, [("ch", 1)], "first")  # the thread's first: an insert
        saver.put_writes(config, [("ch", 2), ("other", 3)], "second")
    finally:
        mp.undo()
    assert sent == ["INSERT", "UPDATE"]
    got = StashpointSaver(pg_url).get_tuple(config)
    assert got is not None and sorted(got.pending_writes or []) == [
        ("first", "ch", 1),
        ("second", "ch", 2),
        ("second", "other", 3),
    ]
    saver.close()
