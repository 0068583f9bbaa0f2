"""``stashpoint watch start|status|stop``: the workspace's watch daemon (see
:mod:`stashpoint.watch_daemon`), which serves ``snap``, ``rewind``, ``log`` and ``hooks
run`` in milliseconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import click

from ..watchd.client import Unanswered, request
from ..watchd.protocol import socket_path, store_key
from ._app import Ctx, emit, json_option, pass_ctx

START_WAIT_S = 120.0
"""How long ``watch start`` waits for the daemon's first full scan (a large workspace)."""
DEFAULT_IDLE_S = 1800.0


def _where(ctx: Ctx, *, create: bool) -> tuple[str, str, str]:
    """(store url, workspace root, socket path) of this command's workspace."""
    url, root, _s, _b = ctx.locate(create=create)
    path = socket_path(url, str(root), create=create)
    if path is None:
        raise click.ClickException(
            f"/tmp/stashpoint-{os.getuid()} is not a private directory: no place for the socket"
        )
    return url, str(root), path


def ping(path: str) -> dict[str, Any] | None:
    """The running daemon's status, or None when none answers at ``path``."""
    try:
        answer = request(path, {"v": 1, "op": "ping"}, 5.0)
    except (OSError, Unanswered):
        return None
    return answer if answer.get("ok") else None


IN_DAEMON = False
"""Set by the daemon: a command it runs must not start (or wait for) a daemon."""


def wanted() -> bool:
    """``$STASHPOINT_WATCH`` asks for a daemon wherever hooks run (see ``hooks install``)."""
    flag = os.environ.get("STASHPOINT_WATCH", "").lower() in ("1", "true", "yes", "on")
    return flag and not IN_DAEMON


def spawn(url: str, root: str, path: str, idle: float = DEFAULT_IDLE_S) -> subprocess.Popen[bytes]:
    """Start a daemon process for ``root`` over ``url`` (it exits at once if one runs)."""
    log = path + ".log"
    env = {k: v for k, v in os.environ.items() if k != "STASHPOINT_NO_DAEMON"}
    argv = ["--store", store_key(url), "--root", root, "--idle", repr(idle), "--socket", path]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "stashpoint.watch_daemon", *argv],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,  # outlives this command and the terminal's signals
            env=env,
        )
    finally:
        os.close(fd)


def start_daemon(ctx: Ctx, idle: float = DEFAULT_IDLE_S) -> tuple[dict[str, Any], bool]:
    """Start the daemon of this workspace unless it runs; (its status, whether started)."""
    from ..workspace import check_root
    from ..workspace.watch import watch_supported

    if ctx.mirror_url:
        raise click.ClickException("the watch daemon does not serve a store with a mirror")
    if not watch_supported():
        raise click.ClickException("the watch daemon needs inotify (Linux)")
    check_root(ctx.locate(create=True)[1], force=ctx.force)
    # Create it first: the daemon opens an existing store, and the socket goes in its directory.
    ctx.store(create=True)
    url, root, path = _where(ctx, create=True)
    running = ping(path)
    if running is not None:
        return running, False
    log = path + ".log"
    proc = spawn(url, root, path, idle)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        status = ping(path)
        if status is not None:
            return status, True
        if proc.poll() is not None:
            status = ping(path)  # lost a race with another start: that one serves
            if status is not None:
                return status, False
            raise click.ClickException(
                f"the watch daemon exited (code {proc.returncode}); see {log}"
            )
        time.sleep(0.05)
    raise click.ClickException(f"the watch daemon did not answer within {START_WAIT_S:.0f} s")


@click.group()
def watch() -> None:
    """A daemon per workspace that keeps the store open and watches the files (inotify), so
    that snap, rewind, log and agent hooks run in milliseconds.

    Commands find it by themselves; with none running they run as before. It stops after
    --idle seconds without a request. Every snapshot it takes equals a full scan.

    \b
    Example:
      stashpoint watch start
      stashpoint snap -m "fast"        # served by the daemon
      stashpoint watch status
      stashpoint watch stop
    """


@watch.command()
@click.option(
    "--idle",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_IDLE_S,
    show_default=True,
    help="Stop after this many seconds without a request.",
)
@json_option
@pass_ctx
def start(ctx: Ctx, idle: float) -> None:
    """Start this workspace's daemon (nothing happens if it runs already).

    \b
    Example:
      stashpoint watch start --idle 3600
    """
    status, started = start_daemon(ctx, idle)
    emit(
        ctx,
        {**status, "started_now": started},
        f"{'started' if started else 'already running'}: watch daemon {status['pid']} "
        f"for {status['root']}",
    )


@watch.command()
@json_option
@pass_ctx
def status(ctx: Ctx) -> None:
    """Show whether this workspace's daemon runs, and what it has done.

    \b
    Example:
      stashpoint watch status --json
    """
    _url, root, path = _where(ctx, create=False)
    got = ping(path)
    if got is None:
        emit(ctx, {"running": False, "root": root, "socket": path}, f"no watch daemon for {root}")
        return
    emit(
        ctx,
        {**got, "running": True},
        f"watch daemon {got['pid']} for {got['root']}: {got['requests']} request(s), "
        f"stops after {float(str(got['idle_left'])):.0f} s idle; socket {got['socket']}",
    )


@watch.command()
@json_option
@pass_ctx
def stop(ctx: Ctx) -> None:
    """Stop this workspace's daemon; commands then run without it.

    \b
    Example:
      stashpoint watch stop
    """
    _url, root, path = _where(ctx, create=False)
    try:
        answer = request(path, {"v": 1, "op": "stop"}, 30.0)
    except (OSError, Unanswered):
        emit(ctx, {"stopped": False, "root": root}, f"no watch daemon for {root}")
        return
    deadline = time.monotonic() + 10.0
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    emit(
        ctx,
        {"stopped": True, "root": root, "pid": answer.get("pid")},
        f"stopped watch daemon {answer.get('pid')} for {root}",
    )
