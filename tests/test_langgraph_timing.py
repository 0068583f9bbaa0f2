"""The files a LangGraph checkpoint records are those of its own superstep, in every durability
mode: with LangGraph's default (``"async"``) the saver's ``put`` runs while the next superstep's
nodes already run, and a snapshot taken in ``put`` held the file the next tool wrote (20 of 20
"before the tool" snapshots did, in a user's report).

The race is made certain rather than likely: each ``put`` waits until the node of the next
superstep has written its file (with ``"async"`` only: with ``"sync"`` LangGraph waits for the
put before that node starts, with ``"exit"`` it puts once, at the end). Real LangGraph, real
saver; the wait is the only addition.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.workspace.tree import TreeReader

STEPS = 20


class Steps(TypedDict):
    n: int


def _name(n: int) -> str:
    return f"{n:02d}.txt"


class _LatePuts(StashpointSaver):
    """The put of superstep ``s`` runs only once the node of superstep ``s + 1`` wrote its
    file (superstep 0 runs the graph's input, superstep ``s`` the tool writing file ``s - 1``)."""

    def __init__(self, *args: Any, late: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.late = late
        self.wrote = [threading.Event() for _ in range(STEPS)]

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        step = int(metadata.get("step", -2))
        if self.late and 0 <= step < STEPS:
            assert self.wrote[step].wait(timeout=30), f"the tool of step {step + 1} never ran"
        return super().put(config, checkpoint, metadata, new_versions)


def _graph(ws: Path, saver: _LatePuts) -> Any:
    def tool(s: Steps) -> dict[str, Any]:
        (ws / _name(s["n"])).write_text(str(s["n"]))
        saver.wrote[s["n"]].set()
        return {"n": s["n"] + 1}

    g = StateGraph(Steps)
    g.add_node("tool", tool)
    g.add_edge(START, "tool")
    g.add_conditional_edges("tool", lambda s: END if s["n"] >= STEPS else "tool")
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize(
    ("durability", "aio"), [("sync", False), ("async", False), ("exit", False), ("async", True)]
)
def test_each_checkpoint_holds_the_files_of_its_own_superstep(
    tmp_path: Path, durability: str, aio: bool
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    saver = _LatePuts(tmp_path / "store", workspace=ws, late=durability == "async")
    config: Any = {"configurable": {"thread_id": "t"}}
    app = _graph(ws, saver)
    if aio:  # ainvoke: the saver's async methods, the graph's steps on an event loop
        got = asyncio.run(app.ainvoke({"n": 0}, config, durability=durability))
    else:
        got = app.invoke({"n": 0}, config, durability=durability)
    assert got == {"n": STEPS}
    reader = TreeReader(saver.store.blobs)
    seen: dict[int, list[str]] = {}
    for tup in saver.list(config):
        step = tup.metadata["step"] if tup.metadata else None
        assert isinstance(step, int)
        record = saver.record(tup.config)
        assert record.workspace is not None
        files = [rel.decode() for rel, _e in reader.walk(bytes.fromhex(record.workspace.tree))]
        seen[step] = files
    # A checkpoint holds exactly the files its superstep and those before it wrote.
    wrong = {s: f for s, f in seen.items() if f != [_name(i) for i in range(s)]}
    assert not wrong, f"files of later steps in checkpoints: {wrong}"
    want = {"sync": STEPS + 2, "async": STEPS + 2, "exit": 1}[durability]
    assert len(seen) == want and max(seen) == STEPS
    saver.close()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_node_interrupted_after_writing_leaves_its_file_out(
    tmp_path: Path, durability: str
) -> None:
    """A node that writes a file and then interrupts (``interrupt()``) did not finish its
    superstep: the checkpoint the run stops at holds the files from before it, in every mode
    (with ``"exit"``, the one checkpoint is saved after the node wrote)."""
    from langgraph.types import interrupt

    ws = tmp_path / "ws"
    ws.mkdir()

    def first(s: Steps) -> dict[str, Any]:
        (ws / "first.txt").write_text("1")
        return {"n": 1}

    def asks(s: Steps) -> dict[str, Any]:
        (ws / "draft.txt").write_text("2")
        return {"n": int(interrupt("go on?"))}

    g = StateGraph(Steps)
    g.add_node("first", first)
    g.add_node("asks", asks)
    g.add_edge(START, "first")
    g.add_edge("first", "asks")
    g.add_edge("asks", END)
    saver = StashpointSaver(tmp_path / "store", workspace=ws)
    config: Any = {"configurable": {"thread_id": "t"}}
    app = g.compile(checkpointer=saver)
    app.invoke({"n": 0}, config, durability=durability)
    state = app.get_state(config)
    assert state.next == ("asks",) and (ws / "draft.txt").exists()
    record = saver.record(state.config)
    assert record.workspace is not None
    reader = TreeReader(saver.store.blobs)
    files = [rel.decode() for rel, _e in reader.walk(bytes.fromhex(record.workspace.tree))]
    assert files == ["first.txt"]
    saver.close()
