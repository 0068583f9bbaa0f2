"""Which backend opens a store URL: a registry from URL scheme to opener.

``open_store`` parses the URL once (:mod:`stashpoint.urls`), looks its scheme up here and
calls the opener with the parsed form; the external blob store (``blobs=``), encryption and
durability are then handled the same way for every backend. A backend's module is imported
only when a URL of its scheme is opened, so naming a backend costs nothing at start-up.

A third-party backend registers its scheme in one of two ways::

    # in code, before opening (a "module:function" string is imported on first use)
    from stashpoint.stores.registry import register_backend
    register_backend("mydb", "mypkg.stashpoint_backend:open_mydb")

    # or in its package metadata, found without importing anything until used
    [project.entry-points."stashpoint.backends"]
    mydb = "mypkg.stashpoint_backend:open_mydb"

The opener takes a :class:`~stashpoint.urls.StoreURL` and returns :class:`Opened` (the
:class:`~stashpoint.stores.base.MetadataStore` and, for a store on local disk, its directory).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .._fsutil import mkdir_private, sweep_temp_files
from ..errors import StoreError, UsageError
from ..urls import DB_NAME, DEFAULT_DIR, StoreURL, sqlite_layout

if TYPE_CHECKING:
    from .base import MetadataStore

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "Opened",
    "Opener",
    "get_backend",
    "known_schemes",
    "register_backend",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "stashpoint.backends"


class Opened(NamedTuple):
    """What an opener hands back: the backend and, for a store with a local directory,
    where its blobs, locks and caches go."""

    meta: MetadataStore
    home: Path | None = None
    """The store directory (absolute), if the store has one on this machine."""
    blob_dir: Path | None = None
    """Local blob directory (None: blobs live in the backend itself or in ``blobs=``)."""
    own_paths: tuple[Path, ...] = ()
    """Files of the store outside ``home`` (never part of a workspace snapshot)."""


Opener = Callable[[StoreURL], Opened]


class Backend(NamedTuple):
    """A registered scheme: its opener and what it accepts."""

    opener: Opener | str
    """The opener, or ``"module:function"`` naming it (imported on first use)."""
    blobs: bool | str = True
    """True when the store may keep large blobs in an external blob store (``blobs=``);
    otherwise the reason it may not, shown to whoever asks for one."""
    label: str | None = None
    """How the scheme is named in messages (None: ``scheme://``; "": an alias, not named)."""

    def open(self, url: StoreURL) -> Opened:
        opener = self.opener
        if isinstance(opener, str):
            module, _, attr = opener.partition(":")
            opener = getattr(importlib.import_module(module), attr)
        result = opener(url)
        if not isinstance(result, Opened):
            raise TypeError(f"the opener for {url.scheme}:// returned {result!r}, not Opened")
        return result


_NO_BLOBS_REDIS = (
    "a Redis store keeps every blob in Redis: its garbage collection cannot delete "
    "S3 objects atomically with their marks; use SQLite or PostgreSQL with S3 blobs"
)
_HERE = __name__
_REGISTRY: dict[str, Backend] = {
    "sqlite": Backend(f"{_HERE}:open_sqlite", label="sqlite:// (default, or a plain path)"),
    "file": Backend(f"{_HERE}:open_file", "a file:// store keeps its blobs in its own directory"),
    "memory": Backend(f"{_HERE}:open_memory"),
    "postgresql": Backend(f"{_HERE}:open_postgres", label="postgresql:// (or postgres://)"),
    "postgres": Backend(f"{_HERE}:open_postgres", label=""),
    "redis": Backend(f"{_HERE}:open_redis", _NO_BLOBS_REDIS, "redis:// (rediss://, unix://)"),
    "rediss": Backend(f"{_HERE}:open_redis", _NO_BLOBS_REDIS, ""),
    "unix": Backend(f"{_HERE}:open_redis", _NO_BLOBS_REDIS, ""),
}


def register_backend(
    scheme: str, opener: Opener | str, *, blobs: bool | str = True, replace: bool = False
) -> None:
    """Open URLs ``scheme://…`` with ``opener`` (see the module docstring). A scheme already
    registered is refused unless ``replace``."""
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise UsageError(f"not a URL scheme: {scheme!r}")
    if scheme in _REGISTRY and not replace:
        raise UsageError(f"store URL scheme {scheme!r} is already registered")
    _REGISTRY[scheme] = Backend(opener, blobs)


def unregister_backend(scheme: str) -> None:
    """Forget a scheme registered with :func:`register_backend` (tests, plugins unloading)."""
    _REGISTRY.pop(scheme, None)


def get_backend(scheme: str) -> Backend:
    """The backend for ``scheme``: registered, else declared by an installed package's
    ``stashpoint.backends`` entry point; an unknown scheme is a usage error naming the
    known ones."""
    backend = _REGISTRY.get(scheme)
    if backend is not None:
        return backend
    found = _entry_points().get(scheme)
    if found is not None:
        backend = Backend(found)
        _REGISTRY.setdefault(scheme, backend)
        return backend
    raise UsageError(f"unsupported store URL scheme {scheme!r}: this build knows " + _known_text())


def known_schemes() -> list[str]:
    """Every scheme a store URL may have here: registered and installed."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def _known_text() -> str:
    names = [b.label or f"{s}://" for s, b in _REGISTRY.items() if b.label != ""]
    names += [f"{s}://" for s in sorted(_entry_points()) if s not in _REGISTRY]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _entry_points() -> dict[str, str]:
    """``scheme -> "module:function"`` of installed packages' backends (read, not imported)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


# -- the built-in backends -------------------------------------------------------------------


def open_sqlite(url: StoreURL) -> Opened:
    """A plain path or ``sqlite:///path``: a directory (its ``store.db``) or a ``*.db`` file."""
    _no_query(url)
    path = url.path or Path(DEFAULT_DIR)
    db, home = sqlite_layout(path)
    if not db.exists() and (home / _FILE_STORE_MARK).is_file():
        where = Path(os.path.abspath(home))
        raise UsageError(
            f"{where} holds a file:// store, not a SQLite store; open it as file://{where}"
        )
    _refuse_foreign_directory(home, db)
    try:
        mkdir_private(home)  # and any parent it creates: 0700 too
        ignore_store_dir(home)
        # Cheap places only; `verify` sweeps the whole blob directory.
        sweep_temp_files(home, recursive=False)
        sweep_temp_files(home / "cache", recursive=False)
        sweep_temp_files(home / "blobs" / "packs", recursive=False)
    except OSError as exc:
        raise StoreError(f"cannot open store directory {home}: {exc.strerror}") from exc
    from .sqlite import SqliteStore

    own: tuple[Path, ...] = ()
    if db.parent != home:  # agent.db beside agent.db.d/: the database and its side files too
        resolved = db.resolve()
        sides = ("", "-wal", "-shm", "-journal", "-writers")
        own = tuple(resolved.with_name(resolved.name + side) for side in sides)
    return Opened(SqliteStore(db), home.resolve(), home / "blobs", own)


def open_file(url: StoreURL) -> Opened:
    """``file:///dir``: readable JSON documents (see :mod:`stashpoint.stores.files`)."""
    _no_query(url)
    if url.path is None:
        raise UsageError("file:// needs a directory, e.g. file:///home/me/checkpoints")
    from .files import FileStore

    home = url.path
    if (home / DB_NAME).exists():
        where = Path(os.path.abspath(home))
        raise UsageError(
            f"{where} holds a SQLite store, not a file:// store; open it as sqlite://{where} "
            f"or by its path ({where})"
        )
    meta = FileStore(home)  # creates the directory
    try:
        ignore_store_dir(home)
        sweep_temp_files(home / "cache", recursive=False)
        sweep_temp_files(home / "blobs" / "packs", recursive=False)
    except OSError as exc:
        meta.close()
        raise StoreError(f"cannot open store directory {home}: {exc.strerror}") from exc
    return Opened(meta, home.resolve(), home / "blobs")


def open_memory(url: StoreURL) -> Opened:
    """``memory://``: this process only, gone when it ends (tests, trials)."""
    from .memory import MemoryStore

    return Opened(MemoryStore())


def open_postgres(url: StoreURL) -> Opened:
    """``postgresql://user@host/db``: blobs in the database (or ``blobs=``), shared by all."""
    from .postgres import PostgresStore

    return Opened(PostgresStore(url.target))


def open_redis(url: StoreURL) -> Opened:
    """``redis://host:6379/0?prefix=sp:`` (also ``rediss://``, ``unix://``)."""
    from .redis import RedisStore

    return Opened(RedisStore(url.target))


_FILE_STORE_MARK = "meta.json"
"""What a file:// store's directory holds and a SQLite store's does not. Each kind is refused
the other's directory before anything is made there: the two layouts fit in one directory
side by side (a file store made inside a SQLite store reported its branches empty), and
share its blobs/, where each one's GC would free the blobs only the other uses."""


def _no_query(url: StoreURL) -> None:
    if url.query:
        raise UsageError(
            f"a {url.scheme}:// store takes no option {url.query!r}: its options are "
            "blobs= and durability="
        )


_STORE_ENTRIES = frozenset(
    {".gitignore", "blobs", "cache", "hooks.log", "locks", "notify.log", "tmp"}
)


def _refuse_foreign_directory(home: Path, db: Path) -> None:
    """A new store needs a directory of its own: ``--store ../proj`` (a project, not its
    ``.stashpoint``) put the store's files among the project's, where the store hid every
    file of it from its own snapshots and its ``.gitignore`` hid them from git."""
    if db.exists() or not home.is_dir():
        return
    try:
        foreign = sorted(
            p.name
            for p in home.iterdir()
            if p.name not in _STORE_ENTRIES and not p.name.startswith(db.name)
        )
    except OSError:
        return
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise UsageError(
            f"{home} holds other files ({shown}) and no stashpoint store: a store needs a "
            f"directory of its own, e.g. {home / '.stashpoint'}"
        )


def ignore_store_dir(home: Path) -> None:
    """A ``.gitignore`` of ``*`` in the store directory (as virtualenv does), so git,
    ripgrep and editors skip it: in a git work tree ``git add -A`` committed the store."""
    marker = home / ".gitignore"
    if marker.exists():
        return
    with contextlib.suppress(OSError):  # a read-only or full disk: opening still works
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # private, as all
        with os.fdopen(fd, "w") as f:
            f.write("# created by stashpoint: its store is never committed\n*\n")
