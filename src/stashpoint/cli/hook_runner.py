"""What ``stashpoint hooks run AGENT`` does each time an agent calls it: read the payload the
agent sends, record a checkpoint of the workspace if a file changed, and write one line to
``hooks.log``, all within a time budget and without ever failing the agent (it prints nothing
and exits 0 whatever happens). A hook runs at every tool call: each library module is imported
where a path needs it (start-up time)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..agent_hooks.recipes import AIDER_REPLY_END
from ..watchd.client import read_stdin
from ._app import Ctx, discover
from .hook_recipes import LOG_NAME, SESSION_PREFIX

if TYPE_CHECKING:
    from .._store import Store

LOG_MAX_BYTES = 1 << 20


def run_hook(ctx: Ctx, agent: str, args: tuple[str, ...]) -> dict[str, Any]:
    """Snapshot for one hook call and log how it went; what it did, as the JSON output."""
    from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

    started = time.monotonic()
    hook = _HookRun(ctx, agent)
    # Library logging (psycopg_pool retrying a connection ...) would reach stderr through
    # Python's last-resort handler: into hooks.log instead, until the command has closed
    # the store (callbacks run last-registered first, and the store's is registered later).
    # Only for a server's store: a local one logs nothing, and a hook imports no logging.
    if ctx.store_url and parse_store_url(ctx.store_url).server:
        click.get_current_context().call_on_close(_capture_logging(hook))
    try:
        with _time_budget(_budget_seconds()):
            hook.snapshot(args)
    except Exception as exc:  # the agent must never see a failure: log it and carry on
        hook.fail(exc)
    hook.finish(time.monotonic() - started)
    return hook.result


BUDGET_S = 30.0
"""How long a hook may take before it gives up (``STASHPOINT_HOOK_TIMEOUT``; 0: no limit).
Below the agents' own hook timeouts (Claude Code: 60 s), so a store held by a garbage
collection or a stuck writer costs the agent a logged, skipped snapshot, not a killed hook."""
MAX_BUDGET_S = 3600.0
"""The most ``STASHPOINT_HOOK_TIMEOUT`` is taken to mean (``inf`` or ``1e300`` included): far
beyond any agent's hook timeout, and within what the interval timer accepts."""
LOG_CAPTURE_MAX = 50
"""Library log records kept per hook run (a retrying connection pool repeats itself)."""


def _capture_logging(hook: _HookRun) -> Callable[[], None]:
    """Route every log record (the root logger, and the last-resort handler that a logger
    which does not propagate falls back to) to the hook's log; the function that undoes it."""
    import logging

    class _LogCapture(logging.Handler):
        """Library log records of one hook run: lines of its hooks.log entry while it runs, then
        appended to hooks.log directly (records emitted while the store closes)."""

        def __init__(self, hook: _HookRun) -> None:
            super().__init__(logging.WARNING)
            self.hook = hook
            self.kept = 0

        def emit(self, record: logging.LogRecord) -> None:
            try:
                if self.kept >= LOG_CAPTURE_MAX:
                    return
                self.kept += 1
                text = record.getMessage().replace("\n", "\n        ")
                line = f"log {record.levelname.lower()} {record.name}: {text}"
                if self.kept == LOG_CAPTURE_MAX:
                    line += " (further log records dropped)"
                if self.hook.finished is None:
                    self.hook.log.append(line)
                else:
                    _append_log(self.hook.finished, f"    {line}\n")
            except Exception:  # never let a log record reach the agent, nor fail the hook
                pass

    handler = _LogCapture(hook)
    root = logging.getLogger()
    previous_last_resort = logging.lastResort
    root.addHandler(handler)
    logging.lastResort = handler

    def restore() -> None:
        root.removeHandler(handler)
        logging.lastResort = previous_last_resort

    return restore


class HookTimeout(Exception):
    """The hook's time budget ran out; the snapshot it was taking is abandoned (a checkpoint
    not committed yet leaves nothing behind, as after a crash)."""


def _budget_seconds() -> float:
    raw = os.environ.get("STASHPOINT_HOOK_TIMEOUT", "")
    try:
        seconds = float(raw) if raw else BUDGET_S
    except ValueError:
        return BUDGET_S
    if math.isnan(seconds):
        return BUDGET_S
    return min(max(0.0, seconds), MAX_BUDGET_S)


@contextlib.contextmanager
def _time_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`HookTimeout` in this thread after ``seconds`` (SIGALRM: it also ends a
    wait in ``flock`` or ``sleep``); where there is no such signal, no budget."""
    if not seconds or not hasattr(signal, "setitimer") or not _in_main_thread():
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise HookTimeout(
            f"gave up after {seconds:g} s: the store stayed busy (a garbage collection or "
            "another writer held it); set STASHPOINT_HOOK_TIMEOUT to wait longer"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _HookRun:
    """One hook invocation: payload -> session, workspace, message -> checkpoint -> log line."""

    def __init__(self, ctx: Ctx, agent: str) -> None:
        self.ctx = ctx
        self.agent = agent
        self.store: Store | None = None
        self.event = "run"
        self.result: dict[str, Any] = {"agent": agent, "ok": False}
        self.log: list[str] = []
        self.finished: Path | None = None
        """The log file once :meth:`finish` wrote this run's entry."""

    def snapshot(self, args: tuple[str, ...]) -> None:
        import warnings

        payload = self._payload(args)
        self.event = _text(payload.get("hook_event_name") or payload.get("type")) or "run"
        agent_session = _text(
            payload.get("session_id") or payload.get("thread-id") or payload.get("thread_id")
        )
        prefix = SESSION_PREFIX[self.agent]
        name = self.ctx.session_name or (
            f"{prefix}-{_safe(agent_session)}" if agent_session else prefix
        )
        self.ctx.session_name = name
        self.result["session"] = name
        if self.ctx.workspace is None:
            self.ctx.workspace = self._workspace(payload)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                from ..workspace import check_root

                # refuse $HOME and / before a store directory is created there
                check_root(self.ctx.locate(create=True)[1], force=self.ctx.force)
                self.store = self.ctx.store(create=True)
                session = self.ctx.session(create=True)
                before = session.head
                cp = session.checkpoint(
                    message=_message(self.agent, self.event, payload, args, session.root),
                    kind="auto",
                    meta={"hook": _meta(self.agent, self.event, payload, agent_session)},
                    skip_unchanged=True,
                )
            finally:
                self.log += [f"warning: {w.message}" for w in caught]
        created = before is None or cp.id != before.id
        self.result.update(ok=True, checkpoint=cp.id, created=created)
        self._hand_off_upkeep()
        self._start_watch()

    def _start_watch(self) -> None:
        """With ``$STASHPOINT_WATCH=1``, a hook that ran without a daemon starts one for the
        next calls (in the background: this call does not wait for its first scan)."""
        from . import watch_cmd

        if not watch_cmd.wanted() or self.ctx.mirror_url:
            return
        try:
            from ..watchd.protocol import socket_path

            url, root, _s, _b = self.ctx.locate()
            path = socket_path(url, str(root), create=True)
            if path is not None and watch_cmd.ping(path) is None:
                watch_cmd.spawn(url, str(root), path)
                self.log.append("started the watch daemon ($STASHPOINT_WATCH)")
        except Exception as exc:  # the snapshot has succeeded; the next hook tries again
            self.log.append(f"warning: watch daemon not started: {exc}")

    def _hand_off_upkeep(self) -> None:
        """Once a day a written store's close runs retention and GC, which takes as long as
        the store is big: in a hook that would stall the agent (or be killed by its hook
        timeout, every day). When it is due, a detached ``stashpoint prune --auto`` does it;
        it is marked as run first, so the hooks that follow do not start another."""
        store = self.store
        if store is None:
            return
        store.upkeep_on_close = False
        from .. import upkeep

        try:
            if not upkeep.claim_due(store):
                return
            import subprocess

            url, root, _s, _b = self.ctx.locate()
            argv = [sys.executable, "-m", "stashpoint", "--store", url]
            if self.ctx.mirror_url:
                argv += ["--mirror", self.ctx.mirror_url]
            with open(self._log_path(), "ab") as log:
                subprocess.Popen(
                    [*argv, "prune", "--auto"],
                    cwd=root,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,  # its failures land in hooks.log
                    start_new_session=True,  # outlives the hook; the agent's signals miss it
                )
            self.log.append("upkeep due: started `stashpoint prune --auto` in the background")
        except Exception as exc:  # upkeep is retried later; the snapshot has succeeded
            self.log.append(f"warning: upkeep not started: {exc}")

    def _payload(self, args: tuple[str, ...]) -> dict[str, Any]:
        """Codex ``notify`` passes JSON as the last argument; hooks write it to stdin."""
        raw = ""
        if args and args[-1].lstrip().startswith("{"):
            raw = args[-1]
        elif self.agent != "aider":
            raw = _read_stdin()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            self.log.append(f"bad payload (not JSON: {exc}); snapshotting anyway: {raw[:200]!r}")
            return {}
        if not isinstance(data, dict):
            self.log.append(f"bad payload (not a JSON object); snapshotting anyway: {raw[:200]!r}")
            return {}
        return data

    def _workspace(self, payload: dict[str, Any]) -> str:
        candidates = [os.environ.get("CLAUDE_PROJECT_DIR")] if self.agent == "claude-code" else []
        candidates.append(_text(payload.get("cwd")))
        start = next((c for c in candidates if c and os.path.isdir(c)), os.getcwd())
        return str(_project_root(Path(start).resolve()))

    def fail(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, click.ClickException):
            text = exc.format_message()
        self.result.update(ok=False, error=f"{type(exc).__name__}: {text}")

    def finish(self, seconds: float) -> None:
        from datetime import datetime, timezone

        r = self.result
        if r.get("ok"):
            what = f"{'created' if r['created'] else 'unchanged'} {r['checkpoint']}"
        else:
            what = f"FAILED {r.get('error')}"
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines = [
            f"{now} {self.agent} {self.event} session={r.get('session', '-')} {what} "
            f"({seconds * 1000:.0f} ms)",
            *(f"    {line}" for line in self.log),
        ]
        path = self._log_path()
        r["log"] = str(path)
        _append_log(path, "\n".join(lines) + "\n")
        self.finished = path

    def _log_path(self) -> Path:
        """hooks.log in the store directory; found without opening the store, so that a
        store that cannot be opened still gets its failure logged."""
        if self.store is not None and self.store.home is not None:
            return self.store.home / LOG_NAME
        url: str | None = self.ctx.store_url
        if url is None:
            try:
                url = self.ctx.locate(create=True)[0]
            except Exception:
                url = None
        from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

        home = parse_store_url(url).home if url else None
        if home is not None and home.is_dir():
            return home / LOG_NAME
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "stashpoint" / LOG_NAME


def _project_root(start: Path) -> Path:
    """Where a hook installed for the user (not per project) should snapshot: the directory
    with the nearest store above ``start``, else the enclosing git repository, else ``start``
    itself (an agent may run from a subdirectory)."""

    if discover(start) is not None:
        return start  # the store's own directory is found from here
    home = Path.home().resolve()
    here = start
    while here != home and here.parent != here:
        if (here / ".git").exists():
            return here
        here = here.parent
    return start


def _append_log(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if path.stat().st_size > LOG_MAX_BYTES:
                os.replace(path, path.with_name(path.name + ".1"))
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass  # nowhere left to report to; the agent still must not notice


def _read_stdin(timeout: float = 3.0) -> str:
    """The payload on stdin, or "" for a terminal; never waits more than ``timeout`` for an
    agent that leaves the pipe open. One reader for both paths: the daemon's client reads a
    hook's payload the same way before it hands the hook to a running daemon."""
    return read_stdin(timeout) or ""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _safe(ident: str) -> str:
    """The agent's session id as part of a session name. An id that had to change (other
    characters, over 80 long) gets a digest of the original, so two ids never share a
    session (``a/b`` and ``a_b``); the UUIDs agents send pass unchanged."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ident)
    if safe == ident and len(ident) <= 80:
        return ident
    import hashlib

    tag = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe[:67]}-{tag}"


def _excerpt(value: Any, n: int = 120) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _tool_detail(tool: str | None, tool_input: Any, root: Path | None) -> str | None:
    if not isinstance(tool_input, dict):
        return None
    command = tool_input.get("command")
    if tool == "apply_patch" and isinstance(command, str):
        files = re.findall(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", command, re.MULTILINE)
        return ", ".join(files) if files else None
    for key in ("command", "file_path", "notebook_path", "path"):
        value = tool_input.get(key)
        if isinstance(value, str):
            if key != "command" and root is not None and os.path.isabs(value):
                rel = os.path.relpath(value, root)
                value = value if rel.startswith("..") else rel
            return value
    return None


def _message(
    agent: str, event: str, payload: dict[str, Any], args: tuple[str, ...], root: Path | None
) -> str:
    head = f"{SESSION_PREFIX[agent]} {event}"
    tool = _text(payload.get("tool_name"))
    detail: Any = None
    if tool:
        head += f" {tool}"
        detail = _tool_detail(tool, payload.get("tool_input"), root)
    elif _text(payload.get("prompt")):
        detail = payload["prompt"]
    elif _text(payload.get("source")):
        detail = payload["source"]
    elif isinstance(payload.get("input-messages"), list) and payload["input-messages"]:
        detail = payload["input-messages"][-1]
    elif _text(payload.get("reason")):
        detail = payload["reason"]  # SessionEnd: clear, logout, prompt_input_exit, other
    elif agent == "aider":
        words = [a for a in args if not a.lstrip().startswith("{")]
        if words[:1] == [AIDER_REPLY_END]:
            return "aider end of reply"
        head = "aider after edit"
        detail = " ".join(words) or None
    return f"{head}: {_excerpt(detail)}" if detail else head


def _meta(agent: str, event: str, payload: dict[str, Any], agent_session: str | None) -> Any:
    meta: dict[str, Any] = {"agent": agent, "event": event}
    if agent_session:
        meta["agent_session"] = agent_session
    for key in ("tool_name", "transcript_path", "turn_id", "turn-id", "model", "source", "reason"):
        value = payload.get(key)
        if isinstance(value, str | int | float | bool):
            meta[key.replace("-", "_")] = value
    return meta
