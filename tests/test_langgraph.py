"""The LangGraph saver: LangGraph's own conformance suite, every base and extended
group, on every backend; real graphs (interrupts, resume, subgraphs, time travel, forks; sync
and async) giving the same states as LangGraph's InMemorySaver; workspace files restored on
time travel; storage that grows linearly with the conversation; deletions after which
``stashpoint verify`` and GC still pass; the example run as a user runs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import operator
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph, add_messages
from langgraph.types import Command, interrupt

import stashpoint
from stashpoint import verify
from stashpoint.errors import IntegrityError, NotFoundError
from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.session import StashpointWarning
from stashpoint.verify import VerifyReport, verify_store

from .test_postgres import pg_url  # noqa: F401 - fixture
from .test_redis import redis_url  # noqa: F401 - fixture

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "langgraph_time_travel.py"
SYNC: Any = {"durability": "sync"}


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def cfg(thread: str, **more: Any) -> Any:
    return {"configurable": {"thread_id": thread, **more}}


def verify_kept(store: stashpoint.Store) -> VerifyReport:
    """``verify_store`` where GC freed what pruned records used: the chain of every record,
    the contents of the kept ones (what verify.py does once it honours pruned marks)."""
    if "pruned" in VerifyReport.__dataclass_fields__:
        return verify_store(store)

    class Kept(verify._Verifier):
        def session(self, name: str) -> None:
            self._pruned = set(self.store.meta.pruned(name))
            super().session(name)

        def contents(self, cp: Any) -> None:
            if cp.id not in self._pruned:
                super().contents(cp)

    return Kept(store, None).run()


# -- LangGraph's conformance suite ------------------------------------------------------------


def run_conformance(name: str, url: str) -> None:
    """Every capability detected and every test passing: the 5 base groups (58 tests in
    langgraph-checkpoint-conformance 0.0.2) and the 3 extended ones."""

    @checkpointer_test(name=name)
    async def make() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        saver = StashpointSaver(url)
        yield saver
        saver.close()

    report = asyncio.run(validate(make))
    report.print_report()
    results = report.results
    assert set(results) == {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    failures = {k: r.failures for k, r in results.items() if r.failures}
    assert not failures, failures
    assert all(r.detected and r.passed and r.tests_skipped == 0 for r in results.values())
    base = {c.value: results[c.value].tests_passed for c in BASE_CAPABILITIES}
    extended = {c.value: results[c.value].tests_passed for c in EXTENDED_CAPABILITIES}
    print(f"{name}: base {sum(base.values())} passed {base}; extended {extended}")
    assert sum(base.values()) >= 58 and all(extended.values())
    assert report.conformance_level() == "FULL"


def test_conformance_sqlite(tmp_path: Path) -> None:
    run_conformance("StashpointSaver[sqlite]", str(tmp_path / "store"))


def test_conformance_memory() -> None:
    run_conformance("StashpointSaver[memory]", "memory://")


def test_conformance_files(tmp_path: Path) -> None:
    run_conformance("StashpointSaver[files]", f"file://{tmp_path / 'fs'}")


def test_conformance_postgres(pg_url: str) -> None:  # noqa: F811
    run_conformance("StashpointSaver[postgres]", pg_url)


def test_conformance_redis(redis_url: str) -> None:  # noqa: F811
    run_conformance("StashpointSaver[redis]", redis_url)


# -- real graphs, compared with LangGraph's own in-memory saver ---------------------------------


class State(MessagesState):
    count: int
    log: Annotated[list[int], operator.add]


def _agent(state: State) -> dict[str, Any]:
    n = len(state["messages"])
    return {
        "messages": [AIMessage(content=f"a{n}")],
        "count": state.get("count", 0) + 1,
        "log": [n],
    }


def _human(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "ok?", "n": len(state["messages"])})
    return {"messages": [HumanMessage(content=f"human says {answer}")]}


def _sub_node(state: State) -> dict[str, Any]:
    return {"messages": [AIMessage(content="from the subgraph")]}


def graph_builder() -> StateGraph[State]:
    sub = StateGraph(State)
    sub.add_node("sub_node", _sub_node)
    sub.add_edge(START, "sub_node")
    g = StateGraph(State)
    g.add_node("sub", sub.compile())
    g.add_node("agent", _agent)
    g.add_node("human", _human)
    g.add_edge(START, "sub")
    g.add_edge("sub", "agent")
    g.add_conditional_edges("agent", lambda s: END if s["count"] >= 4 else "human")
    g.add_edge("human", "agent")
    return g


def _contents(values: dict[str, Any]) -> list[Any]:
    return [m.content for m in values.get("messages", [])]


def _summary(result: Any) -> Any:
    """A task's result without the message ids LangGraph makes up at run time."""
    if not isinstance(result, dict):
        return result
    return {k: _contents({"messages": v}) if k == "messages" else v for k, v in result.items()}


def scenario(saver: BaseCheckpointSaver[Any]) -> list[Any]:
    """Interrupts and resumes, history, time travel, update_state on the past, subgraphs."""
    app = graph_builder().compile(checkpointer=saver)
    c = cfg("t1")
    out: list[Any] = []
    app.invoke({"messages": [HumanMessage(content="hi")]}, c)
    for i in range(3):
        st = app.get_state(c)
        out.append(("paused", st.next, [t.interrupts[0].value for t in st.tasks]))
        app.invoke(Command(resume=f"yes{i}"), c)
    st = app.get_state(c)
    out.append(("done", _contents(st.values), st.values["count"], st.values["log"], st.next))
    hist = list(app.get_state_history(c))
    out.append(
        [
            (h.metadata["step"], h.metadata["source"], h.next, len(h.values.get("messages", [])))
            for h in hist
        ]
    )
    out.append(
        [[(t.name, t.error, len(t.interrupts), _summary(t.result)) for t in h.tasks] for h in hist]
    )
    past = hist[5]
    app.invoke(None, past.config)  # time travel: replay from there
    st = app.get_state(c)
    out.append(("travelled", st.next, _contents(st.values)))
    app.invoke(Command(resume="again"), c)
    out.append(("resumed", _contents(app.get_state(c).values)))
    forked = app.update_state(hist[3].config, {"messages": [AIMessage(content="edited")]})
    st = app.get_state(forked)
    out.append(("forked", _contents(st.values), st.next, st.metadata["source"]))
    app.invoke(None, forked)
    out.append(("fork ran", _contents(app.get_state(c).values)))
    sub = app.get_state(c, subgraphs=True)
    out.append(("subgraphs", sub.next, len(list(app.get_state_history(c)))))
    return out


def test_graph_behaves_as_with_langgraphs_own_saver(tmp_path: Path) -> None:
    expected = scenario(InMemorySaver())
    saver = StashpointSaver(tmp_path / "store")
    assert scenario(saver) == expected
    assert verify_store(saver.store).ok
    branches = saver.store.meta.branches("lg:t1")
    assert "main" in branches and any(b.startswith("ns:sub:") for b in branches)
    assert sum(b.startswith("main@") for b in branches) == 2  # the replay and the update
    saver.close()


def test_async_graph_behaves_as_with_langgraphs_own_saver(tmp_path: Path) -> None:
    async def run(saver: BaseCheckpointSaver[Any]) -> list[Any]:
        app = graph_builder().compile(checkpointer=saver)
        c = cfg("a1")
        await app.ainvoke({"messages": [HumanMessage(content="hi")]}, c)
        await app.ainvoke(Command(resume="yes"), c)
        hist = [h async for h in app.aget_state_history(c)]
        await app.ainvoke(None, hist[2].config)
        st = await app.aget_state(c)
        return [len(hist), st.next, _contents(st.values), st.values["log"]]

    expected = asyncio.run(run(InMemorySaver()))
    saver = StashpointSaver(tmp_path / "store")
    assert asyncio.run(run(saver)) == expected
    assert verify_store(saver.store).ok
    saver.close()


def test_a_second_saver_sees_the_same_thread(tmp_path: Path) -> None:
    """Another process on the same store: new checkpoints and pending writes both show."""
    a = StashpointSaver(tmp_path / "store")
    b = StashpointSaver(tmp_path / "store")
    app_a = graph_builder().compile(checkpointer=a)
    app_b = graph_builder().compile(checkpointer=b)
    app_a.invoke({"messages": [HumanMessage(content="hi")]}, cfg("t"))
    assert app_b.get_state(cfg("t")).next == ("human",)  # b read it all from the store
    app_b.invoke(Command(resume="from b"), cfg("t"))
    st = app_a.get_state(cfg("t"))
    assert "human says from b" in _contents(st.values) and st.next == ("human",)
    # an interrupt is a pending write only: a's index sees it without any new checkpoint
    interrupts = [t.interrupts for t in st.tasks]
    assert interrupts and interrupts[0][0].value["n"] == 5
    a.close()
    b.close()


class TodoState(TypedDict):
    todo: list[str]
    meta: dict[str, str]


def _todo_graph() -> StateGraph[TodoState]:
    def plan(s: TodoState) -> dict[str, Any]:
        return {"todo": ["a"], "meta": {"stage": "plan"}}

    def more(s: TodoState) -> dict[str, Any]:
        s["todo"].append("b")  # changed in place, returned as the same objects
        s["meta"]["stage"] = "more"
        return {"todo": s["todo"], "meta": s["meta"]}

    g = StateGraph(TodoState)
    g.add_node("plan", plan)
    g.add_node("more", more)
    g.add_edge(START, "plan")
    g.add_edge("plan", "more")
    g.add_edge("more", END)
    return g


def test_a_value_changed_in_place_is_stored_anew(tmp_path: Path) -> None:
    """A channel whose version moved is serialized again, even when its value is the very
    object of the parent's checkpoint (a node appended to it): as LangGraph's savers do."""
    expected = {"todo": ["a", "b"], "meta": {"stage": "more"}}
    saver = StashpointSaver(tmp_path / "store")
    app = _todo_graph().compile(checkpointer=saver)
    assert app.invoke({"todo": [], "meta": {}}, cfg("v"), **SYNC) == expected
    assert app.get_state(cfg("v")).values == expected
    cold = _todo_graph().compile(checkpointer=StashpointSaver(saver.store))
    assert cold.get_state(cfg("v")).values == expected
    saver.close()


class EditState(TypedDict):
    messages: Annotated[list[Any], add_messages]
    turn: int


def _edit_graph() -> StateGraph[EditState]:
    """One turn: an answer, then a node that edits a message object in place and returns it
    (the last one on the first turn; the first one, read back from the saver, later)."""

    def answer(s: EditState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"draft {s['turn']}", id=f"a{s['turn']}")]}

    def edit(s: EditState) -> dict[str, Any]:
        msg = s["messages"][-1 if s["turn"] == 1 else 0]
        msg.content = f"{msg.content} (edited on turn {s['turn']})"
        return {"messages": [msg]}

    g = StateGraph(EditState)
    g.add_node("answer", answer)
    g.add_node("edit", edit)
    g.add_edge(START, "answer")
    g.add_edge("answer", "edit")
    g.add_edge("edit", END)
    return g


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_message_edited_in_place_survives_a_restart(tmp_path: Path, durability: str) -> None:
    """A node that changes a message in place and returns it: a fresh saver (a restart)
    reads the edited text back, as LangGraph's SqliteSaver has it: after each run, and in
    every checkpoint of the history. (Not the history with ``"async"``: there any saver
    serializes a checkpoint while the next step's node may be changing its messages.)"""
    from langgraph.checkpoint.sqlite import SqliteSaver

    def run(saver: BaseCheckpointSaver[Any], reopen: Any) -> list[Any]:
        app = _edit_graph().compile(checkpointer=saver)
        out: list[Any] = []
        for turn in (1, 2):
            inp = {"messages": [HumanMessage(content=f"q{turn}", id=f"q{turn}")], "turn": turn}
            app.invoke(inp, cfg("e"), durability=durability)
            fresh = _edit_graph().compile(checkpointer=reopen())
            out.append(_contents(fresh.get_state(cfg("e")).values))
        if durability != "async":
            out += [
                (h.metadata["step"] if h.metadata else None, _contents(h.values))
                for h in fresh.get_state_history(cfg("e"))
            ]
        return out

    db = tmp_path / "lg.sqlite"
    conn = sqlite3.connect(db, check_same_thread=False)
    expected = run(SqliteSaver(conn), lambda: SqliteSaver(sqlite3.connect(db)))
    assert expected[0] == ["q1", "draft 1 (edited on turn 1)"]
    assert expected[1][:2] == ["q1 (edited on turn 2)", "draft 1 (edited on turn 1)"]
    saver = StashpointSaver(tmp_path / "store")
    assert run(saver, lambda: StashpointSaver(tmp_path / "store")) == expected
    saver.close()


def test_nested_fields_changed_in_place_are_stored(tmp_path: Path) -> None:
    """A put compares each message with a copy of its fields whose empty dicts and lists are
    one shared empty dict and list: a message whose empty ``additional_kwargs`` gained a key
    in place, or whose tool call's arguments (a dict in a list) changed in place, differs
    from its copy all the same, and the change is stored; the shared empties stay empty."""
    from stashpoint import conversation

    def answer(s: MessagesState) -> dict[str, Any]:
        call = {"name": "search", "args": {"q": "first"}, "id": "c1"}
        return {"messages": [AIMessage(content="a", id="a1", tool_calls=[call])]}

    def edit(s: MessagesState) -> dict[str, Any]:
        q, a = s["messages"]
        q.additional_kwargs["note"] = "added in place"  # empty when it was stored
        a.response_metadata["seen"] = True
        a.tool_calls[0]["args"]["q"] = "changed in place"
        return {"messages": [q, a]}

    g = StateGraph(MessagesState)
    g.add_node("answer", answer)
    g.add_node("edit", edit)
    g.add_edge(START, "answer")
    g.add_edge("answer", "edit")
    g.add_edge("edit", END)
    saver = StashpointSaver(tmp_path / "store")
    g.compile(checkpointer=saver).invoke({"messages": [HumanMessage("q", id="q1")]}, cfg("n"))
    fresh = StashpointSaver(tmp_path / "store")
    q, a = g.compile(checkpointer=fresh).get_state(cfg("n")).values["messages"]
    assert q.additional_kwargs == {"note": "added in place"}
    assert a.response_metadata == {"seen": True}
    assert a.tool_calls[0]["args"] == {"q": "changed in place"}
    assert conversation._NO_DICT == {} and conversation._NO_LIST == []
    saver.close()
    fresh.close()


def test_a_message_changed_after_list_is_still_compared_with_what_was_stored(
    tmp_path: Path,
) -> None:
    """``list`` hands out decoded messages without taking the copies a put compares with
    (only ``get_tuple``, which a run starts with, takes them): copies taken later, from
    messages someone changed meanwhile, would hide that change from the put. The state a
    run ends with is the state a new saver reads."""

    def answer(s: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"a{len(s['messages'])}")]}

    def app(saver: StashpointSaver) -> Any:
        g = StateGraph(MessagesState)
        g.add_node("answer", answer)
        g.add_edge(START, "answer")
        return g.compile(checkpointer=saver)

    app(StashpointSaver(tmp_path / "store")).invoke({"messages": [("user", "q1")]}, cfg("t"))
    saver = StashpointSaver(tmp_path / "store")
    listed = next(iter(app(saver).get_state_history(cfg("t"))))
    listed.values["messages"][0].content = "changed after list"  # shared with later reads
    out = app(saver).invoke({"messages": [("user", "q2")]}, cfg("t"))
    assert _contents(out) == ["changed after list", "a1", "q2", "a3"]
    fresh = StashpointSaver(tmp_path / "store")
    assert _contents(app(fresh).get_state(cfg("t")).values) == _contents(out)
    saver.close()


# -- pending writes ------------------------------------------------------------------------------


def _thread_steps(saver: StashpointSaver, thread: str, steps: int, size: int = 500) -> Any:
    """A graph whose one node adds a user and an assistant message of ~size bytes per step."""
    text = "lorem ipsum dolor sit amet " * (size // 27 + 1)

    def agent(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"]) // 2
        return {
            "messages": [
                HumanMessage(content=f"{n} {text}"[:size]),
                AIMessage(content=f"{n} reply {text}"[:size]),
            ]
        }

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: END if len(s["messages"]) >= 2 * steps else "agent")
    app = g.compile(checkpointer=saver)
    app.invoke({"messages": []}, {**cfg(thread), "recursion_limit": steps + 10}, **SYNC)
    return app


def test_writes_move_into_the_next_checkpoint_as_references(tmp_path: Path) -> None:
    saver = StashpointSaver(tmp_path / "store")
    _thread_steps(saver, "w", 5)
    tuples = list(saver.list(cfg("w")))
    fresh = StashpointSaver(tmp_path / "store")  # everything from the store
    again = list(fresh.list(cfg("w")))
    assert [t.pending_writes for t in again] == [t.pending_writes for t in tuples]
    assert [t.checkpoint for t in again] == [t.checkpoint for t in tuples]
    # each step's write of two messages is a reference into the next checkpoint's messages
    holder = tuples[1]  # its parent (tuples[2]) ran the node whose write it holds
    writes = tuples[2].pending_writes
    assert writes and any(ch == "messages" for _t, ch, _v in writes)
    rec = fresh.record(holder.config)
    state = fresh.store.session(rec.session).state(rec)
    refs = [w for w in json.loads(state["langgraph"])["w"] if w[2] == "messages"]
    assert refs and isinstance(refs[0][4][0], int), refs  # [start, length, single]
    ours = next(v for _t, ch, v in writes if ch == "messages")
    assert ours == holder.checkpoint["channel_values"]["messages"][-2:]
    # an interrupt-like write on the latest checkpoint stays pending, upserted
    latest = tuples[0].config
    fresh.put_writes(latest, [("__interrupt__", "first"), ("x", 1)], "task")
    fresh.put_writes(latest, [("__interrupt__", "second"), ("x", 2)], "task")
    got = StashpointSaver(tmp_path / "store").get_tuple(latest)
    assert got is not None and sorted(got.pending_writes or []) == [
        ("task", "__interrupt__", "second"),
        ("task", "x", 1),
    ]
    assert verify_store(saver.store).ok


def test_tampering_is_detected(tmp_path: Path) -> None:
    saver = StashpointSaver(tmp_path / "store")
    _thread_steps(saver, "x", 3)
    latest = saver.get_tuple(cfg("x"))
    assert latest is not None
    saver.put_writes(latest.config, [("ch", "v")], "task")
    key = "langgraph:pending:lg:x"
    raw = saver.store.meta.get_meta(key)
    assert raw is not None
    saver.store.meta.set_meta(key, raw.replace('"mac": "', '"mac": "0'))
    with pytest.raises(IntegrityError, match="pending LangGraph writes"):
        StashpointSaver(tmp_path / "store").get_tuple(cfg("x"))
    saver.store.meta.set_meta(key, raw)
    saver.close()
    db = tmp_path / "store" / "store.db"
    with sqlite3.connect(db) as conn:
        (ident, body) = conn.execute(
            "SELECT id, body FROM checkpoints ORDER BY id LIMIT 1"
        ).fetchone()
        conn.execute(
            "UPDATE checkpoints SET body=? WHERE id=?", (body.replace(b'"auto"', b'"edit"'), ident)
        )
    with pytest.raises(IntegrityError, match=ident):
        StashpointSaver(tmp_path / "store").get_tuple(cfg("x"))


def test_reads_reuse_decoded_conversations_as_lines_grow_and_fork(tmp_path: Path) -> None:
    """The saver keeps decoded messages between reads: what it returns stays what a new saver
    reads from the store, as the line grows, forks, and old views are evicted."""
    saver = StashpointSaver(tmp_path / "store")
    saver._views.keep = 1  # evict all but the last log read: fork bases get re-read
    app = _thread_steps(saver, "r", 10)  # 20 messages: decoded as one msgpack array of 16+

    def same_as_fresh() -> list[Any]:
        ours = list(saver.list(cfg("r")))
        fresh = list(StashpointSaver(tmp_path / "store").list(cfg("r")))
        assert [t.checkpoint for t in ours] == [t.checkpoint for t in fresh]
        assert [t.pending_writes for t in ours] == [t.pending_writes for t in fresh]
        return ours

    tuples = same_as_fresh()
    assert len(tuples[0].checkpoint["channel_values"]["messages"]) == 20
    again = list(saver.list(cfg("r")))  # second read: from the kept views
    assert again[0].checkpoint == tuples[0].checkpoint
    assert (
        again[0].checkpoint["channel_values"]["messages"]
        is not (tuples[0].checkpoint["channel_values"]["messages"])
    )  # a list of its own per tuple, the messages shared
    # fork from the middle, then grow the main line: views extend and branch
    past = tuples[6].config
    app.update_state(past, {"messages": [HumanMessage(content="fork", id="f1")]}, "agent")
    _thread_steps(saver, "r", 12)  # goes on from the fork: 13 + 2 per step, up to 25
    tuples = same_as_fresh()
    forked = [t for t in tuples if t.metadata.get("source") == "update"]
    assert forked and _contents(forked[0].checkpoint["channel_values"])[-1] == "fork"
    got = saver.get_tuple(cfg("r"))
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 25
    assert len(tuples) > 12 + 1
    # a late write for an older checkpoint: pending first, then moved into the next record
    late = tuples[3].config["configurable"]["checkpoint_id"]
    saver.put_writes(tuples[3].config, [("late", 1)], "late-task")

    def late_writes() -> list[Any]:
        got = same_as_fresh()
        return [t.pending_writes for t in got if t.config["configurable"]["checkpoint_id"] == late]

    assert ("late-task", "late", 1) in late_writes()[0]
    _thread_steps(saver, "r", 13)  # one more step: the pending write moves into its record
    assert "late-task" not in (saver.store.meta.get_meta("langgraph:pending:lg:r") or "")
    assert ("late-task", "late", 1) in late_writes()[0]
    # a tampered message is still caught by a reader that has not read it yet
    saver.close()
    with sqlite3.connect(tmp_path / "store" / "store.db") as conn:
        conn.execute(  # message 3 swapped for message 4
            "UPDATE messages SET data = (SELECT m.data FROM messages m "
            "WHERE m.log = messages.log AND m.idx = 4) WHERE idx = 3"
        )
    with pytest.raises(IntegrityError, match="conversation log"):
        StashpointSaver(tmp_path / "store").get_tuple(cfg("r"))


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_blobs_read_many_is_read_in_one_query(tmp_path: Path, url: str) -> None:
    """What list() uses to fetch every checkpoint's LangGraph fields at once."""
    store = stashpoint.open(tmp_path / "s" if url == "sqlite" else url)
    datas = [b"small", b"x" * 5000, bytes(range(256)) * 40]
    digests = [hashlib.sha256(d).digest() for d in datas]
    store.meta.put_blobs([store.blobs.encode(h, d) for h, d in zip(digests, datas, strict=True)])
    got = store.blobs.read_many([*digests, digests[0]])
    assert got == dict(zip(digests, datas, strict=True))
    assert set(store.meta.get_blobs([*digests, b"\0" * 32])) == set(digests)
    with pytest.raises(NotFoundError):
        store.blobs.read_many([b"\0" * 32])
    store.close()


# -- storage -------------------------------------------------------------------------------------


def _db_size(path: Path) -> int:
    db = path / "store.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.glob("store.db*"))


def test_storage_grows_linearly_with_the_conversation(tmp_path: Path) -> None:
    """200 steps of 2 messages of 500 B: at most 2x the raw bytes + 1 KiB per checkpoint, on
    top of an empty store (LangGraph's SqliteSaver stores 137x the raw bytes here)."""
    empty = tmp_path / "empty"
    StashpointSaver(empty).close()
    base = _db_size(empty)
    sizes = []
    for steps in (100, 200):
        path = tmp_path / f"s{steps}"
        saver = StashpointSaver(path)
        _thread_steps(saver, "conv", steps)
        checkpoints = len(list(saver.list(cfg("conv"))))
        assert checkpoints == steps + 2  # the input, the start, one per step
        saver.close()
        sizes.append(_db_size(path) - base)
        raw = 2 * 500 * steps
        assert sizes[-1] <= 2 * raw + 1024 * checkpoints, (steps, sizes[-1], raw)
    assert sizes[1] - sizes[0] <= 1.25 * sizes[0]  # the second 100 steps cost what the first did


# -- files --------------------------------------------------------------------------------------


def _file_graph(workspace: Path) -> StateGraph[MessagesState]:
    def edit(state: MessagesState) -> dict[str, Any]:
        text = str(state["messages"][-1].content)
        (workspace / "notes.txt").write_text(text)
        (workspace / f"{len(state['messages'])}.txt").write_text(text)
        return {"messages": [AIMessage(content=f"wrote {text}")]}

    g = StateGraph(MessagesState)
    g.add_node("edit", edit)
    g.add_edge(START, "edit")
    g.add_edge("edit", END)
    return g


def test_time_travel_brings_the_files_back(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    saver = StashpointSaver(tmp_path / "store", workspace=ws, restore_on_time_travel=True)
    app = _file_graph(ws).compile(checkpointer=saver)
    c = cfg("files")
    for text in ("one", "two", "three"):
        app.invoke({"messages": [HumanMessage(content=text)]}, c, **SYNC)
    assert sorted(p.name for p in ws.iterdir()) == ["1.txt", "3.txt", "5.txt", "notes.txt"]
    hist = list(app.get_state_history(c))
    after_one = next(h for h in hist if h.next == () and len(h.values["messages"]) == 2)
    # a new input on a past checkpoint: the files start as they were there
    app.invoke({"messages": [HumanMessage(content="other")]}, after_one.config, **SYNC)
    assert (ws / "notes.txt").read_text() == "other"
    assert sorted(p.name for p in ws.iterdir()) == ["1.txt", "3.txt", "notes.txt"]
    # a replay: restore_files first, then the graph runs from there
    before_two = next(h for h in hist if h.next == ("edit",) and len(h.values["messages"]) == 3)
    result = saver.restore_files(before_two.config)
    assert (ws / "notes.txt").read_text() == "one" and not (ws / "3.txt").exists()
    app.invoke(None, before_two.config, **SYNC)
    assert (ws / "notes.txt").read_text() == "two" and (ws / "3.txt").exists()
    # the checkpoint the replay made first holds its parent's files (a copy of it)
    fork = saver.record(app.get_state(c).config)
    assert fork.workspace is not None
    # restore_files is undoable: its safety checkpoint has the files from before
    assert result.safety.workspace is not None
    assert verify_store(saver.store).ok
    saver.close()


def test_a_replay_without_restore_files_warns_and_leaves_the_files(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    saver = StashpointSaver(tmp_path / "store", workspace=ws, restore_on_time_travel=True)
    app = _file_graph(ws).compile(checkpointer=saver)
    for text in ("one", "two"):
        app.invoke({"messages": [HumanMessage(content=text)]}, cfg("w"), **SYNC)
    past = next(h for h in app.get_state_history(cfg("w")) if h.next == ("edit",))
    with pytest.warns(StashpointWarning, match="restore_files"):
        app.invoke(None, past.config, **SYNC)
    # LangGraph's default durability needs no warning: a step's files are taken at its end
    app.invoke({"messages": [HumanMessage(content="async")]}, cfg("w"))
    saver.close()


# -- deleting, pruning, copying ------------------------------------------------------------------


def test_deletions_keep_verify_and_gc_working(tmp_path: Path) -> None:
    from stashpoint.gc import collect

    saver = StashpointSaver(tmp_path / "store")
    app = graph_builder().compile(checkpointer=saver)
    for t in ("keep", "gone", "pruned", "runs"):
        app.invoke({"messages": [HumanMessage(content=t)]}, cfg(t))
        app.invoke(Command(resume="y"), cfg(t))
    run_ids = {t.metadata.get("run_id") for t in saver.list(cfg("runs"))} - {None}
    saver.delete_thread("gone")
    saver.prune(["pruned"], strategy="keep_latest")
    saver.delete_for_runs(sorted(run_ids)[:1])
    assert saver.get_tuple(cfg("gone")) is None and not list(saver.list(cfg("gone")))
    assert len(list(saver.list(cfg("pruned", checkpoint_ns="")))) == 1
    assert verify_store(saver.store).ok
    report = collect(saver.store, grace=0)
    assert report.freed_logs or report.freed_db_bytes or report.garbage_logs
    assert verify_kept(saver.store).ok
    fresh = StashpointSaver(tmp_path / "store")
    for t in ("keep", "pruned", "runs"):  # what is left still loads, after GC
        for tup in fresh.list(cfg(t)):
            assert tup.checkpoint["channel_values"] is not None
    kept = fresh.get_tuple(cfg("pruned"))
    assert kept is not None and "human says y" in _contents(kept.checkpoint["channel_values"])
    app2 = graph_builder().compile(checkpointer=fresh)
    app2.invoke({"messages": [HumanMessage(content="again")]}, cfg("gone"))  # a thread anew
    assert _contents(app2.get_state(cfg("gone")).values)[0] == "again"
    assert verify_kept(fresh.store).ok
    saver.close()
    fresh.close()


def test_prune_and_delete_for_runs_refuse_one_string(tmp_path: Path) -> None:
    """One id given as a str would be iterated character by character, naming other threads
    (LangGraph's PostgresSaver raises TypeError)."""
    saver = StashpointSaver(tmp_path / "store")
    app = graph_builder().compile(checkpointer=saver)
    for t in ("a", "b", "ab"):  # thread t, run t
        app.invoke({"messages": [HumanMessage(content=t)]}, {**cfg(t), "metadata": {"run_id": t}})
    with pytest.raises(TypeError):
        saver.prune("ab", strategy="delete")
    with pytest.raises(TypeError):
        asyncio.run(saver.aprune("ab"))
    with pytest.raises(TypeError):
        saver.delete_for_runs("ab")
    for t in ("a", "b", "ab"):
        assert len(list(saver.list(cfg(t)))) > 1  # nothing pruned or deleted
    saver.close()


def _extend(state: list[str], writes: Any) -> list[str]:
    return [*state, *(item for w in writes for item in w)]


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=50)]
    n: int


def _delta_graph() -> StateGraph[DeltaState]:
    def step(s: DeltaState) -> dict[str, Any]:
        return {"items": [f"i{s.get('n', 0) + 1}"], "n": s.get("n", 0) + 1}

    g = StateGraph(DeltaState)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if s["n"] >= 3 else "step")
    return g


def test_keep_latest_refuses_threads_with_a_delta_channel(tmp_path: Path) -> None:
    """A DeltaChannel's latest value is rebuilt from the writes of the checkpoints before it:
    keep_latest would leave it empty. Like PostgresSaver, refuse (and prune no thread)."""
    saver = StashpointSaver(tmp_path / "store")
    delta = _delta_graph().compile(checkpointer=saver)
    delta.invoke({"items": ["start"]}, cfg("d"))
    plain = graph_builder().compile(checkpointer=saver)
    plain.invoke({"messages": [HumanMessage(content="hi")]}, cfg("p"))
    before = len(list(saver.list(cfg("p"))))
    with pytest.raises(NotImplementedError, match="DeltaChannel: d"):
        saver.prune(["p", "d"], strategy="keep_latest")
    assert len(list(saver.list(cfg("p")))) == before
    fresh = _delta_graph().compile(checkpointer=StashpointSaver(saver.store))
    assert fresh.get_state(cfg("d")).values["items"] == ["start", "i1", "i2", "i3"]
    saver.prune(["p"], strategy="keep_latest")  # a thread without one is pruned as before
    assert len(list(saver.list(cfg("p", checkpoint_ns="")))) == 1
    saver.prune(["d"], strategy="delete")
    assert saver.get_tuple(cfg("d")) is None
    saver.close()


def test_copy_thread_then_both_go_on(tmp_path: Path) -> None:
    saver = StashpointSaver(tmp_path / "store")
    app = graph_builder().compile(checkpointer=saver)
    app.invoke({"messages": [HumanMessage(content="hi")]}, cfg("src"))
    saver.copy_thread("src", "dst")
    assert app.get_state(cfg("dst")).next == ("human",)  # the interrupt was copied too
    app.invoke(Command(resume="dst"), cfg("dst"))
    app.invoke(Command(resume="src"), cfg("src"))
    assert "human says dst" in _contents(app.get_state(cfg("dst")).values)
    assert "human says dst" not in _contents(app.get_state(cfg("src")).values)
    assert verify_store(saver.store).ok
    saver.close()


# -- serialization -------------------------------------------------------------------------------


class Secret(JsonPlusSerializer):
    """A serializer that 'encrypts' (reverses) every payload, as EncryptedSerializer would."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        return type_ + "+rev", bytes(reversed(data))

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        return super().loads_typed((type_.removesuffix("+rev"), bytes(reversed(raw))))


def test_every_value_goes_through_the_savers_serde(tmp_path: Path) -> None:
    saver = StashpointSaver(tmp_path / "store", serde=Secret(), conversation_channel=None)
    app = graph_builder().compile(checkpointer=saver)
    app.invoke({"messages": [HumanMessage(content="top secret words")]}, cfg("s"))
    assert "top secret words" in _contents(app.get_state(cfg("s")).values)
    saver.close()
    data = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert b"top secret words" not in data


def test_metadata_stashpoint_cannot_encode_goes_through_langgraph(tmp_path: Path) -> None:
    checkpoint: Any = {
        "v": 4,
        "id": str(uuid.uuid4()),
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"k": {1, 2}},
        "channel_versions": {"k": 1},
        "versions_seen": {},
        "updated_channels": None,
        "pending_sends": [],
    }
    # a pydantic model is not registered with stashpoint's encoding: LangGraph's carries it
    metadata: Any = {"source": "input", "step": -1, "note": HumanMessage(content="x")}
    got = []
    for saver in (InMemorySaver(), StashpointSaver(tmp_path / "store")):
        stored = saver.put(cfg("m", checkpoint_ns=""), checkpoint, metadata, {"k": 1})
        tup = saver.get_tuple(stored)
        assert tup is not None
        got.append((tup.checkpoint, tup.metadata))
    assert got[0] == got[1]
    again = StashpointSaver(tmp_path / "store").get_tuple(cfg("m"))
    assert again is not None and (again.checkpoint, again.metadata) == got[0]


# -- packaging: extra, example --------------------------------------------------------------------


def test_missing_extra_names_the_install_line(tmp_path: Path) -> None:
    code = """
import sys
sys.modules["langgraph"] = None  # as if the extra were not installed
import stashpoint, stashpoint.integrations
store = stashpoint.open("store"); store.session("s").checkpoint({"messages": ["ok"]}); store.close()
try:
    import stashpoint.integrations.langgraph
except ImportError as exc:
    from stashpoint import StashpointError
    assert isinstance(exc, StashpointError), type(exc)
    print("ERR", exc)
"""
    proc = run_python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "ERR stashpoint.integrations.langgraph needs LangGraph" in proc.stdout
    assert "pip install 'stashpoint[langgraph]'" in proc.stdout
    proc = run_python("import sys, stashpoint\nprint('langgraph' in sys.modules)", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


def test_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "paused before: ('review',)" in out
    assert "files as they were then: {'notes.txt': 'buy milk'}" in out  # published.txt gone
    assert "files after the replay: {'notes.txt': 'buy milk and eggs'}" in out
    assert "files on the fork: {'notes.txt': 'buy bread', 'published.txt': 'buy bread'}" in out
    assert "stashpoint verify ok: True" in out
    store = stashpoint.open(tmp_path / "store")
    assert verify_store(store).ok
    assert len(store.session("lg:notes").branches()) == 4
    store.close()


def test_secrets_are_scrubbed_before_langgraph_values_are_serialized(tmp_path: Path) -> None:
    """The session stores LangGraph's values as serialized (compressed) bytes, where no secret
    pattern can match: the saver scrubs messages, channel values, writes and metadata first."""
    key = "sk-ant-api03-" + "Q" * 40 + "AA"
    token = "ghp_" + "x1" * 20

    class S(MessagesState):
        env: dict[str, str]

    def node(state: S) -> dict[str, Any]:
        return {
            "messages": [AIMessage(content=f"found {key} in .env")],
            "env": {"password": "hunter2-hunter2", "home": "/home/agent"},
        }

    def build(saver: StashpointSaver) -> Any:
        g = StateGraph(S)
        g.add_node("node", node)
        g.add_edge(START, "node")
        g.add_edge("node", END)
        return g.compile(checkpointer=saver)

    def run(saver: StashpointSaver) -> Any:
        c: Any = {"configurable": {"thread_id": "t"}, "metadata": {"note": f"token {token}"}}
        build(saver).invoke({"messages": [HumanMessage(content=f"use {token}")]}, c)
        return c

    saver = StashpointSaver(tmp_path / "on")
    c = run(saver)
    saver.close()
    cold = StashpointSaver(tmp_path / "on")  # read back as a new process would
    tup = cold.get_tuple(c)
    assert tup is not None
    texts = [m.content for m in tup.checkpoint["channel_values"]["messages"]]
    assert texts == ["use [REDACTED:github]", "found [REDACTED:anthropic] in .env"]
    assert tup.checkpoint["channel_values"]["env"] == {
        "password": "[REDACTED:field]",
        "home": "/home/agent",
    }
    assert tup.metadata["note"] == "token [REDACTED:github]"
    everything = repr([(t.checkpoint, t.metadata, t.pending_writes) for t in cold.list(c)])
    assert key not in everything and token not in everything and "hunter2" not in everything
    record = cold.record(tup.config)
    assert record.meta["stashpoint_redacted"]["anthropic"] >= 1
    cold.close()

    off = StashpointSaver(tmp_path / "off", redact=False)  # the check above can fail
    tup = off.get_tuple(run(off))
    assert tup is not None
    assert tup.checkpoint["channel_values"]["messages"][1].content == f"found {key} in .env"
    off.close()
