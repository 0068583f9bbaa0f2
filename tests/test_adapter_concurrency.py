"""Several writers on one session through the framework adapters: nothing is lost.

Two session objects (or four processes) appending to one OpenAI Agents SDK session id keep
every item, each writer's in its own order, as the SDK's own ``SQLiteSession`` does (the
reference each test also runs against); the same for Pydantic AI histories saved by several
writers and for LangGraph checkpoints of one thread put by two savers. A cancelled
``add_items`` adds all its items or none, and is settled when the cancellation is raised.
"""

from __future__ import annotations

import asyncio
import datetime
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents.memory import SQLiteSession
from langgraph.checkpoint.base import empty_checkpoint
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

import stashpoint
from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.integrations.openai_agents import StashpointSession
from stashpoint.integrations.pydantic_ai import MessageHistory

from .test_postgres import pg_url  # noqa: F401 - fixture

IMPLS = ["stashpoint", "sdk-sqlite"]


def _open(impl: str, where: Path, sid: str = "s") -> Any:
    """A session object on the shared store (stashpoint) or database file (the SDK's)."""
    if impl == "stashpoint":
        return StashpointSession(sid, str(where / "store"))
    return SQLiteSession(sid, where / "sdk.db")


def _close(session: Any) -> None:
    session.close()


def _item(writer: int, i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"w{writer}-{i}"}


def _check_all_kept(contents: list[str], writers: int, each: int) -> None:
    """Every writer's items are there once, in that writer's order."""
    assert len(contents) == writers * each, f"kept {len(contents)} of {writers * each}"
    assert len(set(contents)) == len(contents)
    for w in range(writers):
        mine = [c for c in contents if c.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{i}" for i in range(each)]


def _contents(items: list[Any]) -> list[str]:
    return [str(item["content"]) for item in items]


# -- OpenAI Agents SDK: session objects in one process ------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_agents_two_session_objects_keep_every_item(tmp_path: Path, impl: str) -> None:
    writers, each = 2, 10
    _close(_open(impl, tmp_path))  # create the store / database before the race

    async def main() -> list[Any]:
        sessions = [_open(impl, tmp_path) for _ in range(writers)]

        async def write(w: int) -> None:
            for i in range(each):
                await sessions[w].add_items([_item(w, i)])

        await asyncio.gather(*(write(w) for w in range(writers)))
        for s in sessions:
            _close(s)
        reader = _open(impl, tmp_path)
        try:
            return list(await reader.get_items())
        finally:
            _close(reader)

    _check_all_kept(_contents(asyncio.run(main())), writers, each)


@pytest.mark.parametrize("impl", IMPLS)
def test_agents_session_objects_in_threads_keep_every_item(tmp_path: Path, impl: str) -> None:
    """Each thread its own event loop and session object, several items per call."""
    writers, each = 3, 8
    _close(_open(impl, tmp_path))
    gate = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        async def run() -> None:
            session = _open(impl, tmp_path)
            gate.wait()
            for i in range(0, each, 2):
                await session.add_items([_item(w, i), _item(w, i + 1)])
            _close(session)

        try:
            asyncio.run(run())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    reader = _open(impl, tmp_path)
    contents = _contents(asyncio.run(reader.get_items()))
    _close(reader)
    _check_all_kept(contents, writers, each)
    for k in range(0, len(contents), 2):  # one call's items stay together
        assert contents[k].split("-")[0] == contents[k + 1].split("-")[0]


# -- OpenAI Agents SDK: processes -----------------------------------------------------------------


def _agents_process(impl: str, where: str, w: int, each: int, gate: Any) -> None:
    async def run() -> None:
        session = _open(impl, Path(where))
        gate.wait()
        for i in range(each):
            await session.add_items([_item(w, i)])
        _close(session)

    asyncio.run(run())


@pytest.mark.parametrize("impl", IMPLS)
def test_agents_processes_keep_every_item(tmp_path: Path, impl: str) -> None:
    writers, each = 4, 20
    _close(_open(impl, tmp_path))
    ctx = multiprocessing.get_context("fork")
    gate = ctx.Barrier(writers)
    procs = [
        ctx.Process(target=_agents_process, args=(impl, str(tmp_path), w, each, gate))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    reader = _open(impl, tmp_path)
    contents = _contents(asyncio.run(reader.get_items()))
    _close(reader)
    _check_all_kept(contents, writers, each)


def test_agents_objects_on_postgres_keep_every_item(pg_url: str) -> None:  # noqa: F811
    writers, each = 2, 10

    async def main() -> list[Any]:
        stores = [stashpoint.open(pg_url) for _ in range(writers)]
        sessions = [StashpointSession("s", st) for st in stores]

        async def write(w: int) -> None:
            for i in range(each):
                await sessions[w].add_items([_item(w, i)])

        await asyncio.gather(*(write(w) for w in range(writers)))
        out = list(await StashpointSession("s", stores[0]).get_items())
        for st in stores:
            st.close()
        return out

    _check_all_kept(_contents(asyncio.run(main())), writers, each)


# -- OpenAI Agents SDK: cancellation --------------------------------------------------------------


def _slow_writes(impl: str, session: Any, started: threading.Event) -> None:
    """Make the session's write take a while, so that a cancellation lands in the middle."""
    if impl == "stashpoint":
        meta = session.store.meta
        commit = meta.commit

        def slow_commit(*args: Any, **kwargs: Any) -> Any:
            started.set()
            time.sleep(0.3)
            return commit(*args, **kwargs)

        meta.commit = slow_commit
    else:
        insert = session._insert_items

        def slow_insert(*args: Any, **kwargs: Any) -> Any:
            started.set()
            time.sleep(0.3)
            return insert(*args, **kwargs)

        session._insert_items = slow_insert


@pytest.mark.parametrize("impl", IMPLS)
def test_cancelled_add_items_adds_all_or_none(tmp_path: Path, impl: str) -> None:
    """Cancelled mid-write: all 20 items are stored by the time CancelledError is raised
    (a reader in another session object sees them); cancelled before it began: none."""

    async def main() -> tuple[int, int, int]:
        writer = _open(impl, tmp_path)
        started = threading.Event()
        _slow_writes(impl, writer, started)
        task = asyncio.create_task(writer.add_items([_item(0, i) for i in range(20)]))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        reader = _open(impl, tmp_path)
        at_cancel = len(await reader.get_items())
        _close(reader)

        early = asyncio.create_task(writer.add_items([_item(1, i) for i in range(20)]))
        early.cancel()  # before it ran at all
        with pytest.raises(asyncio.CancelledError):
            await early
        await asyncio.sleep(0.5)
        _close(writer)
        reader = _open(impl, tmp_path)
        later = len(await reader.get_items())
        _close(reader)
        return at_cancel, later, 20

    at_cancel, later, n = asyncio.run(main())
    assert (at_cancel, later) == (n, n)


@pytest.mark.parametrize("impl", IMPLS)
def test_cancelled_concurrent_add_items_are_settled(tmp_path: Path, impl: str) -> None:
    """Ten add_items of two items each on one session object, cancelled together: what a
    reader sees right after the cancellation is what stays, and no call is split."""

    async def main() -> tuple[list[str], list[str]]:
        writer = _open(impl, tmp_path)
        started = threading.Event()
        _slow_writes(impl, writer, started)
        calls = [
            asyncio.create_task(writer.add_items([_item(k, 0), _item(k, 1)])) for k in range(10)
        ]
        while not started.is_set():
            await asyncio.sleep(0.005)
        for call in calls:
            call.cancel()
        for call in calls:
            with pytest.raises(asyncio.CancelledError):
                await call
        reader = _open(impl, tmp_path)
        first = _contents(await reader.get_items())
        _close(reader)
        await asyncio.sleep(1.0)
        _close(writer)
        reader = _open(impl, tmp_path)
        second = _contents(await reader.get_items())
        _close(reader)
        return first, second

    first, second = asyncio.run(main())
    assert first == second
    assert len(second) == 20  # every call had been handed to a worker: all completed
    for k in range(0, len(second), 2):
        assert second[k][:-1] == second[k + 1][:-1]


# -- Pydantic AI ----------------------------------------------------------------------------------


_TS = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _request(writer: int, i: int) -> ModelMessage:
    return ModelRequest(parts=[UserPromptPart(content=f"w{writer}-{i}", timestamp=_TS)])


def _prompts(messages: list[ModelMessage]) -> list[str]:
    out = []
    for m in messages:
        assert isinstance(m, ModelRequest)
        part = m.parts[0]
        assert isinstance(part, UserPromptPart)
        out.append(str(part.content))
    return out


def _pydantic_writer(store: Any, w: int, each: int, style: str) -> None:
    history = MessageHistory("h", store)
    mine = history.load()
    for i in range(each):
        if style == "load":  # what run()/run_sync() do: load, run, save all_messages()
            history.save([*history.load(), _request(w, i)])
        else:  # the caller keeps its own list (from one load) and saves it after each turn
            mine.append(_request(w, i))
            history.save(mine)
    history.close()


@pytest.mark.parametrize("style", ["load", "own-list"])
def test_pydantic_ai_histories_in_threads_keep_every_message(tmp_path: Path, style: str) -> None:
    writers, each = 2, 10
    store = stashpoint.open(str(tmp_path / "store"))
    threads = [
        threading.Thread(target=_pydantic_writer, args=(store, w, each, style))
        for w in range(writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _check_all_kept(_prompts(MessageHistory("h", store).load()), writers, each)
    store.close()


def _pydantic_process(where: str, w: int, each: int, gate: Any) -> None:
    gate.wait()
    _pydantic_writer(where, w, each, "load")


def test_pydantic_ai_histories_in_processes_keep_every_message(tmp_path: Path) -> None:
    writers, each = 4, 15
    where = str(tmp_path / "store")
    stashpoint.open(where).close()
    ctx = multiprocessing.get_context("fork")
    gate = ctx.Barrier(writers)
    procs = [
        ctx.Process(target=_pydantic_process, args=(where, w, each, gate)) for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    _check_all_kept(_prompts(MessageHistory("h", where).load()), writers, each)


def test_pydantic_ai_edit_replaces_the_conversation(tmp_path: Path) -> None:
    """A shortened list is an edit: it is the conversation now, whoever saved before."""
    where = str(tmp_path / "store")
    a, b = MessageHistory("h", where), MessageHistory("h", where)
    a.save([_request(0, 0), _request(0, 1)])
    b.save([*b.load(), _request(1, 0)])
    a.save([_request(0, 0)])  # a drops its second message
    assert _prompts(b.load()) == ["w0-0"]
    assert len(a.stash.history()) == 3  # the earlier conversations are kept


# -- LangGraph: two savers putting to one thread --------------------------------------------------


def test_langgraph_two_savers_on_one_thread_keep_every_checkpoint(tmp_path: Path) -> None:
    """LangGraph checkpoints are whole states with their own parent: each saver's chain of
    puts is kept, every checkpoint readable with its own values, whatever the interleaving."""
    writers, each = 2, 8
    where = str(tmp_path / "store")
    StashpointSaver(where).store.close()
    ids: dict[int, list[str]] = {w: [] for w in range(writers)}
    gate = threading.Barrier(writers)

    def write(w: int) -> None:
        saver = StashpointSaver(where)
        gate.wait()
        parent: str | None = None
        for i in range(each):
            cp: Any = empty_checkpoint()
            cp["id"] = str(uuid.uuid4())
            cp["channel_values"] = {"k": f"w{w}-{i}"}
            cp["channel_versions"] = {"k": i + 1}
            conf: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            if parent:
                conf["configurable"]["checkpoint_id"] = parent
            md: Any = {"source": "loop", "step": i, "writer": w}
            saver.put(conf, cp, md, {"k": i + 1})
            parent = cp["id"]
            ids[w].append(parent)

    _run_threads(write, writers)
    fresh = StashpointSaver(where)
    listed = {t.config["configurable"]["checkpoint_id"]: t for t in fresh.list(_thread("t"))}
    for w in range(writers):
        for i, cpid in enumerate(ids[w]):
            assert cpid in listed, f"writer {w}'s checkpoint {i} is lost"
            tup = fresh.get_tuple(_thread("t", checkpoint_id=cpid))
            assert tup is not None
            assert tup.checkpoint["channel_values"] == {"k": f"w{w}-{i}"}
            want_parent = ids[w][i - 1] if i else None
            got_parent = tup.parent_config["configurable"]["checkpoint_id"] if i else None
            assert got_parent == want_parent


def _thread(tid: str, **more: Any) -> Any:
    return {"configurable": {"thread_id": tid, "checkpoint_ns": "", **more}}


def _run_threads(fn: Callable[[int], None], n: int) -> None:
    errors: list[BaseException] = []

    def guarded(w: int) -> None:
        try:
            fn(w)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


# -- the engine: Session.checkpoint(append_messages=...) ------------------------------------------


def test_checkpoint_append_messages_lands_on_the_current_head(tmp_path: Path) -> None:
    """An append from an engine object whose head is stale goes after the other writer's
    messages; values are the head's; redaction applies; the conversation cannot be given
    twice."""
    from stashpoint.errors import UsageError

    store = stashpoint.open(str(tmp_path / "store"))
    a = store.session("s")
    a.checkpoint({"messages": ["m0"], "n": 1})
    b = store.session("s")
    assert b.head is not None  # b caches this head
    a.checkpoint(append_messages=["a1"])
    a.checkpoint({"messages": ["m0", "a1"], "n": 2})
    cp = b.checkpoint(append_messages=["b1", "token sk-ant-api03-" + "x" * 40])
    assert a.head is not None and cp.parent == a.head.id
    got = store.session("s").state()
    assert got["messages"][:3] == ["m0", "a1", "b1"] and "x" * 40 not in got["messages"][3]
    assert got["n"] == 2
    assert b.state()["messages"] == got["messages"]  # b's own view follows its checkpoint
    with pytest.raises(UsageError):
        b.checkpoint({"messages": []}, append_messages=["c"])
    store.close()
