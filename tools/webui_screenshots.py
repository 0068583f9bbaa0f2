"""Regenerate the web UI screenshots under docs/images/ (shown in docs/web-ui.md).

    PYTHONPATH=src python tools/webui_screenshots.py

Builds a small project in a temporary directory (a coding agent's session with a conversation,
tool calls, a fork and labels; a durable run paused before a deployment), serves the UI over
it and photographs each page in headless Chromium at 1280x800.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import stashpoint
from stashpoint.webui import create_app

TOKEN = "s" * 24
OUT = Path(__file__).resolve().parent.parent / "docs" / "images"

APP_V1 = '''"""Release notes builder."""

def notes(changes):
    return "\\n".join(f"- {c}" for c in changes)
'''
APP_V2 = '''"""Release notes builder."""

from collections import Counter


def notes(changes, *, group=True):
    """One bullet per change, grouped by area when asked."""
    if not group:
        return "\\n".join(f"- {c}" for c in changes)
    areas = Counter(c.split(":")[0] for c in changes)
    return "\\n".join(f"{area}: {n} change(s)" for area, n in areas.items())
'''


def chat(turn: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful release engineer."},
        {"role": "user", "content": "Group the release notes by area, then ship 1.4."},
        {
            "role": "assistant",
            "content": "I will read the current builder first.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "notes.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": APP_V1},
        {
            "role": "assistant",
            "content": "The builder prints one bullet per change; I will group them with a "
            "Counter and keep the old behaviour behind group=False.",
        },
    ]
    return msgs[: 2 + turn * 2]


def build(tmp: Path) -> tuple[Path, Path, list[str]]:
    root = tmp / "project"
    root.mkdir()
    (root / "README.md").write_text("# notes\n\nRelease notes builder.\n")
    (root / "src").mkdir()
    (root / "tests").mkdir()
    (root / "tests" / "test_notes.py").write_text("def test_notes():\n    assert True\n")
    store = stashpoint.open(tmp / "store", durability="exit")
    s = store.session("release-agent", workspace=root)
    ids = []
    for turn, (code, msg) in enumerate(
        [(APP_V1, "read the builder"), (APP_V1, "planned the change"), (APP_V2, "grouped by area")]
    ):
        (root / "src" / "notes.py").write_text(code)
        state = {"messages": chat(turn + 1), "plan": {"goal": "ship 1.4", "step": turn}}
        label = "tests-pass" if turn == 2 else None
        ids.append(s.checkpoint(state, message=msg, label=label).id)
    other = tmp / "try-flat"
    b = s.fork(ids[1], "try-flat", into=other)
    (other / "src" / "notes.py").write_text(APP_V1.replace("- ", "* "))
    b.checkpoint({"messages": chat(2), "plan": {"goal": "ship 1.4", "step": 9}}, message="flat")
    (root / "CHANGELOG.md").write_text("## 1.4\n- notes: grouped by area\n")
    s.checkpoint(message="changelog")

    run = store.session("deploy-run")

    def program() -> Any:
        @run.tool(irreversible=True)
        def send_email(to: str, subject: str) -> str:
            return f"sent to {to}"

        @run.tool(irreversible=True, approval=True)
        def deploy(env: str, version: str) -> str:
            return f"deployed {version} to {env}"

        run.plan({"notes": "Write notes", "mail": "Email the team", "ship": "Deploy"})
        with run.task("notes"):
            pass
        with run.task("mail"):
            send_email("team@example.com", "Release 1.4")
        with run.task("ship"):
            deploy("prod", "1.4")

    assert run.run(program).status == "awaiting_approval"
    store.close()
    return tmp / "store", root, ids


def main() -> None:
    import uvicorn
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="stashpoint-ui-shots-"))
    store_path, root, ids = build(tmp)
    store = stashpoint.open(store_path)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = create_app(store, token=TOKEN, port=port, root=root)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    base = f"http://127.0.0.1:{port}"
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    deploy = store.session("deploy-run").head
    assert deploy is not None
    shots = {
        "ui-sessions": "/",
        "ui-session-graph": "/s/release-agent",
        "ui-checkpoint": f"/s/release-agent/c/{ids[2]}",
        "ui-file-viewer": f"/s/release-agent/c/{ids[2]}/file?path=src/notes.py",
        "ui-compare": f"/s/release-agent/diff?a={ids[0]}&b={ids[2]}",
        "ui-confirm-rewind": f"/s/release-agent/confirm?op=rewind&ref={ids[1]}&mode=both",
        "ui-durable-run": f"/s/deploy-run/c/{deploy.id}",
    }
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/?token={TOKEN}")
        for name, path in shots.items():
            anchor = {"ui-checkpoint": "#conversation", "ui-durable-run": "#side-effect-ledger"}
            page.goto(base + path + anchor.get(name, ""))
            if name == "ui-session-graph":
                page.check(f"#r-{ids[0]} input[name=a]")
                page.check(f"#r-{ids[2]} input[name=b]")
            target = OUT / f"{name}.png"
            page.screenshot(path=str(target))
            print(f"{target.relative_to(OUT.parent.parent)}: {target.stat().st_size // 1024} KB")
        browser.close()
    server.should_exit = True
    thread.join(10)
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
