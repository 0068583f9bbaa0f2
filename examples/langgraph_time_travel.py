"""A LangGraph agent checkpointed by stashpoint: interrupted, resumed, time-travelled, forked.

Offline and deterministic: the chat model is scripted (a LangChain ``BaseChatModel`` answering
from rules instead of an API), its tool writes real files in a workspace directory, and every
LangGraph checkpoint is a stashpoint checkpoint together with the workspace files at that
moment (runs use ``durability="sync"``, so that a snapshot is taken before the next step
touches the files). The graph asks a human before publishing (``interrupt``) and is resumed
with ``Command(resume=...)``. Then it travels back to before the last edit: the files go back
too (``saver.restore_files``), and the replay continues from there. Finally a new request is
sent to an earlier checkpoint: a fork, on its own branch, whose files start as they were
there (``restore_on_time_travel``).

    pip install 'stashpoint[langgraph]'
    python examples/langgraph_time_travel.py [DIR]     # default: a new temporary directory
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

import stashpoint
from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.verify import verify_store


class ScriptedChatModel(BaseChatModel):
    """``write NAME: TEXT`` becomes a ``write_file`` tool call, a tool result is
    acknowledged, anything else is answered with the number of requests so far."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        n = sum(isinstance(m, HumanMessage) for m in messages)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Done: {last.content}")
        elif m := re.match(r"write (\S+): (.*)", str(last.content)):
            call = {"name": "write_file", "args": {"name": m[1], "text": m[2]}, "id": f"call-{n}"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content=f"You have asked me {n} things.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build(workspace: Path) -> StateGraph[MessagesState]:
    @tool
    def write_file(name: str, text: str) -> str:
        """Write a text file in the workspace."""
        (workspace / name).write_text(text + "\n")
        return f"wrote {name}"

    model = ScriptedChatModel().bind_tools([write_file])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "review"

    def review(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"question": "publish the notes?", "files": sorted(_files(workspace))})
        if answer == "yes":
            (workspace / "published.txt").write_text((workspace / "notes.txt").read_text())
        return {"messages": [HumanMessage(content=f"reviewer said {answer}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([write_file]))
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", "review"])
    builder.add_edge("tools", "agent")
    builder.add_edge("review", END)
    return builder


def _files(workspace: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in workspace.iterdir() if p.is_file()}


def main(base: Path) -> None:
    workspace = base / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    store = stashpoint.open(base / "store")
    saver = StashpointSaver(store, workspace=workspace, restore_on_time_travel=True)
    builder = build(workspace)
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "notes"}}

    def run(graph: Any, value: Any, config: Any) -> None:
        graph.invoke(value, config, durability="sync")

    def ask(text: str) -> dict[str, Any]:
        return {"messages": [HumanMessage(content=text)]}

    print("-- turn 1: write, then the graph stops for a human")
    run(graph, ask("write notes.txt: buy milk"), config)
    paused = graph.get_state(config)
    print("paused before:", paused.next, "asking:", paused.tasks[0].interrupts[0].value)
    run(graph, Command(resume="no"), config)
    print("files:", _files(workspace))

    print("-- turn 2: an edit, approved and published")
    run(graph, ask("write notes.txt: buy milk and eggs"), config)
    run(graph, Command(resume="yes"), config)
    print("files:", _files(workspace))

    print("-- time travel: replay from just before turn 2's tool ran")
    history = list(graph.get_state_history(config))
    before_edit = next(s for s in history if s.next == ("tools",) and "eggs" in _last_call(s))
    saver.restore_files(before_edit.config)  # first: a replay starts its first node at once
    print("files as they were then:", _files(workspace))
    run(graph, None, before_edit.config)  # a new branch: the tool runs again, then the review
    run(graph, Command(resume="no"), config)
    print("files after the replay:", _files(workspace))

    print("-- fork: after turn 1, ask for something else, on its own branch")
    turn1 = next(s for s in reversed(history) if s.next == ())
    run(graph, ask("write notes.txt: buy bread"), turn1.config)  # files back to turn 1's first
    run(graph, Command(resume="yes"), config)
    print("files on the fork:", _files(workspace))
    fork_msgs = graph.get_state(config).values["messages"]
    print("the fork's request:", [m.content for m in fork_msgs if isinstance(m, HumanMessage)][-2])

    session = saver.session_name("notes")
    branches = store.session(session).branches()
    print(f"{session} has {len(branches)} branches:", ", ".join(sorted(branches)))
    print("stashpoint verify ok:", verify_store(store).ok)
    print(f"\nexplore: stashpoint --store {base / 'store'} --session {session} log --graph")
    store.close()


def _last_call(snapshot: Any) -> str:
    last = snapshot.values["messages"][-1]
    return (
        str(last.tool_calls[0]["args"]) if isinstance(last, AIMessage) and last.tool_calls else ""
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        sys.exit(f"usage: python {sys.argv[0]} [DIRECTORY]  (default: a new temporary one)")
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sp-langgraph-")))
