"""Store URLs, parsed once.

A store is named by a plain path (a SQLite store in that directory) or a URL
``scheme://rest?options``. stashpoint takes its own options (``blobs=``, ``durability=``)
out of the query here; what is left is the *target*, the URL the backend is opened with
(a server backend reads its own options from it, e.g. ``redis://host/0?prefix=sp:``).
Every place that must know what kind of store a URL names (a local directory, a server,
where its files are) asks the parsed form instead of looking at the text again.

Only the standard library: the CLI imports this at start-up.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, unquote_plus, urlsplit

from .errors import UsageError

__all__ = ["DB_NAME", "DEFAULT_DIR", "OPTIONS", "StoreURL", "parse_store_url", "sqlite_layout"]

DEFAULT_DIR = ".stashpoint"
"""The store of a plain ``stashpoint`` command or ``open_store()``: in the current directory."""

DB_NAME = "store.db"
"""The SQLite database inside a store directory."""

OPTIONS = ("blobs", "durability")
"""Query options stashpoint reads itself, whatever the backend."""

_ON_DISK = frozenset({"sqlite", "file"})
_SERVERLESS = _ON_DISK | {"memory"}
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


class StoreURL(NamedTuple):
    """A store URL taken apart. ``scheme`` is ``sqlite`` for a plain path."""

    given: str
    """The URL or path as written (``.stashpoint`` when none was)."""
    scheme: str
    explicit: bool
    """Whether the text named its scheme (``sqlite:///x``) rather than being a path."""
    rest: str
    """What follows ``scheme://`` (the whole text for a plain path), without the query."""
    query: str
    """The query left once stashpoint's own options are taken out ("" when none)."""
    blobs: str | None = None
    """``?blobs=`` (an external blob store, e.g. ``s3://bucket/prefix``)."""
    durability: str | None = None
    """``?durability=`` (see :mod:`stashpoint.durability`)."""

    @property
    def target(self) -> str:
        """The URL the backend is opened with: as written, minus stashpoint's own options."""
        head = f"{self.scheme}://{self.rest}" if self.explicit else self.rest
        return f"{head}?{self.query}" if self.query else head

    @property
    def server(self) -> bool:
        """Whether the store lives in a server (PostgreSQL, Redis, a third-party backend),
        not in this process or on this machine's disk."""
        return self.scheme not in _SERVERLESS

    @property
    def path(self) -> Path | None:
        """The path on this machine's disk the URL names (SQLite, file://), else None."""
        if self.scheme not in _ON_DISK:
            return None
        text = self.rest or (DEFAULT_DIR if self.scheme == "sqlite" else "")
        return Path(text).expanduser() if text else None

    @property
    def home(self) -> Path | None:
        """The store directory the URL names on this machine's disk (where its locks and
        logs are), found without opening the store; None for a server or memory."""
        path = self.path
        if path is None or self.scheme == "file":
            return path
        return sqlite_layout(path)[1]

    def absolute(self) -> str:
        """The same URL with a relative local path made absolute (a relative path means
        nothing to a command run from elsewhere); a store directory's ``store.db`` URL
        becomes the directory."""
        if self.path is None:
            return self.given
        local = self.rest or DEFAULT_DIR
        whole = self.explicit and self.scheme == "sqlite" and "?" not in self.given
        if whole and local.startswith("/") and local.endswith("/" + DB_NAME):
            return local[: -len("/" + DB_NAME)]
        if os.path.isabs(local):
            return self.given
        prefix = f"{self.scheme}://" if self.explicit else ""
        options = self.given[len(prefix) + len(self.rest) :]  # the query, as written
        return prefix + os.path.abspath(os.path.expanduser(local)) + options


def parse_store_url(
    url: str | os.PathLike[str] | None,
    *,
    blobs: str | None = None,
    durability: str | None = None,
) -> StoreURL:
    """Parse ``url`` (default ``.stashpoint``). ``blobs`` and ``durability`` given as
    arguments are merged with the URL's options; two different values are refused."""
    given = os.fspath(url) if url is not None else DEFAULT_DIR
    base, _, query = given.partition("?")
    found: dict[str, str] = {}
    keep = []
    for part in query.split("&") if query else ():
        name, eq, value = part.partition("=")
        if eq and name in OPTIONS:
            found[name] = unquote(value)
        else:
            keep.append(part)
    for name, arg in (("blobs", blobs), ("durability", durability)):
        if arg is not None and name in found and found[name] != arg:
            raise UsageError(f"two values for {name} given: {found[name]!r} in the URL and {arg!r}")
    scheme, sep, rest = base.partition("://")
    if not sep:
        scheme, rest = "sqlite", base
    return StoreURL(
        given=given,
        scheme=scheme,
        explicit=bool(sep),
        rest=rest,
        query="&".join(keep),
        blobs=blobs if blobs is not None else found.get("blobs"),
        durability=durability if durability is not None else found.get("durability"),
    )


def sqlite_layout(path: Path) -> tuple[Path, Path]:
    """``(database, store directory)`` of a SQLite store named by ``path``: a directory
    (its ``store.db``), a ``*.db`` file (beside its ``*.db.d`` directory), or the
    ``store.db`` of a store directory (the URL a store reports for itself: the same store,
    so the same blob directory and locks; a GC opened this way once saw another blob
    directory, thought itself alone, and freed blobs a writer was about to use)."""
    if path.name == DB_NAME and not (path.parent / (DB_NAME + ".d")).exists():
        return path, path.parent
    if path.suffix in _SQLITE_SUFFIXES:
        return path, path.parent / (path.name + ".d")
    return path / DB_NAME, path


_SECRET_PARAM = re.compile(r"password|secret|token", re.IGNORECASE)
_MASK = "***"


def printable_url(url: str) -> str:
    """A URL fit to print: the password of its userinfo (also ``redis://:PW@``) and every
    query parameter whose name says it is a secret (``?password=``, ``sslpassword``,
    ``token`` ...) replaced by ``***``; everything else as given."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (a bad IPv6 host ...): mask what looks like userinfo
        return re.sub(r"//([^/@]*):[^@/]*@", rf"//\1:{_MASK}@", url)
    out = url
    if "@" in parts.netloc:
        userinfo, _, host = parts.netloc.rpartition("@")
        if ":" in userinfo:
            masked = f"{userinfo.split(':', 1)[0]}:{_MASK}@{host}"
            out = out.replace(f"//{parts.netloc}", f"//{masked}", 1)
    if parts.query:
        pairs = []
        for pair in parts.query.split("&"):  # by hand: the rest keeps its own encoding
            name, eq, _value = pair.partition("=")
            pairs.append(
                f"{name}={_MASK}" if eq and _SECRET_PARAM.search(unquote_plus(name)) else pair
            )
        head, _, tail = out.partition("?")  # rebuilt in place: urlunsplit drops "sqlite://"
        rest = tail[len(parts.query) :]  # a fragment, if any
        out = f"{head}?{'&'.join(pairs)}{rest}"
    return out
