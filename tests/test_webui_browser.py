"""The web UI clicked through in a real headless Chromium, as a user debugging a run does:
find a checkpoint by filter, read its conversation with a tool call, compare two checkpoints
picked on the graph, approve a paused durable run's call, rewind after the confirmation,
fork into a directory, and watch a new checkpoint appear without a reload. Each step is
checked on the page and then in the store or on disk.

One browser and one server (uvicorn in a thread, over a real SQLite store) per module.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.webui import create_app
from tests.test_webui import _need_browser

TOKEN = "b" * 8 + "0123456789abcdef"

CHAT = [
    {"role": "user", "content": "How many open issues mention the cache?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "search_issues", "arguments": '{"query": "cache"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "search_issues", "content": "3 issues"},
]


@dataclass
class World:
    url: str
    store_path: Path
    root: Path
    ids: list[str]
    tmp: Path


def _build(tmp: Path) -> World:
    root = tmp / "ws"
    root.mkdir()
    store = stashpoint.open(tmp / "store", durability="exit")  # built fast; fsync for nothing
    s = store.session("main", workspace=root)
    ids = []
    for i, text in enumerate(["one\n", "one\ntwo\n", "one\ntwo\nthree\n"]):
        (root / "notes.txt").write_text(text)
        state = {"step": i, "messages": CHAT[: i + 1]}
        ids.append(s.checkpoint(state, message=f"turn {i}", label="asked" if i == 1 else None).id)

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True, approval=True)
        def deploy(env: str) -> str:
            return f"deployed {env}"

        return lambda: deploy("prod")

    agent = store.session("agent")
    assert agent.run(program(agent)).status == "awaiting_approval"
    store.session("live").checkpoint({"n": 0}, message="first")
    store.close()
    return World("", tmp / "store", root, ids, tmp)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, World]]:
    sync_playwright, chromium = _need_browser()
    import uvicorn

    world = _build(tmp_path_factory.mktemp("webui"))
    store = stashpoint.open(world.store_path)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = create_app(store, token=TOKEN, port=port, root=world.root)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    world.url = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.set_default_timeout(10_000)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{world.url}/?token={TOKEN}")
            yield page, world
            browser.close()
        assert not errors, errors  # no CSP violation, no script error
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        store.close()


def test_find_read_and_compare(ui: tuple[Any, World]) -> None:
    page, w = ui
    page.goto(f"{w.url}/s/main")
    assert page.locator("table.graph tbody tr").count() == 3
    assert page.locator("tr:has(.headmark)").get_attribute("id") == f"r-{w.ids[2]}"
    page.fill("input[name=label]", "asked")  # find a checkpoint by its label
    page.click("button:has-text('filter')")
    assert page.locator("table.graph tbody tr").count() == 1
    page.click(f"#r-{w.ids[1]} a.id")
    chat = page.locator("#conversation .chat")  # the conversation as a chat, tool call shown
    assert (
        chat.locator(".msg.user").inner_text().endswith("How many open issues mention the cache?")
    )
    assert 'search_issues({"query": "cache"})' in chat.locator(".call").inner_text()
    page.click("text=back to the graph")
    page.check(f"#r-{w.ids[0]} input[name=a]")
    page.check(f"#r-{w.ids[2]} input[name=b]")
    page.click("#compare")
    assert "/s/main/diff?" in page.url
    summary = page.locator("p.summary").inner_text()
    assert "1 files changed" in summary and "2 messages added" in summary
    assert "+three" in page.locator("pre.diff").inner_text()
    assert "3 issues" in page.locator(".msg.added").last.inner_text()
    page.click("text=split view")
    assert page.locator("table.split td.add").first.inner_text() == "two"


def test_approve_a_paused_call(ui: tuple[Any, World]) -> None:
    page, w = ui
    page.goto(f"{w.url}/")
    page.click("text=agent")
    pending = page.locator(".pending")
    assert "deploy" in pending.inner_text() and '["prod"]' in pending.inner_text()
    pending.locator("input[name=reason]").first.fill("checked the diff")
    pending.locator("button:has-text('approve')").click()
    assert "deploy approved" in page.locator(".banner").inner_text()
    store = stashpoint.open(w.store_path)
    head = store.session("agent").head
    assert head is not None and head.meta["decision"]["decision"] == "approved"
    assert head.meta["decision"]["reason"] == "checked the diff"
    assert store.session("agent").pending() is None
    store.close()


def test_rewind_after_confirmation_then_fork(ui: tuple[Any, World]) -> None:
    page, w = ui
    page.goto(f"{w.url}/s/main/c/{w.ids[0]}")
    page.click("text=rewind files + state…")
    confirm = page.locator("main").inner_text()  # says what changes before anything does
    assert "1 file(s)" in confirm and "notes.txt" in confirm and "safety checkpoint" in confirm
    assert (w.root / "notes.txt").read_text() == "one\ntwo\nthree\n"  # nothing changed yet
    page.click("button:has-text('rewind now')")
    assert "Rewound to this checkpoint" in page.locator(".banner").inner_text()
    assert (w.root / "notes.txt").read_text() == "one\n"
    into = w.tmp / "try-b"
    page.fill("input[name=branch]", "try-b")
    page.fill("input[name=into]", str(into))
    page.click("button:has-text('fork…')")
    assert "Nothing here changes" in page.locator("main").inner_text()
    page.click("button:has-text('fork now')")
    assert "Forked branch try-b" in page.locator(".banner").inner_text()
    assert page.locator(".branch:has-text('try-b')").count() == 1
    assert (into / "notes.txt").read_text() == "one\n"
    store = stashpoint.open(w.store_path)
    main = store.session("main")
    assert main.branches()["try-b"] == w.ids[0]
    assert any(cp.kind == "pre-rewind" for cp in main.history())  # the undo is there
    store.close()


def test_new_checkpoints_appear_without_reload(ui: tuple[Any, World]) -> None:
    page, w = ui
    page.goto(f"{w.url}/s/live")
    page.wait_for_selector("#live-status:has-text('live')")
    store = stashpoint.open(w.store_path)
    new = store.session("live").checkpoint({"n": 1}, message="arrived while watching")
    store.close()
    row = page.wait_for_selector(f"#r-{new.id}")
    assert row is not None and "arrived while watching" in row.inner_text()
    assert page.locator("table.graph tbody tr").count() == 2
