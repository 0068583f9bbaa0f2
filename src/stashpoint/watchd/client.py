"""The thin client: hand a command to the workspace's watch daemon, if one is running.

:func:`run_if_served` is called by the ``stashpoint`` entry point before anything else is
imported. For the commands a daemon serves (``snap``, ``rewind``, ``log``, ``hooks run``) it
finds the store the way the CLI does (``--store``/``$STASHPOINT_STORE``, else the nearest
``.stashpoint`` above the directory), connects to that workspace's socket and prints what
the daemon answers. Whenever anything is unusual (another command or option, no socket, a
daemon that refuses or does not answer) it returns None and the full CLI runs instead: the
daemon is an accelerator, never a different behaviour. Standard library only, imported
lazily where it can be (the import time of this module is the latency floor of a served
command).
"""

import sys

from .. import __version__
from .protocol import (
    PASS_ENV,
    decode,
    dirname,
    encode,
    env_to_match,
    environ,
    isdir,
    isfile,
    join,
    realpath,
    recv_body,
    socket_path,
)

try:
    import posix as os  # not os itself: loading it costs a site-less start ~1.3 ms
except ImportError:  # pragma: no cover - not POSIX
    import os  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Unanswered", "find_store", "request", "run_if_served", "served"]

_GLOBAL_VALUE = ("--store", "--session", "-C", "--workspace")
_GLOBAL_FLAG = ("--json", "--force")
_REFUSED = ("-h", "--help", "--version", "--artifact", "--artifacts", "--exec")
"""Options whose commands the daemon does not run (they write elsewhere, or run a program)."""
_REFUSED_PREFIX = ("--artifact", "--exec", "--help")
_SERVED = ("snap", "rewind", "log")
STORE_DIR = ".stashpoint"
CONNECT_TIMEOUT_S = 2.0
"""How long a client waits for a daemon to take its connection before running itself."""


def _globals(argv: list[str]) -> tuple[dict[str, str | bool], list[str]] | None:
    """(global options, the command and its arguments), or None for what is not served."""
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in _GLOBAL_VALUE:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                value = argv[i + 1]
                i += 1
            opts["-C" if name == "--workspace" else name] = value
        elif arg in _GLOBAL_FLAG:
            opts[arg] = True
        elif arg.startswith("-"):
            return None  # --mirror, --version, --help, anything else: the full CLI
        else:
            return opts, argv[i:]
        i += 1
    return None


def _home() -> str:
    """``os.path.expanduser("~")``."""
    home = environ().get("HOME")
    if home is None:
        import pwd

        home = pwd.getpwuid(os.getuid()).pw_dir
    return home.rstrip("/") or "/"


def _exists(path: str) -> bool:
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def find_store(start: str, store: str | None) -> tuple[str, str] | None:
    """(store url, workspace root) as the CLI locates them from ``start``; None where only
    the CLI can tell (no store yet, a broken link file)."""
    try:
        here = realpath(start)
        if not isdir(here):
            return None
        if store:
            return store, here
        try:
            home = realpath(_home())
        except OSError:  # no such home (HOME=/nonexistent): no directory can be it
            home = ""
        dev = os.stat(here).st_dev
        while True:
            candidate = join(here, STORE_DIR)
            if isdir(candidate):
                return candidate, here
            if isfile(candidate):
                import json

                with open(candidate, encoding="utf-8") as f:
                    link = json.load(f)
                return str(link["store"]), here
            parent = dirname(here)
            if parent == here or here == home or os.stat(parent).st_dev != dev:
                return None
            here = parent
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_stdin(timeout: float = 3.0) -> str | None:
    """The payload a hook gets on stdin, read as ``hooks run`` reads it (at most ``timeout``
    seconds for an agent that leaves the pipe open); None for a terminal."""
    import select
    import time

    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return None
    if os.isatty(fd):
        return None
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _w, _x = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _hook_start(agent: str, args: list[str], stdin: str | None) -> str:
    """The directory ``hooks run`` snapshots from (see the hook runner's ``_workspace``)."""
    candidates = [environ().get("CLAUDE_PROJECT_DIR")] if agent == "claude-code" else []
    raw = args[-1] if args and args[-1].lstrip().startswith("{") else stdin
    if raw and raw.strip():
        import json

        try:
            payload = json.loads(raw)
            cwd = payload.get("cwd") if isinstance(payload, dict) else None
            candidates.append(cwd if isinstance(cwd, str) else None)
        except ValueError:
            pass
    return next((c for c in candidates if c and isdir(c)), os.getcwd())


def _put_back_stdin(data: str) -> None:
    """The full CLI runs after the client read stdin: give it the same bytes on fd 0."""
    import threading

    r, w = os.pipe()
    raw = data.encode("utf-8")

    def feed() -> None:
        try:
            os.write(w, raw)
        except OSError:
            pass
        finally:
            os.close(w)

    if len(raw) < 60000:
        feed()
    else:
        threading.Thread(target=feed, daemon=True).start()
    os.dup2(r, 0)
    os.close(r)


def _connect(path: str) -> "Any":
    """A connection to the daemon at ``path``; OSError when none listens there, or when what
    listens is not this user's process (the socket's directory is this user's, but a
    process that can write there must not be able to pose as the daemon)."""
    try:
        import _socket as socket_mod  # `socket` imports enum (~5 ms of a served command)
    except ImportError:  # pragma: no cover - an interpreter without it
        import socket as socket_mod  # type: ignore[no-redef]
    sock = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(path)
        peercred = getattr(socket_mod, "SO_PEERCRED", None)
        if peercred is None:  # not Linux: no way to tell who listens
            raise OSError("no peer credentials on this platform")
        cred = sock.getsockopt(socket_mod.SOL_SOCKET, peercred, 12)
        if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
            raise OSError(f"{path} is served by another user's process")
    except BaseException:
        sock.close()
        raise
    return sock


def request(path: str, message: dict[str, object], timeout: float | None) -> dict[str, object]:
    """Send one request to the daemon at ``path`` and return its answer. OSError when no
    daemon answers there (nothing was sent); :class:`Unanswered` when the request went out
    but no answer came back (the daemon may have run it)."""
    sock = _connect(path)
    try:
        body = encode(message).encode("utf-8", "surrogatepass")
        sock.settimeout(timeout)
        sock.sendall(len(body).to_bytes(4, "big") + body)
        try:
            answer = recv_body(sock)
            return decode(answer.decode("utf-8", "surrogatepass"))
        except (OSError, ValueError) as exc:  # ProtocolError and UnicodeError are ValueErrors
            raise Unanswered(str(exc)) from None
    finally:
        sock.close()


class Unanswered(Exception):
    """The daemon took the request and stopped before answering it."""


def served(argv: list[str]) -> tuple[dict[str, str | bool], list[str], bool] | None:
    """(global options, command and arguments, whether it is ``hooks run``) when a daemon
    runs ``stashpoint ARGV``; None for every other command line. The daemon checks requests
    with this too: it runs these commands and nothing else."""
    parsed = _globals(argv)
    if parsed is None:
        return None
    opts, rest = parsed
    command = rest[0]
    hook = command == "hooks" and rest[1:2] == ["run"]
    if not hook and command not in _SERVED:
        return None
    if any(a in _REFUSED or a.startswith(_REFUSED_PREFIX) for a in rest[1:]):
        return None
    return opts, rest, hook


def run_if_served(argv: list[str]) -> int | None:
    """Run ``stashpoint ARGV`` through the workspace's daemon and return its exit code; None
    when it must run in this process instead (then nothing was printed)."""
    env = environ()
    if env.get("STASHPOINT_NO_DAEMON") or env.get("STASHPOINT_MIRROR"):
        return None
    parsed = served(argv)
    if parsed is None:
        return None
    opts, rest, hook = parsed
    stdin: str | None = None
    start = str(opts.get("-C") or ".")
    if hook:
        agent = rest[2] if len(rest) > 2 else ""
        words = rest[3:]
        if agent != "aider" and not (words and words[-1].lstrip().startswith("{")):
            stdin = read_stdin()
        if "-C" not in opts:
            start = _hook_start(agent, words, stdin)
    try:
        store = opts.get("--store") or env.get("STASHPOINT_STORE")
        found = find_store(start, str(store) if store else None)
        path = socket_path(*found) if found is not None else None
        if path is None or not _exists(path):
            raise FileNotFoundError(path)
        message: dict[str, object] = {
            "v": 1,
            "op": "run",
            "argv": argv,
            "cwd": os.getcwd(),
            "env": {k: env[k] for k in PASS_ENV if k in env},
            "match": env_to_match(env),
            "stdin": stdin,
            "tty": sys.stdout.isatty(),
            "version": __version__,
        }
        answer = request(path, message, None)
    except Unanswered as exc:
        if hook:  # a hook never fails the agent; at worst it records the snapshot twice
            answer = {}
        else:  # it may have run: running it again could rewind twice
            sys.stderr.write(
                f"error: the watch daemon stopped while running the command ({exc}); see "
                "`stashpoint log` for what it did, and `stashpoint watch status`\n"
            )
            return 1
    except Exception:  # no daemon there (a stale socket), or anything odd: nothing was sent
        answer = {}
    code = answer.get("code")
    if not isinstance(code, int) or "fallback" in answer:
        if stdin is not None:
            _put_back_stdin(stdin)
        return None
    for stream, key in ((sys.stdout, "out"), (sys.stderr, "err")):
        text = answer.get(key)
        if isinstance(text, str) and text:
            stream.flush()
            stream.buffer.write(text.encode("utf-8", "surrogateescape"))
            stream.buffer.flush()
    return code
