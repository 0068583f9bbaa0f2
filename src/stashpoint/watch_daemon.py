"""The watch daemon: one process per workspace and store that keeps the store open and the
workspace under an inotify watch, and runs the commands the thin client hands it.

Why a daemon: a ``stashpoint snap`` spends most of its time before and after the snapshot
(imports, opening the store, a stat of every file, closing). The daemon pays those once;
a served command costs a connection, the directories the watcher saw change, and the commit.

A request is the command line itself: the daemon runs the same click commands the CLI runs
(:func:`stashpoint.cli.main`), in this process, with the caller's directory, the variables
it passes (:data:`~stashpoint.watchd.protocol.PASS_ENV`) and its stdin, and returns what
they printed and the exit code. The only difference is the :class:`Ctx` they get: its store
is the daemon's open store, and a session over the watched workspace scans through the
daemon's watcher. A request for another store, another environment or anything the daemon
cannot vouch for gets "fallback": the client then runs the command itself.

A snapshot taken here always equals a full scan: the watcher falls back to scanning whatever
it cannot vouch for (queue overflow, an edited ignore file, a directory moved, a GC), and a
daemon (re)started begins with a full scan. One request at a time, on the main thread (the
hook budget's SIGALRM needs it); a request that fails in an unexpected way drops the open
store and the watcher's baseline, so the next one starts from a full scan.

Run as ``python -m stashpoint.watch_daemon --store URL --root DIR`` (``stashpoint watch
start`` does it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from . import __version__
from .cli._app import Ctx
from .watchd.client import served
from .watchd.protocol import (
    PASS_ENV,
    ProtocolError,
    env_to_match,
    recv_message,
    send_message,
    socket_path,
    store_key,
)

if TYPE_CHECKING:
    from ._store import Store
    from .session import Session
    from .workspace import Workspace
    from .workspace.watch import Watcher

__all__ = ["Daemon", "main"]

IDLE_S = 1800.0
"""How long a daemon waits for a request before it stops (``watch start --idle``)."""
READ_TIMEOUT_S = 10.0
"""How long a connected client may take to send its request (one request at a time)."""
_PEERCRED = struct.Struct("3i")


class _Terminated(BaseException):
    """SIGTERM: stop serving (a BaseException: no command's handler takes it for its own)."""


def _terminate(_signum: int, _frame: Any) -> None:
    raise _Terminated


class NotServed(BaseException):
    """The request is not for this daemon (another store, a mirror): the client runs it.
    A BaseException so that no command's ``except Exception`` (a hook's) swallows it."""


class Daemon:
    """The daemon of one workspace ``root`` over the store ``url``."""

    def __init__(
        self, url: str, root: Path, *, idle: float = IDLE_S, path: str | None = None
    ) -> None:
        self.url, self.root, self.idle = url, root, idle
        self.key = store_key(url)
        path = path or socket_path(url, str(root), create=True)
        if path is None:
            raise OSError(f"no private directory for the socket of {root}")
        self.path = path
        self.env = env_to_match(os.environ)
        self.started = time.time()
        self.last = time.monotonic()
        self.requests = 0
        self.full_scans = 0
        self.last_ms = 0.0
        """How long the last request took in here (``watch status``)."""
        self.store: Store | None = None
        self.watcher: Watcher | None = None
        self._ws: Workspace | None = None
        self._listener: socket.socket | None = None
        self._ino: int | None = None
        self._lock_fd: int | None = None
        self._stopping = False

    # -- the warm state ---------------------------------------------------------------------
    def open_store(self) -> Store:
        if self.store is None:
            from .opening import open_store

            self.store = open_store(self.url)
            self.store.upkeep_on_close = False  # handed to a background process: see run()
        return self.store

    def workspace(self, store: Store) -> Workspace:
        """The watched workspace over ``store`` (made again after the store was reopened,
        continuing the same watch)."""
        ws = self._ws
        if ws is None or ws.blobs is not store.blobs:
            from .binding import open_workspace

            try:
                _root, new = open_workspace(store, self.root, force=True, watch=ws is None)
            except OSError:  # no inotify instance left (a per-user limit): scan, unwatched
                _root, new = open_workspace(store, self.root, force=True, watch=False)
            if ws is not None:
                new.take_over(ws)
            self._ws = ws = new
            self.watcher = ws.watcher
        return ws

    def warm_up(self) -> None:
        """Open the store and scan the workspace once, so the first request is incremental.
        The scan's blobs are recorded (as a restore's check does) before it becomes the
        baseline; no checkpoint is made. The served commands' modules are imported here too,
        not by the first request (which spent ~15 ms of CPU more than the next ones; the
        first rewind, ~12 ms more for the durable-run package it ends runs with)."""
        import click

        from . import durable, session, upkeep  # noqa: F401  # every served command opens a session
        from .cli import cli

        with click.Context(cli) as ctx:
            for name in ("snap", "rewind", "log", "hooks"):
                cli.get_command(ctx, name)
        from .cli import hook_runner  # noqa: F401

        store = self.open_store()
        ws = self.workspace(store)
        if ws.watcher is not None and ws.watcher.everything:
            self.full_scans += 1
        _result, pending = ws.scan()
        if pending:
            store.blobs.meta.put_blobs(pending)
        ws.save_cache()

    def drop(self) -> None:
        """Forget the warm state (after a request failed in an unexpected way)."""
        if self._ws is not None and self._ws.watcher is not None:
            self._ws.watcher.close()
        self._ws = self.watcher = None
        store, self.store = self.store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    # -- the socket --------------------------------------------------------------------------
    def listen(self) -> bool:
        """Take the daemon lock and bind the socket; False when another daemon holds it."""
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a daemon killed before it could remove it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        self._listener = sock
        self._ino = os.stat(self.path).st_ino
        return True

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self._ino:
                    os.unlink(self.path)
        self.drop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _still_ours(self) -> bool:
        """The socket file is still ours and the workspace and store still exist."""
        try:
            if os.stat(self.path).st_ino != self._ino:
                return False
        except OSError:
            return False
        local = None if "://" in self.key else Path(self.key)
        return self.root.is_dir() and (local is None or local.exists())

    def serve(self) -> None:
        assert self._listener is not None
        self.last = time.monotonic()  # idle from now: not while the first scan ran
        while not self._stopping:
            left = self.idle - (time.monotonic() - self.last)
            if left <= 0 or not self._still_ours():
                return
            fds: list[Any] = [self._listener]
            if self.watcher is not None and self.watcher.fd >= 0:
                fds.append(self.watcher.fd)
            ready, _w, _x = select.select(fds, [], [], min(left, 5.0))
            if self.watcher is not None and self.watcher.fd in ready:
                self.watcher.drain()  # keep the kernel queue short: no overflow, no rescan
            if self._listener in ready:
                conn, _addr = self._listener.accept()
                with conn:
                    self._connection(conn)

    def _connection(self, conn: socket.socket) -> None:
        try:
            uid = _PEERCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )[1]
            if uid != os.getuid():
                return  # the socket is 0600: only another user's root gets here
            conn.settimeout(READ_TIMEOUT_S)
            try:
                message = recv_message(conn)
            except ProtocolError as exc:
                send_message(conn, {"error": f"bad request: {exc}"})
                return
            except OSError:
                return
            conn.settimeout(None)
            answer = self.answer(message)
            send_message(conn, answer)
        except OSError:
            pass  # the client went away; the next one is served
        except Exception as exc:  # a bug must cost one request, never the daemon
            self.drop()
            with contextlib.suppress(Exception):
                send_message(conn, {"error": f"internal error: {exc!r}"})

    # -- requests ----------------------------------------------------------------------------
    def answer(self, message: dict[str, object]) -> dict[str, object]:
        op = message.get("op")
        if message.get("v") != 1:
            return {"error": "unsupported protocol version"}
        if op == "ping":
            return self.status()
        if op == "stop":
            self._stopping = True
            return {"ok": True, "pid": os.getpid()}
        if op != "run":
            return {"error": f"unknown request {op!r}"}
        if message.get("version") != __version__:  # upgraded since the daemon started
            return {"fallback": f"the daemon runs stashpoint {__version__}"}
        if message.get("match") != self.env:
            return {"fallback": "the environment differs from the daemon's"}
        try:
            request = _Request.parse(message)
        except ValueError as exc:
            return {"error": f"bad request: {exc}"}
        if served(request.argv) is None:
            return {"error": "not a command the watch daemon runs"}
        self.last = time.monotonic()
        self.requests += 1
        started = time.perf_counter()
        try:
            return self.run(request)
        finally:
            self.last_ms = (time.perf_counter() - started) * 1000

    def status(self) -> dict[str, object]:
        return {
            "ok": True,
            "pid": os.getpid(),
            "root": str(self.root),
            "store": self.url,
            "socket": self.path,
            "started": self.started,
            "requests": self.requests,
            "full_scans": self.full_scans,
            "last_request_ms": round(self.last_ms, 2),
            "idle_timeout": self.idle,
            "idle_left": max(0.0, self.idle - (time.monotonic() - self.last)),
            "watching": self.watcher is not None,
        }

    def run(self, request: _Request) -> dict[str, object]:
        from .cli import main as cli_main

        out, err = _Capture(request.tty), _Capture(False)
        code = 0
        _WarmCtx.daemon = self
        watcher = self.watcher
        if watcher is not None:
            watcher.drain()
        was_everything = watcher is not None and watcher.everything
        try:
            with _applied(request), _streams(request.stdin, out, err):
                try:
                    cli_main(request.argv)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    if not isinstance(exc.code, int | None):
                        err.write(f"{exc.code}\n")
        except NotServed as why:
            return {"fallback": str(why)}
        except Exception as exc:  # a bug, not the command's error (main() maps those)
            self.drop()
            return {"code": 1, "out": out.text(), "err": err.text() + f"error: {exc!r}\n"}
        finally:
            _WarmCtx.daemon = None
        if (
            was_everything
            and watcher is not None
            and watcher is self.watcher
            and not watcher.everything
        ):
            self.full_scans += 1  # this request's snapshot scanned everything
        self._after_request()
        return {"code": code, "out": out.text(), "err": err.text()}

    def _after_request(self) -> None:
        """What closing the store does after a CLI command: make deferred checkpoints durable,
        and start the periodic upkeep (in the background, as a hook does) when it is due."""
        store = self.store
        if store is None:
            return
        try:
            store.flush()
            if store.wrote:
                store.wrote = False
                from . import upkeep

                if upkeep.claim_due(store):
                    import subprocess

                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "stashpoint",
                            "--store",
                            self.url,
                            "prune",
                            "--auto",
                        ],
                        cwd=self.root,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                        env={**os.environ, "STASHPOINT_NO_DAEMON": "1"},
                    )
        except Exception:  # upkeep is retried later; the request has succeeded
            self.drop()


class _Request:
    """A ``run`` request, checked field by field."""

    def __init__(
        self, argv: list[str], cwd: str, env: dict[str, str], stdin: str | None, tty: bool
    ) -> None:
        self.argv, self.cwd, self.env, self.stdin, self.tty = argv, cwd, env, stdin, tty

    @classmethod
    def parse(cls, m: dict[str, object]) -> _Request:
        argv, cwd, env = m.get("argv"), m.get("cwd"), m.get("env")
        stdin, tty = m.get("stdin"), m.get("tty", False)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a list of strings")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise ValueError("cwd must be an absolute path")
        if not isinstance(env, dict) or not all(
            k in PASS_ENV and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"env may only hold strings for {', '.join(PASS_ENV)}")
        if stdin is not None and not isinstance(stdin, str):
            raise ValueError("stdin must be a string or null")
        if not isinstance(tty, bool):
            raise ValueError("tty must be a boolean")
        if any("\0" in a for a in [*argv, cwd, *env.values()]):
            raise ValueError("NUL in an argument")
        return cls(argv, cwd, env, stdin, tty)


class _Capture(io.TextIOWrapper):
    """What a command prints, kept for the answer; a terminal when the client's is one (so
    colours are as they would be)."""

    def __init__(self, tty: bool) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty

    def text(self) -> str:
        self.flush()
        buf = self.buffer
        assert isinstance(buf, io.BytesIO)
        return buf.getvalue().decode("utf-8", "surrogateescape")


@contextlib.contextmanager
def _applied(request: _Request) -> Iterator[None]:
    """The caller's directory and passed variables, for the request's duration."""
    saved = {k: os.environ.get(k) for k in PASS_ENV}
    here = os.getcwd()
    try:
        os.chdir(request.cwd)
    except OSError as exc:
        raise NotServed(f"cannot enter {request.cwd}: {exc.strerror}") from None
    try:
        for k in PASS_ENV:
            if k in request.env:
                os.environ[k] = request.env[k]
            else:
                os.environ.pop(k, None)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(here)


@contextlib.contextmanager
def _streams(stdin: str | None, out: _Capture, err: _Capture) -> Iterator[None]:
    """stdin (a pipe holding the caller's bytes, at end of file after them), stdout and
    stderr swapped. What fits in the pipe is written here; only a payload larger than the
    pipe needs a feeding thread (starting one costs a served command about a millisecond)."""
    saved = sys.stdin, sys.stdout, sys.stderr
    r, w = os.pipe()
    data = (stdin or "").encode("utf-8", "surrogateescape")
    feeder = None
    os.set_blocking(w, False)
    try:
        sent = os.write(w, data) if data else 0
    except BlockingIOError:
        sent = 0
    if sent < len(data):
        import threading

        os.set_blocking(w, True)
        rest = data[sent:]

        def feed() -> None:
            with contextlib.suppress(OSError):
                os.write(w, rest)
            os.close(w)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
    else:
        os.close(w)
    sys.stdin = open(r, encoding="utf-8", errors="replace", closefd=True)  # noqa: SIM115
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        stdin_file = sys.stdin
        sys.stdin, sys.stdout, sys.stderr = saved
        stdin_file.close()  # a writer still blocked gets EPIPE
        if feeder is not None:
            feeder.join(5.0)


class _WarmCtx(Ctx):
    """The CLI's context, handing out the daemon's open store and watched workspace."""

    daemon: ClassVar[Daemon | None] = None

    def store(self, *, create: bool = False) -> Store:
        daemon = _WarmCtx.daemon
        assert daemon is not None
        url, _root, _s, _b = self.locate(create=create)
        if store_key(url) != daemon.key:
            raise NotServed(f"another store ({url})")
        if self.mirror_url:
            raise NotServed("a mirror")
        self._store = daemon.open_store()
        return self._store  # type: ignore[no-any-return]

    def session(self, *, create: bool = False, files: bool = True) -> Session:
        session = super().session(create=create, files=files)
        daemon = _WarmCtx.daemon
        assert daemon is not None
        if session.workspace is not None and session.root == daemon.root:
            session.workspace = daemon.workspace(session.store)
        return session


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="stashpoint-watchd", description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--idle", type=float, default=IDLE_S)
    parser.add_argument("--socket", help="where to listen (default: socket_path())")
    args = parser.parse_args(argv)
    import signal

    from .cli import _app, watch_cmd

    watch_cmd.IN_DAEMON = True
    _app.Ctx = _WarmCtx  # type: ignore[misc]  # the group makes each command's Ctx from _app
    daemon = Daemon(args.store, Path(args.root).resolve(), idle=args.idle, path=args.socket)
    signal.signal(signal.SIGTERM, _terminate)
    if not daemon.listen():
        print(f"a watch daemon already serves {daemon.root}", file=sys.stderr)
        return
    try:
        daemon.warm_up()
        print(f"watching {daemon.root} (pid {os.getpid()})", flush=True)
        daemon.serve()
    except _Terminated:
        pass
    finally:
        daemon.close()


if __name__ == "__main__":
    main()
