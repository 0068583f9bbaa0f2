"""Where a restore may write: the one rule every restore goes through.

A branch is *bound* to the workspace directory its checkpoints were taken in (a branch made
by ``fork --into`` to that directory). A restore writes files only into the directory its
branch is bound to, unless the user names the target explicitly (``stashpoint -C DIR``,
``fork --into DIR``, ``Session(..., bind=True)``); the refusal names both directories and
the flag. Why: a checkpoint's files replace a whole tree, deleting what the checkpoint does
not hold, so a restore run from the wrong directory (an undo hint pasted elsewhere, a
``--store`` used from another project) deleted that directory's files.

Nothing read from a bundle chooses where to write: a bundle's recorded root is the
sender's, so imported branches are bound to no directory until the user names one, and
artifacts are written only under a directory the user names or, with explicit consent,
at the paths recorded with them, and never over the store's own files.

A new directory for a branch (``fork --into``, ``import --into``) lies outside every workspace
of the store and outside the store: inside a workspace, that workspace's snapshots would take
in the new branch's files and its rewinds delete them (unsaved work of the other branch).

The binding is kept in the store's metadata (``workspace:["session","branch"]``): written
by this machine's own checkpoints and restores, never by an import.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import NotFoundError, RestoreRefused
from .metakeys import WORKSPACE, workspace_key
from .urls import parse_store_url

if TYPE_CHECKING:
    from ._store import Store
    from .model import Checkpoint

__all__ = [
    "UNBOUND",
    "RestoreRefused",
    "artifact_destinations",
    "bind",
    "bound_to",
    "check_artifact_target",
    "check_fetch_target",
    "check_new_workspace",
    "check_workspace",
    "unbind",
    "undo_command",
    "usable",
    "workspaces_of",
]

UNBOUND = ""
"""The binding of a branch that came from a bundle: no directory until the user names one."""


_RELATIVE = "rel:"
"""A binding kept relative to the store's directory: the store lives inside the workspace
(``proj/.stashpoint``), so a project moved or copied with its store stays bound to itself."""


def bound_to(store: Store, session: str, branch: str) -> str | None:
    """The directory ``branch`` is bound to; ``UNBOUND`` (imported, no directory yet), or
    None when nothing was ever recorded (a new branch, or a store older than bindings)."""
    return _decoded(store, store.meta.get_meta(workspace_key(session, branch)))


def _decoded(store: Store, raw: str | None) -> str | None:
    if raw is not None and raw.startswith(_RELATIVE):
        if store.home is None:
            return UNBOUND
        return os.path.normpath(store.home / raw[len(_RELATIVE) :])
    return raw


def bind(store: Store, session: str, branch: str, root: Path) -> None:
    home = store.home
    if home is not None and (home.parent == root or root in home.parents):
        value = _RELATIVE + os.path.relpath(root, home)
    else:
        value = str(root)
    store.meta.set_meta(workspace_key(session, branch), value)


def unbind(store: Store, session: str, branch: str) -> None:
    """Mark an imported branch as bound to no directory."""
    store.meta.set_meta(workspace_key(session, branch), UNBOUND)


def usable(bound: str | None) -> bool:
    """Whether a binding still names a directory: not unbound, not one that was removed
    or moved away (a branch whose directory is gone is bound again where it is used)."""
    return bool(bound) and Path(str(bound)).is_dir()


def check_workspace(
    session: str,
    branch: str,
    root: Path,
    bound: str | None,
    *,
    source: tuple[str, str, str | None] | None = None,
) -> None:
    """Refuse a restore of ``session``'s ``branch`` into ``root`` unless it is the directory
    the branch is bound to (``bound``); a restore into a directory the user named
    explicitly is not checked here at all.

    ``source`` is (checkpoint id, its branch, that branch's binding) when the checkpoint
    restored lies on another branch: its files are another directory's (an A/B fork's, an
    imported run's), so pouring them over this one also needs the directory named."""
    how = (
        f"to restore into {root} anyway, name it explicitly: stashpoint -C {_quote(root)} ... "
        "(Python: bind=True), or use fork --into DIR for a new directory"
    )
    if bound and Path(bound) == root:
        if source is None or (source[2] and Path(source[2]) == root):
            return
        ident, other, where = source
        raise RestoreRefused(
            f"refusing to restore checkpoint {ident} into {root}: it was taken on branch "
            f"{other!r}, "
            + (f"in {where}" if where else "which is bound to no directory here")
            + f"; {how}"
        )
    if not bound:
        raise RestoreRefused(
            f"refusing to restore session {session!r} branch {branch!r} into {root}: the "
            f"branch is bound to no directory here (it was imported or never snapshotted "
            f"here); {how}"
        )
    raise RestoreRefused(
        f"refusing to restore session {session!r} branch {branch!r} into {root}: its "
        f"workspace is {bound}, where its checkpoints were taken. Run the command there "
        f"(cd {_quote(Path(bound))}, or stashpoint -C {_quote(Path(bound))} ...), or {how}"
    )


def workspaces_of(store: Store) -> list[Path]:
    """Every directory a branch of ``store`` (any session) is bound to and that still
    exists: the directories whose snapshots and rewinds this store makes. (Not the directory
    holding the store: ``./.stashpoint`` beside ``repo/`` and ``repo-b/`` is a layout.)"""
    found = [_decoded(store, raw) for _key, raw in store.meta.iter_meta(WORKSPACE)]
    return [Path(str(p)) for p in found if usable(p)]


def check_new_workspace(dest: Path, *, own: Iterable[Path], workspaces: Iterable[Path]) -> None:
    """Refuse to make ``dest`` (absolute) a branch's new directory (``fork --into``,
    ``import --into``) when it is, holds or lies inside the store (``own``) or a workspace
    (``workspaces``): nested in a workspace, the new branch's files would be snapshotted by
    that workspace's branch and deleted by its next rewind; holding one, the reverse. Checked
    before anything is written, so a refused command creates nothing."""
    dest = Path(os.path.normpath(dest))
    for path in own:
        path = path.resolve()
        if dest == path or path in dest.parents or dest in path.parents:
            raise RestoreRefused(
                f"refusing to write into {dest}: it holds or is inside the store {path}"
            )
    for ws in dict.fromkeys(Path(os.path.realpath(w)) for w in workspaces):
        if ws in dest.parents:
            where, hint = "inside the workspace", f", such as {_quote(ws.parent / dest.name)}"
        elif dest == ws:
            where, hint = "the workspace", ""
        elif dest in ws.parents:
            where, hint = "a parent of the workspace", ""
        else:
            continue
        raise RestoreRefused(
            f"refusing to write into {dest}: it is {where} {ws}, whose snapshots would take "
            "in the new branch's files and whose rewinds would delete them; choose a "
            f"directory outside it{hint}"
        )


def artifact_plan(
    target: Checkpoint,
    spec: bool | Mapping[str, str | os.PathLike[str] | None],
    *,
    to_dir: str | os.PathLike[str] | None,
    recorded_ok: bool,
    protected: Iterable[Path],
) -> dict[str, Path]:
    """Name -> where a rewind writes each of the target's artifacts (``spec``: True for all of
    them, or name -> a path or None), checked against the rule above."""
    from .artifacts import restore_target as artifact_path

    wanted = dict.fromkeys(target.artifacts) if spec is True else dict(spec or {})
    missing = [n for n in wanted if n not in target.artifacts]
    if missing:
        raise NotFoundError(f"checkpoint {target.id} has no artifact named {missing[0]!r}")
    dests = artifact_destinations(
        wanted,
        {n: target.artifacts[n].path for n in wanted},
        to_dir=to_dir,
        recorded_ok=recorded_ok,
    )
    protected = list(protected)
    return {
        n: check_artifact_target(n, artifact_path(target.artifacts[n], dest, n), protected)
        for n, dest in dests.items()
    }


def artifact_destinations(
    wanted: Mapping[str, str | os.PathLike[str] | None],
    recorded: Mapping[str, str],
    *,
    to_dir: str | os.PathLike[str] | None,
    recorded_ok: bool,
) -> dict[str, str | os.PathLike[str] | None]:
    """Where each artifact of a restore goes: the path the user gave it in ``wanted``; else
    under ``to_dir`` (the layout below the artifacts' common directory kept); else, only
    with ``recorded_ok``, None: the path it was attached from (``recorded``, read from the
    checkpoint and so possibly from a bundle), which the caller checks as such."""
    implicit = {n: recorded[n] for n, p in wanted.items() if p is None}
    out: dict[str, str | os.PathLike[str] | None] = {
        n: p for n, p in wanted.items() if p is not None
    }
    if not implicit:
        return out
    if to_dir is None:
        if not recorded_ok:
            listed = "; ".join(f"{n} -> {p}" for n, p in sorted(implicit.items()))
            raise RestoreRefused(
                f"artifacts are restored only where you say: {listed}. Pass --artifacts-to "
                "DIR (Python: artifacts_to=DIR) to write them under DIR, or "
                "--artifacts-to-recorded-paths (Python: recorded_paths=True) to write them "
                "at the paths listed"
            )
        return {**out, **dict.fromkeys(implicit)}
    base = Path(to_dir).resolve()
    flat = {n: Path(os.path.normpath(p)) for n, p in implicit.items()}
    absolute = [p.parent for p in flat.values() if p.is_absolute()]
    common = Path(os.path.commonpath(absolute)) if absolute else None
    for name, p in flat.items():
        rel = p.relative_to(common) if common is not None and p.is_absolute() else p.name
        dest = base / rel
        if base not in dest.parents:  # a name like '..' from a hostile record
            raise RestoreRefused(f"artifact {name!r} records no usable file name: {p}")
        out[name] = dest
    return out


def check_artifact_target(name: str, target: Path, protected: Iterable[Path]) -> Path:
    """Refuse to write an artifact over the store's own files (its directory, database and
    side files): restoring over ``store.db`` destroyed the store and the undo with it."""
    where = target.parent.resolve() / target.name
    for own in protected:
        own = own.resolve()
        if where == own or own in where.parents:
            raise RestoreRefused(
                f"refusing to restore artifact {name!r} to {where}: that is the store's own file"
            )
    return where


def check_fetch_target(name: str, target: Path, *, overwrite: bool) -> None:
    """Refuse to fetch an artifact (``show --artifact NAME -o DIR``) over anything but a new
    path, or with ``overwrite`` a regular file. The file name under DIR comes from the
    checkpoint (from a bundle, possibly): ``-o ~`` replaced ``~/.bashrc`` silently, where
    ``export -o`` needs ``--overwrite``. A symlink, directory or device there is never
    replaced or followed, ``overwrite`` or not."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
        raise RestoreRefused(
            f"refusing to write artifact {name!r} to {target}: it exists and is {kind}; "
            "choose another name (-o FILE)"
        )
    if not overwrite:
        raise RestoreRefused(
            f"refusing to replace {target} with artifact {name!r}: it exists; choose another "
            "name (-o FILE) or pass --overwrite (Python: overwrite=True)"
        )


def undo_command(
    store_url: str,
    session: str,
    root: Path | None,
    ident: str,
    *,
    files: bool = True,
    state: bool = True,
    artifacts: Iterable[str] = (),
) -> str:
    """The command that rewinds to ``ident`` from any directory: it names the store (its
    path made absolute), the session and the workspace, so pasting it elsewhere cannot
    restore another directory. ``artifacts``: names whose files the safety checkpoint
    captured at the paths the rewind wrote, put back there."""
    import shlex

    parts = ["stashpoint", "--store", shlex.quote(_absolute_url(store_url))]
    if session != "main":
        parts += ["--session", shlex.quote(session)]
    if root is not None:
        parts += ["-C", _quote(root)]
    parts += ["rewind", shlex.quote(ident)]
    if not state:
        parts.append("--files-only")
    elif not files:
        parts.append("--state-only")
    names = sorted(artifacts)
    for name in names:
        parts += ["--artifact", shlex.quote(name)]
    if names:
        parts.append("--artifacts-to-recorded-paths")
    return " ".join(parts)


def _absolute_url(url: str) -> str:
    """A store URL whose local path is absolute (a relative path means nothing when the
    command is run from elsewhere)."""
    return parse_store_url(url).absolute()


def _quote(path: Path) -> str:
    import shlex

    return shlex.quote(str(path))
