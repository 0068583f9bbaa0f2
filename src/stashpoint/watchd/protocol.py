"""The watch daemon's wire format and where its socket lives.

A message is a 4-byte big-endian length, then that many bytes of UTF-8 JSON: an object.
JSON, never pickle: a request is data the daemon checks field by field. The client encodes
and decodes with the standard library's C accelerator (``_json``) and no more: importing
``json`` (which imports ``re``), ``socket`` (``enum``), ``hashlib`` (OpenSSL) or msgspec
would each cost a served command more than the daemon's whole answer. The daemon side uses
:mod:`json` (:func:`send_message`, :func:`recv_message`); both read any JSON the other writes.

The socket of the daemon of workspace ``root`` over store ``url`` is in the store's
directory (a local store): ``watch.sock`` when the workspace is the directory holding the
store, else ``watch-<digest of root>.sock``. A store on a server, or a path too long for a
socket address, gets ``/tmp/stashpoint-<uid>/<digest>.sock`` (a 0700 directory of this
user). Never in the workspace.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

__all__ = [
    "MATCH_ENV",
    "MAX_MESSAGE",
    "PASS_ENV",
    "ProtocolError",
    "decode",
    "encode",
    "env_to_match",
    "recv_message",
    "runtime_dir",
    "send_message",
    "socket_path",
    "store_key",
]

VERSION = 1
MAX_MESSAGE = 64 << 20
"""The largest message either side accepts (a request's stdin, a long ``log``)."""
_SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes; keep a margin

PASS_ENV = (
    "STASHPOINT_STORE",
    "STASHPOINT_SESSION",
    "STASHPOINT_HOOK_TIMEOUT",
    "CLAUDE_PROJECT_DIR",
    "COLUMNS",
    "NO_COLOR",
)
"""Variables a request carries and the daemon applies while it serves it."""
MATCH_ENV = "HOME"
"""With every other ``STASHPOINT_*`` variable (keys, durability, mirror...): these decide how
the store is opened, so a request is served only when they are what the daemon started with
(:func:`env_to_match`); else the client runs the command itself."""


class ProtocolError(ValueError):
    """A message that is not one: a bad length, not JSON, not an object."""


IGNORED_ENV = ("STASHPOINT_NO_DAEMON", "STASHPOINT_WATCH")
"""Variables about the daemon itself: they do not change what a command does."""


def env_to_match(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith("STASHPOINT_") and k not in PASS_ENV and k not in IGNORED_ENV)
        or k == MATCH_ENV
    }


def store_key(url: str) -> str:
    """The store URL as both sides compare it: a local path made absolute."""
    if "://" in url or "?" in url:
        return url
    return os.path.abspath(url)


def _digest(data: bytes) -> str:
    try:
        from _blake2 import blake2b  # the builtin module: hashlib would load OpenSSL (~5 ms)
    except ImportError:  # pragma: no cover - an interpreter without it
        from hashlib import blake2b
    return blake2b(data, digest_size=12).hexdigest()


def runtime_dir(*, create: bool) -> str | None:
    """``/tmp/stashpoint-<uid>`` (made 0700 with ``create``); None unless it is a directory
    of this user's that nobody else may write to (one someone else planted is never used)."""
    path = f"/tmp/stashpoint-{os.getuid()}"
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def socket_path(url: str, root: str, *, create: bool = False) -> str | None:
    """Where the daemon of ``root`` (a resolved directory) over store ``url`` listens."""
    url = store_key(url)
    if "://" not in url and "?" not in url and os.path.isdir(url):
        if os.path.dirname(url) == root:
            path = os.path.join(url, "watch.sock")
        else:
            path = os.path.join(url, f"watch-{_digest(os.fsencode(root))}.sock")
        if len(os.fsencode(path)) <= _SUN_PATH_MAX:
            return path
    base = runtime_dir(create=create)
    if base is None:
        return None
    return os.path.join(base, f"{_digest(os.fsencode(url) + b'/' + os.fsencode(root))}.sock")


# -- the client's codec: the C accelerator only ----------------------------------------------


def encode(value: object) -> str:
    """JSON of strings, numbers, booleans, None, lists and string-keyed dicts."""
    from _json import encode_basestring_ascii as quote

    if isinstance(value, str):
        return str(quote(value))
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{quote(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot encode {type(value).__name__}")


_NUMBER = frozenset("0123456789-+.eE")


def decode(text: str) -> dict[str, object]:
    """A flat JSON object (string, number, boolean or null values), as the daemon answers;
    :class:`ProtocolError` for anything else."""
    from _json import scanstring

    out: dict[str, object] = {}
    n, i = len(text), 0

    def skip(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    def expect(i: int, ch: str) -> int:
        i = skip(i)
        if i >= n or text[i] != ch:
            raise ProtocolError(f"expected {ch!r} at {i}")
        return i + 1

    try:
        i = expect(0, "{")
        if skip(i) < n and text[skip(i)] == "}":
            return out
        while True:
            i = expect(i, '"')
            key, i = scanstring(text, i, True)
            i = skip(expect(i, ":"))
            value: object
            if text.startswith('"', i):
                value, i = scanstring(text, i + 1, True)
            elif text.startswith("true", i):
                value, i = True, i + 4
            elif text.startswith("false", i):
                value, i = False, i + 5
            elif text.startswith("null", i):
                value, i = None, i + 4
            else:
                j = i
                while j < n and text[j] in _NUMBER:
                    j += 1
                token = text[i:j]
                value = float(token) if any(c in token for c in ".eE") else int(token)
                i = j
            out[key] = value
            i = skip(i)
            if i < n and text[i] == ",":
                i += 1
                continue
            i = expect(i, "}")
            if skip(i) != n:
                raise ProtocolError("data after the object")
            return out
    except (ValueError, IndexError) as exc:
        raise ProtocolError(f"not a flat JSON object: {exc}") from None


# -- the daemon's side: the json module -------------------------------------------------------


def send_message(sock: socket.socket, data: dict[str, object]) -> None:
    import json

    body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(body)} bytes is over the limit")
    sock.sendall(len(body).to_bytes(4, "big") + body)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed in the middle of a message")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv_body(sock: socket.socket) -> bytes:
    size = int.from_bytes(recv_exact(sock, 4), "big")
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes is over the limit")
    return recv_exact(sock, size)


def recv_message(sock: socket.socket) -> dict[str, object]:
    """One message; :class:`ProtocolError` for anything that is not a JSON object within the
    size limit."""
    import json

    try:
        data = json.loads(recv_body(sock).decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"not JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("not a JSON object")
    return data
