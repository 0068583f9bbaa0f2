"""The web UI: real store, real files, real HTTP; the security rules for a local UI; and
`stashpoint ui` driven in a real headless Chromium, clicking as a user does.

The browser test needs Playwright (dev extra) and Debian's Chromium (`.ci/run` installs it):
off CI a missing one skips with the reason, under ``CI=true`` it fails.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import stashpoint
from stashpoint.cli import cli
from stashpoint.webui import create_app
from stashpoint.webui.actions import done_banner

TOKEN = "t" * 8 + "0123456789abcdef"
PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"


def _paused_run(store: stashpoint.Store, root: Path) -> None:
    """A durable run in session ``agent`` that waits for approval of ``deploy('prod')``."""

    def program(run: stashpoint.Session) -> Any:
        @run.tool(irreversible=True, approval=True)
        def deploy(env: str) -> str:
            return f"deployed {env}"

        return lambda: deploy("prod")

    run = store.session("agent", workspace=root)
    assert run.run(program(run)).status == "awaiting_approval"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[stashpoint.Store, Path, list[str]]]:
    """A workspace with three checkpoints on main, a fork, and a paused durable run."""
    root = tmp_path / "ws"
    root.mkdir()
    store = stashpoint.open(tmp_path / "store")
    run = store.session("main", workspace=root)
    ids = []
    for i, text in enumerate(["one\n", "one\ntwo\n", "one\ntwo\nthree <script>\n"]):
        (root / "notes.txt").write_text(text)
        ids.append(
            run.checkpoint({"step": i, "plan": ["read", "<b>write</b>"]}, message=f"m{i}").id
        )
    b = run.fork(ids[0], "try-b", into=tmp_path / "b")  # an A/B copy in its own directory
    (tmp_path / "b" / "notes.txt").write_text("one\nb\n")
    b.checkpoint({"step": 9}, message="on b")
    _paused_run(store, root)
    yield store, root, ids
    store.close()


def _client(store: stashpoint.Store, root: Path | None) -> TestClient:
    app = create_app(store, token=TOKEN, port=PORT, root=root)
    return TestClient(app, base_url=BASE, follow_redirects=False)


def _csrf(html: str) -> str:
    found = re.search(r"name='csrf' value='([0-9a-f]+)'", html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_every_request_needs_the_token_and_the_right_host(world: Any) -> None:
    store, root, _ids = world
    c = _client(store, root)
    refused = c.get("/")
    assert refused.status_code == 401
    assert store.url not in refused.text and "store" not in refused.text  # nothing to learn
    assert c.get("/", headers={"Authorization": "Bearer wrong-token-wrong"}).status_code == 401
    assert c.get("/?token=nearly" + TOKEN[6:]).status_code == 401
    r = c.get(f"/s/main?token={TOKEN}")
    assert r.status_code == 303 and r.headers["location"] == "/s/main"  # token leaves the URL
    cookie = r.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert c.get("/").status_code == 200  # the cookie now
    bearer = TestClient(c.app, base_url=BASE)
    assert bearer.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # DNS rebinding: a name that resolves to 127.0.0.1 is still refused
    rebound = c.get("/", headers={"Host": f"evil.example:{PORT}"})
    assert rebound.status_code == 421 and store.url not in rebound.text
    assert c.get("/", headers={"Host": "127.0.0.1:1"}).status_code == 421
    page = c.get("/")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"


def test_pages_show_sessions_tree_state_files_and_diffs_escaped(world: Any) -> None:
    store, root, ids = world
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    home = c.get("/").text
    assert "/s/main" in home and "/s/agent" in home and "waits for a decision" in home
    tree = c.get("/s/main").text
    for ident in ids:
        assert f"/s/main/c/{ident}" in tree
    assert "try-b" in tree and "main" in tree
    lane = {}  # the x of each row's node in its lane drawing
    for row in re.findall(r"<tr id='r-([0-9A-Z]+)'>(.*?)</tr>", tree):
        lane[row[0]] = re.search(r"<circle [^>]*cx='(\d+)'", row[1]).group(1)  # type: ignore[union-attr]
    on_b = next(cp.id for cp in store.session("main").history() if cp.message == "on b")
    assert lane[ids[0]] == lane[ids[1]] == lane[ids[2]] != lane[on_b]  # the fork: a lane
    assert "<span class='headmark'>HEAD</span>" in tree and "<span class='branch'>try-b" in tree
    cp = c.get(f"/s/main/c/{ids[2]}").text
    assert "&lt;b&gt;write&lt;/b&gt;" in cp and "<b>write</b>" not in cp  # state is escaped
    assert "notes.txt" in cp and "rewind files + state" in cp
    diff = c.get(f"/s/main/diff?a={ids[0]}&b={ids[2]}").text
    assert "<span class='add'>+two</span>" in diff
    assert "+three &lt;script&gt;" in diff and "<script>" not in diff
    assert c.get("/s/main/c/nope").status_code == 400  # a clear error page, not a crash
    assert "no checkpoint" in c.get("/s/main/c/nope").text.lower()


def test_get_changes_nothing_and_posts_need_csrf_and_same_origin(world: Any) -> None:
    store, root, ids = world
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    before = [cp.id for cp in store.session("main").history()]
    for path in ("/", "/s/main", f"/s/main/c/{ids[0]}", f"/s/main/diff?a={ids[0]}"):
        assert c.get(path).status_code == 200
    assert c.get(f"/s/main/rewind?ref={ids[0]}&mode=both").status_code in (404, 405)
    after = [cp.id for cp in store.session("main").history()]
    assert after == before and (root / "notes.txt").read_text().endswith("three <script>\n")
    csrf = _csrf(c.get(f"/s/main/c/{ids[0]}").text)
    form = {"ref": ids[0], "mode": "both"}
    assert c.post("/s/main/rewind", data=form).status_code == 403  # no CSRF field
    assert c.post("/s/main/rewind", data={**form, "csrf": "0" * 64}).status_code == 403
    evil = {"Origin": "http://evil.example"}
    assert c.post("/s/main/rewind", data={**form, "csrf": csrf}, headers=evil).status_code == 403
    assert [cp.id for cp in store.session("main").history()] == before
    r = c.post("/s/main/rewind", data={**form, "csrf": csrf}, headers={"Origin": BASE})
    assert r.status_code == 303
    assert (root / "notes.txt").read_text() == "one\n"  # files restored
    head = store.session("main").head
    assert head is not None and store.session("main").state(head)["step"] == 0


def test_non_ascii_credentials_are_refused_not_a_server_error(world: Any) -> None:
    store, root, ids = world
    c = _client(store, root)
    assert c.get("/?token=%C3%A9").status_code == 401
    bearer = {"Authorization": "Bearer \u00e9t\u00e9-token-of-sixteen".encode()}
    assert c.get("/", headers=bearer).status_code == 401  # type: ignore[arg-type]
    cookie = {"Cookie": "stashpoint_ui=\u00e9\u00e9".encode()}
    assert c.get("/", headers=cookie).status_code == 401  # type: ignore[arg-type]
    c.get(f"/?token={TOKEN}")
    form = {"ref": ids[0], "mode": "both", "csrf": "\u00e9" * 64}
    assert c.post("/s/main/rewind", data=form, headers={"Origin": BASE}).status_code == 403


def test_files_of_another_directory_are_not_restored_over_this_one(
    world: Any, tmp_path: Path
) -> None:
    """A checkpoint taken in another directory (here an A/B fork's) restores its state from
    the UI, never its files over the UI's workspace: one click would delete files here."""
    store, root, _ids = world
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    on_b = next(cp for cp in store.session("main").history() if cp.message == "on b")
    csrf = _csrf(c.get(f"/s/main/c/{on_b.id}").text)
    before = (root / "notes.txt").read_text()
    form = {"ref": on_b.id, "mode": "both", "csrf": csrf}
    refused = c.post("/s/main/rewind", data=form, headers={"Origin": BASE})
    assert refused.status_code == 400 and str(tmp_path / "b") in refused.text
    assert (root / "notes.txt").read_text() == before
    state_only = c.post("/s/main/rewind", data={**form, "mode": "state"}, headers={"Origin": BASE})
    assert state_only.status_code == 303
    assert (root / "notes.txt").read_text() == before


def test_fork_approve_and_reject_from_the_ui(world: Any, tmp_path: Path) -> None:
    store, root, ids = world
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    csrf = _csrf(c.get(f"/s/main/c/{ids[1]}").text)
    into = tmp_path / "ab"
    r = c.post(
        "/s/main/fork", data={"ref": ids[1], "branch": "try-c", "into": str(into), "csrf": csrf}
    )
    assert r.status_code == 303 and "try-c" in r.headers["location"]
    assert (into / "notes.txt").read_text() == "one\ntwo\n"
    assert store.session("main").branches()["try-c"] == ids[1]
    page = c.get("/s/agent").text
    assert "deploy" in page and "waits for approval" in page
    r = c.post("/s/agent/approve", data={"reason": "checked", "csrf": csrf})
    assert r.status_code == 303
    head = store.session("agent").head
    assert head is not None and head.meta["decision"]["decision"] == "approved"
    assert head.meta["decision"]["reason"] == "checked"
    assert "waits for a decision" not in c.get("/").text
    # nothing pending any more: a second decision is a clear error, not a crash
    again = c.post("/s/agent/reject", data={"csrf": csrf})
    assert again.status_code == 400 and "error" in again.text


def test_a_fork_into_a_place_that_cannot_hold_it_is_an_error_page(world: Any) -> None:
    store, root, ids = world
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    csrf = _csrf(c.get(f"/s/main/c/{ids[0]}").text)
    form = {"ref": ids[0], "branch": "nowhere", "into": "/proc/stashpoint-x", "csrf": csrf}
    r = c.post("/s/main/fork", data=form, headers={"Origin": BASE})
    assert r.status_code == 400 and "/proc/stashpoint-x" in r.text


def _offered(page: str) -> list[list[str]]:
    """Every command a page shows for copying, split as the shell would split it."""
    texts = (html.unescape(c) for c in re.findall(r"<code[^>]*>(.*?)</code>", page))
    return [shlex.split(t) for t in texts if t.startswith(("stashpoint ", "rm "))]


def test_the_commands_the_ui_offers_run_as_shown(world: Any, tmp_path: Path) -> None:
    """An undo command or resume hint is pasted into a shell: its options must be the CLI's
    own, and a session name or directory holding spaces or ';' must stay one word (an
    imported bundle's session name is chosen by whoever sent it)."""
    store, root, ids = world
    name, into = "fix 42; echo pwned", str(tmp_path / "my fork")
    pages = [
        done_banner(name, {"done": "rewound", "safety": ids[0]}),
        done_banner(name, {"done": "labelled", "label": "x", "ref": ids[0]}),
        done_banner(name, {"done": "edited", "of": ids[0]}),
        done_banner(name, {"done": "approved", "tool": "deploy"}),
        done_banner(name, {"done": "forked", "branch": "b", "into": into}),
    ]
    c = _client(store, root)
    c.get(f"/?token={TOKEN}")
    pages.append(c.get("/s/agent").text)  # the paused run's resume hint
    offered = [argv for page in pages for argv in _offered(page)]
    assert ["rm", "-r", into] in offered
    assert ["stashpoint", "--session", "agent", "resume"] in offered
    stashpoint_commands = [argv for argv in offered if argv[0] == "stashpoint"]
    assert len(stashpoint_commands) == 5
    for argv in stashpoint_commands:
        assert argv[1:3] in (["--session", name], ["--session", "agent"]), argv
        parsed = CliRunner().invoke(cli, [*argv[1:], "--help"])  # options parse, nothing runs
        assert parsed.exit_code == 0, (argv, parsed.output)


def test_the_cli_refuses_a_non_loopback_address(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    sp("snap", "-m", "one", cwd=ws)
    res = sp("ui", "--host", "0.0.0.0", "--port", "0", cwd=ws, check=False)
    assert res.code == 1 and "loopback" in res.err


# -- a real browser ----------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _need_browser() -> tuple[Any, str]:
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[dev]')"
    chromium = _chromium()
    if why is None and chromium is None:
        why = "no Chromium on this machine (apt-get install chromium; .ci/run does)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    assert chromium is not None
    return sync_playwright, chromium


def test_stashpoint_ui_in_a_headless_browser(sp: Any, tmp_path: Path) -> None:
    sync_playwright, chromium = _need_browser()
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("STASHPOINT_STORE", None)
    env.pop("STASHPOINT_SESSION", None)
    (ws / "plan.md").write_text("draft 1\n")
    first = json.loads(sp("snap", "-m", "first draft", "--json", cwd=ws).out)["id"]
    (ws / "plan.md").write_text("draft 2: rm -rf everything\n")  # 27 bytes
    sp("snap", "-m", "bad idea", cwd=ws)
    server = subprocess.Popen(
        [sys.executable, "-m", "stashpoint", "ui", "--port", "0", "--json"],
        cwd=ws,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(url.split("?")[0])
            assert "token required" in page.content()
            page.goto(url)  # the printed URL: token -> cookie, then the sessions page
            assert "token=" not in page.url
            page.click("text=main")
            page.click("tr:has-text('first draft') >> a.id")
            assert first[:12] in page.content()
            page.click("text=compare with HEAD")
            assert "draft 2: rm -rf everything" in page.content()
            page.go_back()
            page.click("text=rewind files + state…")
            assert "1 file(s)" in page.content() and "safety checkpoint" in page.content()
            with page.expect_navigation():
                page.click("button:has-text('rewind now')")
            assert "/s/main/c/" in page.url and "Rewound to this checkpoint" in page.content()
            page.click("text=restore it to undo >> xpath=.. >> css=a")  # the safety checkpoint
            bad = "draft 2: rm -rf everything\n"
            assert f"{len(bad)} B" in page.content()  # it holds the undone version
            page.screenshot(path=str(tmp_path / "ui.png"), full_page=True)
            browser.close()
        assert (ws / "plan.md").read_text() == "draft 1\n"  # restored on disk
        log = json.loads(sp("log", "--json", cwd=ws).out)
        kinds = {cp["kind"]: cp for cp in log}
        assert "pre-rewind" in kinds and "bad idea" in {cp["message"] for cp in log}
        assert kinds["pre-rewind"]["message"] == f"before rewind to {first}"  # undoable
    finally:
        server.send_signal(signal.SIGINT)
        try:
            _out, err = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            _out, err = server.communicate()
    assert server.returncode in (0, -signal.SIGINT), err


def test_the_sessions_page_is_paged(tmp_path: Path) -> None:
    """A store with more sessions than a page shows them a page at a time, with links."""
    store = stashpoint.open(tmp_path / "store")
    names = [f"s{i:03}" for i in range(53)]
    for name in names:
        store.session(name).checkpoint({"n": name})
    c = _client(store, None)
    c.get(f"/?token={TOKEN}")
    first = c.get("/").text
    assert "/s/s000" in first and "/s/s049" in first and "/s/s050" not in first
    assert "sessions 1-50 of 53" in first and "href='/?page=2'" in first
    second = c.get("/?page=2").text
    assert all(f"/s/{n}" in second for n in names[50:]) and "/s/s049" not in second
    assert "href='/?page=1'" in second and "page=3" not in second
    assert c.get("/?page=3").status_code == 404
    assert c.get("/?page=x").status_code == 400
    store.close()
