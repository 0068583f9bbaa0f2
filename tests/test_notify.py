"""Approval notifications: real stores, real notifier processes and a real HTTP
server. A notifier never blocks the agent and never sees (or logs) a secret the session's
redactor would have scrubbed."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import stashpoint

KEY = "sk-ant-api03-" + "A" * 80
"""An Anthropic-shaped key: the default redactor's patterns catch it anywhere."""


def _wait_for(check: Any, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def _state(pid: int) -> str | None:
    """The process's state letter (``Z``: a zombie nobody reaped), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_notifier_that_does_not_read_stdin_does_not_block_the_agent(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    """The payload (200 kB of arguments) is larger than a pipe holds: written from the agent's
    thread it blocked until the notifier exited. The notifier here never reads its stdin."""
    pid_file = tmp_path / "notifier.pid"
    script = f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)"  # noqa: E501
    run = store.session("big", notify=f"{sys.executable} -c {shlex.quote(script)}")

    @run.tool(name="write_file", irreversible=True, approval=True)
    def write_file(path: str, content: str) -> str:
        return "ok"

    result: dict[str, Any] = {}
    agent = threading.Thread(
        target=lambda: result.update(r=run.run(lambda: write_file("a.txt", "x" * 200_000))),
        daemon=True,
    )
    agent.start()
    agent.join(10)  # the old code waited for the notifier: 60 s
    assert not agent.is_alive(), "the agent is blocked writing the notifier's stdin"
    assert result["r"].status == "awaiting_approval"

    # the notifier runs on, and once it ends it is reaped, not left a zombie
    assert _wait_for(lambda: pid_file.exists() and pid_file.read_text())
    pid = int(pid_file.read_text())
    assert _state(pid) not in (None, "Z")
    os.kill(pid, signal.SIGTERM)
    assert _wait_for(lambda: _state(pid) is None), f"notifier {pid} left in state {_state(pid)}"
    assert store.home is not None
    assert _wait_for(lambda: (store.home / "notify.log").exists())  # type: ignore[operator]
    assert "exited with status -15" in (store.home / "notify.log").read_text()


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_every_notifier_gets_the_arguments_redacted(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    """The journal and the checkpoint scrub the arguments; the notification was built from the
    raw ones. A callable, a command and a webhook all get the redacted document."""
    got = tmp_path / "command.json"
    script = f"import sys, pathlib; pathlib.Path({str(got)!r}).write_text(sys.stdin.read())"
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    called: list[dict[str, Any]] = []
    try:
        notifiers: dict[str, Any] = {
            "callable": called.append,
            "command": f"{sys.executable} -c {shlex.quote(script)}",
            "webhook": f"http://127.0.0.1:{server.server_address[1]}/hook",
        }
        for name, notifier in notifiers.items():
            run = store.session(name, notify=notifier)

            @run.tool(name="deploy", irreversible=True, approval=True)
            def deploy(env: str, note: str, api_key: str) -> str:
                return "ok"

            res = run.run(lambda: deploy("prod", f"auth with {KEY}", api_key="hunter2-plain"))
            assert res.status == "awaiting_approval"
            assert KEY not in json.dumps(run.head.meta)  # type: ignore[union-attr]
    finally:
        server.shutdown()
        server.server_close()
    assert _wait_for(lambda: got.exists() and got.read_text())
    docs = {"callable": called[0], "command": json.loads(got.read_text())}
    docs["webhook"] = _Hook.received[0]
    for name, doc in docs.items():
        text = json.dumps(doc)
        assert KEY not in text and "hunter2-plain" not in text, name
        assert doc["arguments"] == [
            ["prod", "auth with [REDACTED:anthropic]"],
            {"api_key": "[REDACTED:field]"},
        ], name
        assert doc["summary"] == (
            "deploy('prod', 'auth with [REDACTED:anthropic]', api_key='[REDACTED:field]')"
        ), name
        assert doc["tool"] == "deploy" and doc["approve"].endswith(f"approve {doc['checkpoint']}")


def test_a_failing_notifier_is_logged_without_its_secrets(store: stashpoint.Store) -> None:
    """notify.log kept the webhook URL verbatim: its password, token parameter and the
    credential in its path (Slack-style)."""
    url = (
        "http://user:pw-s3cret@127.0.0.1:9/services/T0001/B0002/Xy7Zq3Rt9Lm2Np4Kv8Wd6Fs1"
        "?token=tok-s3cret&channel=ops"
    )
    command = f"/nonexistent/notifier --header 'Authorization: Bearer {'b' * 20}'"
    for i, notifier in enumerate((url, command)):
        run = store.session(f"s{i}", notify=notifier)

        @run.tool(name="wire", irreversible=True, approval=True)
        def wire(amount: int) -> str:
            return "wired"

        assert run.run(lambda: wire(5)).status == "awaiting_approval"
    assert store.home is not None
    logged = (store.home / "notify.log").read_text()
    for secret in ("pw-s3cret", "tok-s3cret", "Xy7Zq3Rt9Lm2Np4Kv8Wd6Fs1", "b" * 20):
        assert secret not in logged, secret
    assert "http://user:***@127.0.0.1:9/services/T0001/B0002/***?token=***&channel=ops" in logged
    assert "/nonexistent/notifier" in logged
