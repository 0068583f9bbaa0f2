"""Tell a human that a run waits for them (SPEC C27).

When a durable run pauses - a tool needs approval, or an effect's outcome is unknown - the
configured notifier gets one JSON document: who asks, which tool with which arguments, and the
exact commands that approve or reject. A notifier is a shell command (the JSON on its stdin,
started detached so it outlives the agent), an ``http(s)://`` webhook (POSTed, 5 s timeout) or a
Python callable. A failing notifier is logged - to the ``stashpoint.notify`` logger and to
``notify.log`` in the store directory - and never stops or delays the agent beyond that timeout.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .model import utc_now_iso

if TYPE_CHECKING:
    from .durable import Pending
    from .model import Checkpoint
    from .session import Session

__all__ = ["Notifier", "notify"]

Notifier = str | Callable[[dict[str, Any]], Any]
"""A shell command, an http(s) URL, or a callable taking the payload."""

log = logging.getLogger("stashpoint.notify")
WEBHOOK_TIMEOUT = 5.0


def payload(session: Session, pending: Pending, cp: Checkpoint | None) -> dict[str, Any]:
    from .session import _args_summary

    ident = cp.id if cp is not None else pending.id
    base = ["stashpoint"]
    if session.store.home is not None:
        base += ["--store", str(session.store.home)]
    base += ["--session", session.name]
    quoted = " ".join(shlex.quote(a) for a in base)
    event = "awaiting_approval" if pending.kind == "approval" else "in_doubt"
    try:
        user = os.getlogin()
    except OSError:
        user = os.environ.get("USER") or f"uid {os.getuid()}"
    return {
        "event": event,
        "session": session.name,
        "branch": session.branch,
        "checkpoint": cp.id if cp is not None else None,
        "tool": pending.tool,
        "summary": f"{pending.tool}{_args_summary(pending.args, limit=200)}",
        "arguments": pending.args,
        "fingerprint": pending.fingerprint,
        "requested_by": f"{user}@{socket.gethostname()} (pid {os.getpid()})",
        "approve": f"{quoted} approve {ident}" + (" --done" if event == "in_doubt" else ""),
        "reject": f"{quoted} reject {ident} --reason '…'",
        "at": utc_now_iso(),
    }


def notify(
    session: Session, notifier: Notifier | None, pending: Pending, cp: Checkpoint | None
) -> None:
    """Send the notification; every failure is logged, none is raised."""
    if notifier is None:
        return
    try:
        doc = payload(session, pending, cp)
        if callable(notifier):
            notifier(doc)
        elif notifier.startswith(("http://", "https://")):
            _webhook(notifier, doc)
        else:
            _command(notifier, doc)
    except Exception as exc:  # a notifier must never break the agent
        _record_failure(session, notifier, exc)


def _webhook(url: str, doc: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "stashpoint"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT) as resp:
        if resp.status >= 300:
            raise OSError(f"webhook answered HTTP {resp.status}")


def _command(command: str, doc: dict[str, Any]) -> None:
    env = dict(os.environ, STASHPOINT_EVENT=doc["event"], STASHPOINT_APPROVE=doc["approve"])
    proc = subprocess.Popen(
        shlex.split(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # outlives the agent, which may exit right after pausing
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(doc).encode())
    finally:
        proc.stdin.close()
    threading.Thread(target=_watch, args=(proc, command), daemon=True).start()


def _watch(proc: subprocess.Popen[bytes], command: str) -> None:
    """Log a notifier command that fails (while this process lives to see it)."""
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return
    if code != 0:
        log.warning("notifier %r exited with status %s", command, code)


def _record_failure(session: Session, notifier: Notifier, exc: Exception) -> None:
    what = notifier if isinstance(notifier, str) else getattr(notifier, "__qualname__", "callable")
    message = f"notifier {what!r} failed: {type(exc).__name__}: {exc}"
    log.warning(message)
    home = session.store.home
    if home is not None:
        try:
            with open(home / "notify.log", "a", encoding="utf-8") as f:
                f.write(f"{utc_now_iso()} {message}\n")
        except OSError:
            pass
