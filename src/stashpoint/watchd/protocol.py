"""The watch daemon's wire format and where its socket lives.

A message is a 4-byte big-endian length, then that many bytes of UTF-8 JSON: an object.
JSON, never pickle: a request is data the daemon checks field by field. The client encodes
and decodes in plain Python (:func:`encode`, :func:`decode`): importing ``json`` (which
imports ``re``), ``socket`` (``enum``), ``hashlib`` (OpenSSL) or msgspec would each cost a
served command more than the daemon's whole answer, and even loading the C accelerator
``_json`` costs more than the few short strings of a request and an answer. The daemon side uses
:mod:`json` (:func:`send_message`, :func:`recv_message`); both read any JSON the other writes.

The socket of the daemon of workspace ``root`` over store ``url`` is in the store's
directory (a local store): ``watch.sock`` when the workspace is the directory holding the
store, else ``watch-<digest of root>.sock``. A store on a server, or a path too long for a
socket address, gets ``/tmp/stashpoint-<uid>/<digest>.sock`` (a 0700 directory of this
user). Never in the workspace.

Paths are handled without :mod:`os` (:func:`realpath`, :func:`abspath`, :func:`join`...,
over ``posix``, the module ``os`` wraps): the site-less launcher's client would otherwise
load ``os`` (~1.3 ms of CPU, more than its own work). They follow :mod:`posixpath` exactly,
and both sides name sockets with them.
"""

import sys

try:
    import posix as _os
except ImportError:  # pragma: no cover - not POSIX (no daemon there): what os offers
    import os as _os  # type: ignore[no-redef]

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

__all__ = [
    "MATCH_ENV",
    "MAX_MESSAGE",
    "PASS_ENV",
    "ProtocolError",
    "decode",
    "encode",
    "env_to_match",
    "environ",
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


def env_to_match(env: "Mapping[str, str]") -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if (k.startswith("STASHPOINT_") and k not in PASS_ENV and k not in IGNORED_ENV)
        or k == MATCH_ENV
    }


# -- paths and the environment without os ------------------------------------------------------


def fsencode(name: str) -> bytes:
    return name.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def _fsdecode(name: "bytes | str") -> str:
    if isinstance(name, str):
        return name
    return name.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def environ() -> "Mapping[str, str]":
    """``os.environ`` where ``os`` is loaded (whenever ``site`` ran: it is then current),
    else the process's environment as ``os`` would decode it."""
    os_mod = sys.modules.get("os")
    if os_mod is not None:
        return os_mod.environ  # type: ignore[no-any-return]
    return {_fsdecode(k): _fsdecode(v) for k, v in _os.environ.items()}


def _is(path: str, kind: int) -> bool:
    try:
        return (_os.stat(path).st_mode & 0o170000) == kind
    except (OSError, ValueError):
        return False


def isdir(path: str) -> bool:
    return _is(path, 0o040000)


def isfile(path: str) -> bool:
    return _is(path, 0o100000)


def join(a: str, b: str) -> str:
    """``posixpath.join(a, b)``."""
    if b.startswith("/") or not a:
        return b if b.startswith("/") else a + b
    return a + b if a.endswith("/") else a + "/" + b


def dirname(path: str) -> str:
    """``posixpath.dirname``."""
    head = path[: path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


def normpath(path: str) -> str:
    """``posixpath.normpath`` (two leading slashes are kept, as POSIX allows)."""
    if not path:
        return "."
    initial = 2 if path.startswith("//") and not path.startswith("///") else 0
    if not initial and path.startswith("/"):
        initial = 1
    comps: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp != ".." or (not initial and not comps) or (comps and comps[-1] == ".."):
            comps.append(comp)
        elif comps:
            comps.pop()
    out = "/" * initial + "/".join(comps)
    return out or "."


def abspath(path: str) -> str:
    """``posixpath.abspath``."""
    return normpath(path if path.startswith("/") else join(_os.getcwd(), path))


def realpath(path: str) -> str:
    """``posixpath.realpath`` of a path that exists: every symbolic link resolved. OSError
    where a component is missing or links loop (where realpath would guess)."""
    if not path.startswith("/"):  # joined, not normalized: ".." applies after a link
        path = join(_os.getcwd(), path)
    todo = path.split("/")[::-1]
    out, links = "", 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            out = out[: out.rfind("/")]
            continue
        candidate = out + "/" + name
        if (_os.lstat(candidate).st_mode & 0o170000) != 0o120000:
            out = candidate
            continue
        links += 1
        if links > 40:
            raise OSError(40, "too many levels of symbolic links", candidate)
        target = _fsdecode(_os.readlink(candidate))
        if target.startswith("/"):
            out = ""
        todo.extend(target.split("/")[::-1])
    return out or "/"


def store_key(url: str) -> str:
    """The store URL as both sides compare it: a local path made absolute."""
    if "://" in url or "?" in url:
        return url
    return abspath(url)


_FNV_PRIME = 0x0000000001000000000000000000013B
_FNV_OFFSET = 0x6C62272E07BB014262B821756295C58D
_MASK = (1 << 128) - 1


def _digest(data: bytes) -> str:
    """24 hex digits naming a socket: 128-bit FNV-1a, in Python. Not a secure hash, and need
    not be: two workspaces whose names collide would share a socket name, and a daemon
    serves only its own store and scans through its watcher only its own root (anything
    else runs unwatched), so a collision costs speed, never correctness. Loading a hash
    module (``_blake2``, let alone ``hashlib``) would cost a served command more."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return f"{h >> 32:024x}"


def runtime_dir(*, create: bool) -> str | None:
    """``/tmp/stashpoint-<uid>`` (made 0700 with ``create``); None unless it is a directory
    of this user's that nobody else may write to (one someone else planted is never used)."""
    path = f"/tmp/stashpoint-{_os.getuid()}"
    if create:
        try:
            _os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        st = _os.lstat(path)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != _os.getuid() or st.st_mode & 0o077:
        return None
    return path


def socket_path(url: str, root: str, *, create: bool = False) -> str | None:
    """Where the daemon of ``root`` (a resolved directory) over store ``url`` listens."""
    url = store_key(url)
    if "://" not in url and "?" not in url and isdir(url):
        if dirname(url) == root:
            path = join(url, "watch.sock")
        else:
            path = join(url, f"watch-{_digest(fsencode(root))}.sock")
        if len(fsencode(path)) <= _SUN_PATH_MAX:
            return path
    base = runtime_dir(create=create)
    if base is None:
        return None
    return join(base, f"{_digest(fsencode(url) + b'/' + fsencode(root))}.sock")


# -- the client's codec: plain Python ---------------------------------------------------------

_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", 10: "\\n", 13: "\\r", 9: "\\t"})
_UNESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
_LONG = 1 << 16
"""An answer longer than this is decoded by ``_json``'s C scanner: loading it costs less than
unescaping a long ``log`` here."""


def _quote(text: str) -> str:
    """A JSON string; characters past ASCII (lone surrogates too) are left as they are, for
    the caller's ``surrogatepass`` UTF-8."""
    return '"' + text.translate(_ESCAPES) + '"'


def encode(value: object) -> str:
    """JSON of strings, numbers, booleans, None, lists and string-keyed dicts."""
    if isinstance(value, str):
        return _quote(value)
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
        return "{" + ",".join(f"{_quote(str(k))}:{encode(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot encode {type(value).__name__}")


def _code_unit(text: str, i: int) -> int:
    """The four hex digits of a ``\\u`` escape at ``text[i:i + 4]``."""
    digits = text[i : i + 4]
    if len(digits) != 4 or not _HEX.issuperset(digits):
        raise ValueError(f"bad \\u escape at {i}")
    return int(digits, 16)


def _scanstring(text: str, i: int) -> tuple[str, int]:
    """The JSON string whose opening quote is at ``i - 1``, and the index after its closing
    quote (what ``_json.scanstring`` returns)."""
    parts = []
    while True:
        end = text.find('"', i)
        if end < 0:
            raise ValueError("unterminated string")
        slash = text.find("\\", i, end)
        if slash < 0:
            parts.append(text[i:end])
            return "".join(parts), end + 1
        parts.append(text[i:slash])
        kind = text[slash + 1 : slash + 2]
        if kind != "u":
            parts.append(_UNESCAPES[kind])  # KeyError: not an escape
            i = slash + 2
            continue
        code, i = _code_unit(text, slash + 2), slash + 6
        if 0xD800 <= code < 0xDC00 and text.startswith("\\u", i):
            low = _code_unit(text, i + 2)
            if 0xDC00 <= low < 0xE000:
                code, i = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), i + 6
        parts.append(chr(code))


_NUMBER = frozenset("0123456789-+.eE")


def decode(text: str) -> dict[str, object]:
    """A flat JSON object (string, number, boolean or null values), as the daemon answers;
    :class:`ProtocolError` for anything else."""
    scanstring = _scanstring
    if len(text) > _LONG:
        from _json import scanstring as c_scanstring

        def scanstring(text: str, i: int) -> tuple[str, int]:
            return c_scanstring(text, i, True)

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
            key, i = scanstring(text, i)
            i = skip(expect(i, ":"))
            value: object
            if text.startswith('"', i):
                value, i = scanstring(text, i + 1)
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
    except (ValueError, IndexError, KeyError) as exc:
        raise ProtocolError(f"not a flat JSON object: {exc}") from None


# -- the daemon's side: the json module -------------------------------------------------------


def send_message(sock: "socket.socket", data: dict[str, object]) -> None:
    import json

    body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(body)} bytes is over the limit")
    sock.sendall(len(body).to_bytes(4, "big") + body)


def recv_exact(sock: "socket.socket", n: int) -> bytes:
    parts = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed in the middle of a message")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv_body(sock: "socket.socket") -> bytes:
    size = int.from_bytes(recv_exact(sock, 4), "big")
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes is over the limit")
    return recv_exact(sock, size)


def recv_message(sock: "socket.socket") -> dict[str, object]:
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
