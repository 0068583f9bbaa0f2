"""The CLI's shared machinery: global options, store discovery, output and exit codes.

Exit codes: 0 ok, 1 usage or user error, 2 integrity failure,
3 conflict or lease lost. The library is imported lazily inside commands so that
``stashpoint --help`` starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .._store import Store
    from ..session import Session

EXIT_OK, EXIT_USER, EXIT_INTEGRITY, EXIT_CONFLICT = 0, 1, 2, 3
STORE_DIR = ".stashpoint"


class Ctx:
    __slots__ = (
        "_located",
        "_store",
        "force",
        "json",
        "mirror_url",
        "session_name",
        "store_url",
        "workspace",
    )

    def __init__(
        self,
        store_url: str | None,
        session_name: str | None,
        json: bool,
        workspace: str | None,
        force: bool,
        mirror_url: str | None = None,
        _store: Any = None,
        _located: tuple[str, Path, str | None, str | None] | None = None,
    ) -> None:
        self.store_url = store_url
        self.session_name = session_name
        self.json = json
        self.workspace = workspace
        self.force = force
        self.mirror_url = mirror_url
        self._store = _store
        self._located = _located

    def __repr__(self) -> str:
        return (
            f"Ctx(store_url={self.store_url!r}, session_name={self.session_name!r}, "
            f"json={self.json!r}, workspace={self.workspace!r}, force={self.force!r}, "
            f"mirror_url={self.mirror_url!r}, _store={self._store!r}, "
            f"_located={self._located!r})"
        )

    def locate(self, *, create: bool = False) -> tuple[str, Path, str | None, str | None]:
        """(store url, workspace root, session from a link file, branch from a link file)."""
        if self._located is None:
            self._located = self._locate(create)
        return self._located

    def _locate(self, create: bool) -> tuple[str, Path, str | None, str | None]:
        if self.workspace is not None and not Path(self.workspace).is_dir():
            # A typo in -C must not create the directory (and a store in it).
            raise click.ClickException(f"-C {self.workspace}: no such directory")
        if self.store_url:
            if not create and missing_local_store(self.store_url):
                # Opening it would create an empty store, which `verify` would call healthy.
                raise click.ClickException(f"no stashpoint store at {self.store_url}")
            root = Path(self.workspace or ".").resolve()
            return self.store_url, root, None, None
        start = Path(self.workspace or ".").resolve()
        found = discover(start)
        if found is not None:
            return found
        if not create:
            raise click.ClickException(
                f"no stashpoint store in {start} or above; run `stashpoint init` (or "
                "`stashpoint snap`, which creates one), or pass --store URL" + self._here_hint()
            )
        from ..workspace import check_root

        # Refused before the store exists: a store left at / or in $HOME by a refused
        # command would be found by discovery from every directory below it.
        check_root(start, force=self.force)
        return str(start / STORE_DIR), start, None, None

    def _here_hint(self) -> str:
        """-C DIR moves the search for the store too: name the one found here, if any."""
        if self.workspace is None:
            return ""
        here = discover(Path.cwd())
        if here is None:
            return ""
        import shlex

        return (
            f" (-C looks for the store from {self.workspace}; to use the one found here: "
            f"stashpoint --store {shlex.quote(here[0])} -C {shlex.quote(self.workspace)} ...)"
        )

    def store(self, *, create: bool = False) -> Store:
        if self._store is None:
            from ..opening import open_store

            url, _root, _s, _b = self.locate(create=create)
            self._store = open_store(url, mirror=self.mirror_url or None)
            # Closed when the command ends: deferred commits are flushed, and a store that was
            # written to gets its periodic upkeep (retention, size budget).
            current = click.get_current_context(silent=True)
            if current is not None:
                current.call_on_close(self._store.close)
        return self._store  # type: ignore[no-any-return]

    def session(self, *, create: bool = False, files: bool = True) -> Session:
        _url, root, link_session, link_branch = self.locate(create=create)
        if files and create:
            from ..workspace import check_root

            check_root(root, force=self.force)  # before the store is created, not after
        store = self.store(create=create)
        name = self.session_name or link_session or "main"
        workspace: Path | None = root
        if not files:
            # Read-only commands still bind the workspace when it is a sane root, so that a
            # rewind a crash interrupted is completed by whatever command runs next.
            from ..errors import UsageError
            from ..workspace import check_root

            try:
                check_root(root, force=self.force)
            except UsageError:
                workspace = None
        branch = link_branch if (link_branch and name == link_session) else None
        if self.store_url and not self.workspace and workspace is not None:
            workspace = self._bound_root(store, name, branch, workspace)
        return store.session(
            name,
            workspace=workspace,
            branch=branch,
            force=self.force,
            bind=self.workspace is not None,  # -C DIR names the directory explicitly
        )

    @staticmethod
    def _bound_root(store: Store, name: str, branch: str | None, here: Path) -> Path:
        """With --store (or $STASHPOINT_STORE) no ``.stashpoint`` says where the workspace is:
        run inside the directory the branch is bound to, that directory is it, not the
        subdirectory the command runs in (a rewind from ``proj/src`` poured the project
        into ``src``). Only this store's own binding counts, never a root read from an
        imported bundle."""
        bound = store.session(name, branch=branch).bound_root()
        if bound is not None and Path(bound) in here.parents:
            return Path(bound)
        return here


pass_ctx = click.make_pass_decorator(Ctx)
"""Hands a command the :class:`Ctx` the ``stashpoint`` group made from the global options."""


def discover(start: Path) -> tuple[str, Path, str | None, str | None] | None:
    """Walk up from ``start`` to the nearest ``.stashpoint`` directory or link file.

    Stops at the home directory (unless starting there) and at filesystem boundaries, so a
    stray store high up never captures unrelated directories.
    """
    home = Path.home().resolve()
    here = start
    dev = _dev(start)
    while True:
        candidate = here / STORE_DIR
        if candidate.is_dir():
            return str(candidate), here, None, None
        if candidate.is_file():
            try:
                link = json.loads(candidate.read_text())
                found = str(link["store"]), here, link.get("session"), link.get("branch")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise click.ClickException(
                    f"{candidate} is not a valid stashpoint link file"
                ) from exc
            gone = local_path(found[0])
            if gone is not None and not gone.exists() and not gone.parent.is_dir():
                # The directory that held it is gone (a moved project): opening it would
                # create a new, empty store where the old one was.
                raise click.ClickException(
                    f"{candidate} links to the store {found[0]}, which no longer exists (was "
                    "the project it belongs to moved?); pass --store with its new place, or "
                    "put that place in the link file"
                )
            return found
        parent = here.parent
        if parent == here or here == home or _dev(parent) != dev:
            return None
        here = parent


def _dev(p: Path) -> int:
    try:
        return p.stat().st_dev
    except OSError:
        return -1


def emit(ctx: Ctx, data: Any, human: str | None = None) -> None:
    """Print ``data`` as JSON under --json, else the human text."""
    if ctx.json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    elif human is not None:
        click.echo(human)


def json_option(f: Any) -> Any:
    """Per-command ``--json`` (the global one works too: ``stashpoint --json log``)."""

    def callback(c: click.Context, _p: click.Parameter, value: bool) -> bool:
        if value:
            c.find_object(Ctx).json = True  # type: ignore[union-attr]
        return value

    return click.option(
        "--json",
        "json_out",
        is_flag=True,
        expose_value=False,
        callback=callback,
        help="Print machine-readable JSON.",
    )(f)


def printable(text: str) -> str:
    """Stored text (messages, values, labels, paths) safe to print on one line: control
    characters, escape sequences and newlines escaped, so what a tool or model wrote cannot
    drive the terminal or forge the lines around it. Every CLI print of stored text goes
    through here; the implementation lives with the diff rendering the web UI shares."""
    from ..statediff import printable as escape

    return escape(text)


def size_text(n: int) -> str:
    """A byte count as people read it: ``512 B``, ``1.5 KiB``, ``3.2 GiB``; shared by every
    command, so the same size always reads the same."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def short(ident: str | None) -> str:
    return ident[:12] if ident else "-"


def local_path(url: str) -> Path | None:
    """The path on this machine's disk that ``url`` names, or None for a server store."""
    from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

    return parse_store_url(url).path


def missing_local_store(url: str) -> bool:
    """Whether ``url`` names a store on this machine's disk that does not exist yet."""
    path = local_path(url)
    return path is not None and not path.exists()
