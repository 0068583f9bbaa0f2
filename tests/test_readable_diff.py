"""Readable diffs: decoded state values and the conversation as messages added, removed and
edited with role and text, for a real LangGraph thread (the stashpoint saver) and a plain
session, in the CLI as a user types it (text and ``--json``), ``Session.diff`` and the web UI.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from starlette.testclient import TestClient

import stashpoint
import stashpoint.aio
from stashpoint.cli import cli
from stashpoint.integrations.langgraph import StashpointSaver, _pack
from stashpoint.integrations.pydantic_ai import MessageHistory
from stashpoint.langgraph_values import decode_text
from stashpoint.statediff import ValueChange, render_message
from stashpoint.webui import create_app

LONG = "why " * 200  # 800 characters: shown cut, with a count
# base64 of LangGraph's packed msgpack as the saver stores it, and any long base64 run
PACKED = re.compile(r"AQdtc2dwYWNr|AAdtc2dwYWNr|[A-Za-z0-9+/]{40,}={0,2}")
TOKEN = "t" * 8 + "0123456789abcdef"


class State(MessagesState):
    plan: list[str]
    count: int


def _agent(state: State) -> dict[str, Any]:
    n = state.get("count", 0)
    calls = [{"name": "search", "args": {"q": "tides"}, "id": "call-1"}] if n == 0 else []
    return {
        "messages": [AIMessage(content=f"reply {n}", tool_calls=calls)],
        "count": n + 1,
        "plan": ["read", f"step {n}"],
    }


@pytest.fixture(scope="module")
def thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A LangGraph thread ``lg:t`` saved by the stashpoint saver: a first turn, then the
    user's message edited (same id) and the reply removed, then a second turn. Yields the
    store and the stashpoint records of the first turn's end and of the thread's end."""
    home = tmp_path_factory.mktemp("lg") / "store"
    g = StateGraph(State)
    g.add_node("agent", _agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    saver = StashpointSaver(str(home))
    app = g.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    app.invoke({"messages": [HumanMessage("hello <b>world</b>", id="h1")]}, cfg, durability="sync")
    first = app.get_state(cfg)
    reply = first.values["messages"][1]
    app.update_state(
        cfg, {"messages": [HumanMessage("hello again", id="h1"), RemoveMessage(id=reply.id)]}
    )
    app.invoke({"messages": [HumanMessage(LONG, id="h2")]}, cfg, durability="sync")
    a = saver.record(first.config).id
    b = saver.record(app.get_state(cfg).config).id
    saver.close()
    yield home, a, b


def test_cli_shows_decoded_langgraph_state_and_conversation(thread: Any, sp: Any) -> None:
    home, a, b = thread
    out = sp("--store", str(home), "--session", "lg:t", "diff", a, b).out
    assert not PACKED.search(out), out
    lines = out.splitlines()
    for line in (
        "state count: changed",
        "- 1",
        "+ 2",
        "state plan: changed",
        "- ['read', 'step 0']",
        "+ ['read', 'step 1']",
        "conversation: 2 added, 1 removed, 1 edited (2 -> 3 messages, first 0 unchanged)",
        '- [1] assistant: reply 0 → search({"q": "tides"})',
        "~ [0] edited",
        "  - user: hello <b>world</b>",
        "  + user: hello again",
        "+ [2] assistant: reply 1",
    ):
        assert line in lines, (line, out)
    added = [line for line in lines if line.startswith("+ [1] user: why why")]
    assert len(added) == 1 and added[0].endswith("… (+500 chars)"), out

    # the same with --json, in process (LangGraph is already imported here: ~2 s less)
    got = CliRunner().invoke(
        cli, ["--store", str(home), "--session", "lg:t", "--json", "diff", a, b]
    )
    assert got.exit_code == 0, got.output
    data = json.loads(got.output)
    assert not PACKED.search(json.dumps(data))
    assert data["state_changes"] == [
        {"key": "count", "kind": "changed", "before": 1, "after": 2},
        {
            "key": "plan",
            "kind": "changed",
            "before": ["read", "step 0"],
            "after": ["read", "step 1"],
        },
    ]
    assert data["values"][1] == {
        "key": "plan",
        "status": "changed",
        "old": ["read", "step 0"],
        "new": ["read", "step 1"],
    }
    assert data["truncated"] is False
    conv = data["conversation"]
    assert conv["common_prefix"] == 0
    assert [(m["index"], m["role"], m["text"]) for m in conv["added"]] == [
        (1, "user", LONG),  # whole in JSON
        (2, "assistant", "reply 1"),
    ]
    assert [(m["role"], m["text"], m["tool_calls"]) for m in conv["removed"]] == [
        ("assistant", "reply 0", ['search({"q": "tides"})'])
    ]
    [edit] = conv["edited"]
    assert (edit["before"]["id"], edit["before"]["text"]) == ("h1", "hello <b>world</b>")
    assert (edit["after"]["id"], edit["after"]["text"]) == ("h1", "hello again")
    assert data["messages_removed"] == 2
    assert [m["content"] for m in data["messages_added"]] == ["hello again", LONG, "reply 1"]


def test_session_diff_returns_structured_fields(thread: Any) -> None:
    home, a, b = thread
    with stashpoint.open(home) as store:
        d = store.session("lg:t").diff(a, b)
        ad = asyncio.run(_adiff(home, a, b))
    assert d.state_changes == [
        ValueChange("count", "changed", 1, 2),
        ValueChange("plan", "changed", ["read", "step 0"], ["read", "step 1"]),
    ]
    assert d.values == [
        ("count", "changed", 1, 2),
        ("plan", "changed", ["read", "step 0"], ["read", "step 1"]),
    ]
    conv = d.conversation
    assert (conv.before_length, conv.after_length, conv.common_prefix) == (2, 3, 0)
    [edit] = conv.edited
    assert (edit.before.role, edit.before.text, edit.after.text) == (
        "user",
        "hello <b>world</b>",
        "hello again",
    )
    assert [(m.role, m.tool_calls) for m in conv.removed] == [
        ("assistant", ('search({"q": "tides"})',))
    ]
    assert [(m.index, m.role, m.text) for m in conv.added] == [
        (1, "user", LONG),
        (2, "assistant", "reply 1"),
    ]
    # the older fields, decoded: LangChain messages, not base64
    assert d.messages_removed == 2
    assert [type(m) for m in d.messages_added] == [HumanMessage, HumanMessage, AIMessage]
    assert ad.state_changes == d.state_changes and ad.conversation == d.conversation


async def _adiff(home: Path, a: str, b: str) -> Any:
    async with await stashpoint.aio.open(home) as store:
        s = await store.session("lg:t")
        return await s.diff(a, b)


def test_web_ui_diff_page_shows_them_escaped(thread: Any) -> None:
    home, a, b = thread
    with stashpoint.open(home) as store:
        app = create_app(store, token=TOKEN, port=8765, root=None)
        c = TestClient(app, base_url="http://127.0.0.1:8765", follow_redirects=False)
        assert c.get(f"/?token={TOKEN}").status_code in (200, 303)
        page = c.get(f"/s/lg:t/diff?a={a}&b={b}").text
    assert not PACKED.search(page), page
    assert "<b>world</b>" not in page
    edited = page[page.index("<div class='edited'>") :]
    assert "hello &lt;b&gt;world&lt;/b&gt;" in edited and "hello again" in edited
    added = re.findall(r"<div class='msg added'>(.*?)</div></div>", page, re.S)
    removed = re.findall(r"<div class='msg removed'>(.*?)</div></div>", page, re.S)
    assert any("assistant" in m and "reply 1" in m for m in added)
    assert any(
        "reply 0" in m and "search({&quot;q&quot;: &quot;tides&quot;})" in m for m in removed
    )
    assert "<td class='add'><code>[&#x27;read&#x27;, &#x27;step 1&#x27;]</code></td>" in page


def test_plain_session_pairs_messages_by_position_and_decodes_values(
    store: stashpoint.Store, sp: Any, tmp_path: Path
) -> None:
    s = store.session("chat")
    sys_msg = {"role": "system", "content": "be brief"}
    call = {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}}
    a = s.checkpoint(
        {
            "messages": [
                sys_msg,
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "4"},
            ],
            "plan": {"step": 1},
            "gone": (1, 2),
        }
    )
    b = s.checkpoint(
        {
            "messages": [
                sys_msg,
                {"role": "user", "content": [{"type": "text", "text": "3+3?"}]},
                {"role": "assistant", "content": "", "tool_calls": [call]},
            ],
            "plan": {"step": 2},
        }
    )
    d = s.diff(a.id, b.id)
    assert d.state_changes == [
        ValueChange("gone", "removed", (1, 2), None),
        ValueChange("plan", "changed", {"step": 1}, {"step": 2}),
    ]
    conv = d.conversation
    assert conv.common_prefix == 1
    [edit] = conv.edited
    assert (edit.before.index, edit.before.text, edit.after.text) == (1, "2+2?", "3+3?")
    assert [(m.index, m.role, m.text) for m in conv.removed] == [(3, "tool", "4")]
    assert conv.added == []
    out = sp("--store", str(tmp_path / "store"), "--session", "chat", "diff", a.id, b.id).out
    assert "- (1, 2)" in out and "+ {'step': 2}" in out
    assert "  - user: 2+2?" in out and "  + user: 3+3?" in out and "- [3] tool: 4" in out


def test_messages_of_each_framework_render_as_role_and_text(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    # OpenAI Agents items, as its Session stores them
    assert render_message(
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}
    ) == ("tool call", "", "c", ("f({})",))
    assert render_message({"type": "function_call_output", "call_id": "c", "output": "ok"})[:2] == (
        "tool result",
        "ok",
    )
    msg = {
        "type": "message",
        "role": "assistant",
        "id": "m1",
        "content": [{"type": "output_text", "text": "hi"}],
    }
    assert render_message(msg) == ("assistant", "hi", "m1", ())
    assert render_message({"x": [1]}) == ("?", '{"x": [1]}', None, ())
    # a LangGraph value its default serializer cannot read (an encrypting one wrote it)
    sealed = base64.b64encode(_pack(("msgpack+aes", b"\x01" * 80))).decode()
    assert decode_text(sealed).startswith("<LangGraph value of type 'msgpack+aes', 80 bytes")
    # Pydantic AI messages, saved through its integration and diffed
    history = MessageHistory("pai", store)
    asked = ModelRequest(parts=[UserPromptPart(content="weather?")])
    first = history.save([asked])
    calls = ModelResponse(parts=[TextPart("checking"), ToolCallPart("weather", {"city": "Oslo"})])
    back = ModelRequest(parts=[ToolReturnPart("weather", "rain", tool_call_id="w1")])
    second = history.save([asked, calls, back])
    conv = store.session("pai").diff(first.id, second.id).conversation
    assert [m.summary() for m in conv.added] == [
        'assistant: checking → weather({"city": "Oslo"})',
        "tool result: [weather] rain",
    ]


def test_web_ui_checkpoint_page_shows_the_thread_decoded(thread: Any) -> None:
    """The checkpoint page of a LangGraph record: its conversation as a chat with the tool
    call, its channels decoded, no base64 of the saver's packed values."""
    home, _a, b = thread
    with stashpoint.open(home) as store:
        app = create_app(store, token=TOKEN, port=8765, root=None)
        c = TestClient(app, base_url="http://127.0.0.1:8765", follow_redirects=False)
        c.get(f"/?token={TOKEN}")
        page = c.get(f"/s/lg:t/c/{b}").text
        first = c.get(f"/s/lg:t/c/{_a}").text
    chat = page[page.index("<div class='chat'>") :]
    assert not PACKED.search(chat) and "reply 1" in chat and "hello again" in chat
    assert "<span class='key'>plan</span>" in page and "step 1" in page
    assert "search({&quot;q&quot;: &quot;tides&quot;})" in first


def test_cli_show_prints_the_thread_decoded(thread: Any) -> None:
    """``show --json`` of a LangGraph record gives the channels and messages as values, not
    the saver's packed (base64) bytes."""
    home, _a, b = thread
    got = CliRunner().invoke(cli, ["--store", str(home), "--session", "lg:t", "--json", "show", b])
    assert got.exit_code == 0, got.output
    data = json.loads(got.output)
    assert not PACKED.search(json.dumps(data["state"])), data["state"]
    assert data["state"]["count"] == 2
    assert data["state"]["plan"] == ["read", "step 1"]
    texts = [m.get("content") for m in data["state"]["messages"]]
    assert texts == ["hello again", LONG, "reply 1"]
