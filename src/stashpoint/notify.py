"""Tell a human that a run waits for them.

When a durable run pauses - a tool needs approval, or an effect's outcome is unknown - the
configured notifier gets one JSON document: who asks, which tool with which arguments, and the
exact commands that approve or reject. A notifier is a shell command (the JSON on its stdin,
started detached so it outlives the agent), an ``http(s)://`` webhook (POSTed, 5 s timeout) or a
Python callable. A failing notifier is logged - to the ``stashpoint.notify`` logger and to
``notify.log`` in the store directory - and never stops or delays the agent beyond that timeout.

The document goes through the session's redactor first (the arguments, then the summary made
from them), like everything the session persists: a notifier is one more copy of the data.
A command's stdin is fed from a daemon thread, so a notifier that never reads it (or reads
slowly) cannot block the agent, whatever the payload's size; the same thread reaps it.
URLs and commands written to the logs have their secrets masked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import config
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
FEED_TIMEOUT = 60.0
"""How long a notifier command may take to read its JSON before stdin is closed."""


def payload(session: Session, pending: Pending, cp: Checkpoint | None) -> dict[str, Any]:
    """The notification document, redacted with the session's redactor (a ``Pending`` holds
    the arguments as given: the journal redacts its own copy only when it writes it)."""
    from .durable_surface import args_summary as _args_summary

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
        user = config.value(config.USER) or f"uid {os.getuid()}"
    args = _redacted(session, pending.args)
    doc = {
        "event": event,
        "session": session.name,
        "branch": session.branch,
        "checkpoint": cp.id if cp is not None else None,
        "tool": pending.tool,
        "summary": f"{pending.tool}{_args_summary(args, limit=200)}",
        "arguments": args,
        "fingerprint": pending.fingerprint,
        "requested_by": f"{user}@{socket.gethostname()} (pid {os.getpid()})",
        "approve": f"{quoted} approve {ident}" + (" --done" if event == "in_doubt" else ""),
        "reject": f"{quoted} reject {ident} --reason '…'",
        "at": utc_now_iso(),
    }
    out = _redacted(session, doc)  # the summary too (a custom redactor may see more there)
    if not isinstance(out, dict):
        raise TypeError("the session's redactor returned a non-dict for the notification")
    return out


def _redacted(session: Session, value: Any) -> Any:
    """``value`` through the session's redactor, if any; a :class:`Redactor`'s counts are left
    as they were (they describe what the next checkpoint's data had scrubbed, not this)."""
    fn = session.redactor
    if fn is None:
        return value
    from .redact import Redactor

    if not isinstance(fn, Redactor):
        return fn(value)
    counts = fn.counts.copy()
    try:
        return fn(value)
    finally:
        fn.counts.clear()
        fn.counts.update(counts)


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
            _command(session, notifier, doc)
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


def _command(session: Session, command: str, doc: dict[str, Any]) -> None:
    env = dict(os.environ, STASHPOINT_EVENT=doc["event"], STASHPOINT_APPROVE=doc["approve"])
    data = json.dumps(doc).encode()
    proc = subprocess.Popen(
        shlex.split(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # outlives the agent, which may exit right after pausing
    )
    threading.Thread(
        target=_feed_and_reap, args=(session, proc, command, data), daemon=True
    ).start()


def _feed_and_reap(
    session: Session, proc: subprocess.Popen[bytes], command: str, data: bytes
) -> None:
    """Write the payload to the command's stdin, then wait for it (no zombie is left) and log
    a failing exit - in this daemon thread: a command that does not read its stdin fills the
    pipe and would block whoever writes. Nothing raises out of here."""
    try:
        try:
            proc.communicate(data, timeout=FEED_TIMEOUT)
        except subprocess.TimeoutExpired:  # still reading or running: stop feeding it
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
        code = proc.wait()  # reaps it, however long it runs (the agent may exit first)
        if code != 0:
            _record_failure(session, command, OSError(f"exited with status {code}"))
    except Exception as exc:  # pragma: no cover - nothing may reach the agent
        _record_failure(session, command, exc)


def _record_failure(session: Session, notifier: Notifier, exc: Exception) -> None:
    what = (
        _loggable(session, notifier)
        if isinstance(notifier, str)
        else getattr(notifier, "__qualname__", "callable")
    )
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(notifier, str):
        detail = detail.replace(notifier, what)
        if notifier.startswith(("http://", "https://")):
            from urllib.parse import urlsplit

            with contextlib.suppress(ValueError):
                password = urlsplit(notifier).password
                if password:  # an error quoting the netloc (a bad port ...)
                    detail = detail.replace(password, "***")
    message = _scrub(session, f"notifier {what!r} failed: {detail}")
    log.warning(message)
    home = session.store.home
    if home is not None:
        try:
            with open(home / "notify.log", "a", encoding="utf-8") as f:
                f.write(f"{utc_now_iso()} {message}\n")
        except OSError:
            pass


_TOKENISH = re.compile(r"^(?=[^/]*[0-9])(?=[^/]*[A-Za-z])[A-Za-z0-9_\-.~%+=]{16,}$")
"""A URL path segment that looks like a credential (Slack's and Discord's webhook URLs carry
theirs in the path): 16+ characters mixing letters and digits."""


def _loggable(session: Session, notifier: str) -> str:
    """A notifier fit for a log line: a URL's password, secret query parameters and
    token-like path segments masked; a command's secrets scrubbed by the redactor."""
    if not notifier.startswith(("http://", "https://")):
        return _scrub(session, notifier)
    from urllib.parse import urlsplit

    from .urls import printable_url

    url = printable_url(notifier)
    try:
        path = urlsplit(url).path
    except ValueError:
        return _scrub(session, url)
    masked = "/".join("***" if _TOKENISH.match(seg) else seg for seg in path.split("/"))
    if masked != path:
        url = url.replace(path, masked, 1)
    return _scrub(session, url)


def _scrub(session: Session, text: str) -> str:
    """``text`` through the session's redactor (on by default), else the default patterns."""
    try:
        out = _redacted(session, text)
    except Exception:  # a custom redactor that fails: fall back to the default patterns
        out = None
    if not isinstance(out, str):
        from .redact import Redactor

        out = Redactor().scrub(text)
    return out
