"""Portable bundles: ``export`` a session or one checkpoint to a file, ``import`` it elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ._app import STORE_DIR, Ctx, emit, json_option, pass_ctx, short, size_text
from ._progress import ByteProgress

if TYPE_CHECKING:
    from .._store import Store
    from ..bundle import Bundle

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


@click.command("export")
@click.argument("ref", required=False)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle file to write."
)
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@json_option
@pass_ctx
def export_cmd(ctx: Ctx, ref: str | None, output: str, overwrite: bool) -> None:
    """Write the session (or the checkpoint REF with its ancestors) to one bundle file.

    The bundle carries the checkpoint records, their conversation and journal logs and every
    file and value they refer to, compressed, with a digest for each entry and one for the
    whole file. Import it into another store with `stashpoint import FILE`.

    \b
    Example:
      stashpoint export -o run.spb                 # the whole session
      stashpoint --session fix-42 export HEAD -o head.spb
    """
    from ..bundle import export_bundle

    session = ctx.session(files=False)
    ident = session.resolve(ref) if ref is not None else None
    if ident is not None:
        session.get(ident)  # verified, and in this session
    with ByteProgress("export", enabled=not ctx.json) as progress:
        rep = export_bundle(
            session.store,
            output,
            session=session.name,
            checkpoint=ident,
            overwrite=overwrite,
            progress=progress,
        )
    what = f"checkpoint {short(ident)} with its ancestry" if ident else f"session {rep.session!r}"
    emit(
        ctx,
        rep.to_dict(),
        f"exported {what}: {rep.checkpoints} checkpoint(s), {rep.objects} objects "
        f"({size_text(rep.bytes)}) to {rep.path} ({size_text(rep.size)}); digest {rep.digest[:16]}",
    )


def _emit_checked(ctx: Ctx, bundle: Bundle) -> None:
    m, checked = bundle.manifest, bundle.checked
    assert checked is not None
    data = {
        "ok": True,
        "digest": bundle.digest,
        "session": m.session,
        "scope": m.scope,
        "checkpoints": len(checked.records),
        "logs": len(checked.logs),
        "objects": len(bundle.slots) + len(checked.list_sizes),
        "bytes": bundle.bytes,
        "heads": m.heads,
    }
    emit(
        ctx,
        data,
        f"bundle is intact: session {m.session!r}, {data['checkpoints']} checkpoint(s), "
        f"{data['objects']} objects ({size_text(bundle.bytes)}); no store here to check it against",
    )


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--as",
    "as_name",
    metavar="NAME",
    help="Import into a new session NAME (records are re-sealed there with new ids); for a "
    "session whose history here differs from the bundle's.",
)
@click.option("--dry-run", is_flag=True, help="Check the bundle against the store; write nothing.")
@click.option(
    "--into",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Also write the imported branch's files into DIR (new or empty, outside this store's "
    "workspaces), which then follows it. Without it, an imported session is bound to no "
    "directory until you name one.",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Let the bundle expand to SIZE (e.g. 8GiB): all its contents, and the files one "
    "checkpoint restores. Default 4 GiB and at most 1000x the file's size (64 MiB at least).",
)
@click.option(
    "--max-files",
    type=click.IntRange(min=1),
    metavar="N",
    help="Files, directories and symlinks one checkpoint may restore (default 250000).",
)
@click.option(
    "--max-depth",
    type=click.IntRange(min=1, max=4096),
    metavar="N",
    help="Directory nesting (default 256).",
)
@click.option(
    "--max-path",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="Bytes of a path below the workspace root (default 1024).",
)
@json_option
@pass_ctx
def import_cmd(
    ctx: Ctx,
    file: str,
    as_name: str | None,
    dry_run: bool,
    into: str | None,
    max_size: str | None,
    max_files: int | None,
    max_depth: int | None,
    max_path: int | None,
) -> None:
    """Import a bundle into this store (created here if there is none), into the session it
    was exported from (or a new one: --as NAME).

    Everything is checked before anything is written: every digest and size, the hash chain,
    the logs' running hashes, every name in every directory. A damaged or forged bundle exits
    2; a refused one (unsafe names, limits, ids this store has with other contents, a branch
    whose history differs here) exits 1. Records already here are skipped, so importing twice
    is harmless.

    Limits bound what a bundle from someone else may cost (a few KiB can declare terabytes):
    checked against what it declares before anything is decompressed. Raise them for a bundle
    you trust with --max-size, --max-files, --max-depth and --max-path.

    The directory a bundle's files were snapshotted in is the sender's: it never decides
    where files are written here. Restore them by naming a directory: --into DIR (`--into .`
    for the directory the store is in), `stashpoint fork ID --into DIR`, or `stashpoint
    --store .stashpoint -C DIR rewind ID`.

    \b
    Example:
      stashpoint import run.spb && stashpoint log
      stashpoint import run.spb --as run-from-ci --into ../replay
      stashpoint fork <id> --into ../replay
    """
    from ..bundle import Limits, import_bundle, manifest_keyed, read_bundle
    from ..crypto import Cipher, key_from_env
    from ..integrity import ChainHasher
    from ..upkeep import parse_size

    limits = Limits().raised(
        size=parse_size(max_size) if max_size is not None else None,
        files=max_files,
        depth=max_depth,
        path=max_path,
    )
    # Check the bundle before touching (or creating) a store. The CLI's only key is the
    # encryption key ($STASHPOINT_KEY), whose derived MAC key seals the chain of an encrypted
    # store: a bundle exported from one verifies under the same key. An unkeyed bundle is
    # checked without a key; imported --as NAME into an encrypted store, it is sealed anew.
    env_key = key_from_env()
    keyed = env_key is not None and manifest_keyed(file) is not False
    hasher = ChainHasher(Cipher(env_key).mac_key) if keyed and env_key else ChainHasher()
    with ByteProgress("checking", enabled=not ctx.json) as progress:
        bundle = read_bundle(file, hasher=hasher, limits=limits, progress=progress)
    with bundle:
        branch = _into_branch(bundle, into) if into is not None else None
        beside_store = False
        if not dry_run:
            url, root, _s, _b = ctx.locate(create=True)
            if not ctx.store_url and not Path(url).exists():
                from ..workspace import check_root

                check_root(root, force=ctx.force)  # same rule as `snap` creating a store here
            if into is not None:  # refused before the store is created or anything imported
                beside_store = _into_store_dir(Path(into).resolve(), url)
        else:
            try:
                url, _r, _s, _b = ctx.locate()  # a dry run never creates a store
            except click.ClickException:
                _emit_checked(ctx, bundle)
                return
        if into is not None and not beside_store:
            _check_into(ctx, url, Path(into).resolve())
        store = ctx.store(create=not dry_run)
        with ByteProgress("import", enabled=not ctx.json) as progress:
            rep = import_bundle(
                store, bundle, as_session=as_name, dry_run=dry_run, progress=progress
            )
    where = None
    if branch is not None and into is not None and not dry_run:
        if beside_store:
            where = _restore_beside_store(store, rep.session, branch, Path(into).resolve())
        else:
            where = str(store.session(rep.session, branch=branch).materialize(into).root)
    data = {**rep.to_dict(), "workspace": where}
    heads = ", ".join(f"{b} -> {short(h['head'])} ({h['action']})" for b, h in rep.heads.items())
    verb = "would import" if dry_run else "imported"
    emit(
        ctx,
        data,
        f"{verb} into session {rep.session!r}: {rep.checkpoints} checkpoint(s)"
        + (f" ({rep.present} already here)" if rep.present else "")
        + f", {rep.logs} log(s), {rep.objects} objects ({size_text(rep.bytes)}); branches: {heads}"
        + (f"; files of {branch!r} written to {where}" if where else "")
        + (
            f"; use it there with --session {rep.session}"
            if beside_store and where and rep.session != "main"
            else ""
        ),
    )


def _check_into(ctx: Ctx, url: str, dest: Path) -> None:
    """``--into`` outside the store and its workspaces, checked before the store is made."""
    from .. import restore_target
    from ._app import local_path

    home = local_path(url)
    if home is not None and not home.exists():  # made by this import: nothing bound yet
        own, workspaces = [home], []
    else:
        store = ctx.store()
        own, workspaces = list(store.own_paths), restore_target.workspaces_of(store)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise click.UsageError(f"--into {dest}: exists and is not an empty directory")
    restore_target.check_new_workspace(dest, own=own, workspaces=workspaces)


def _into_branch(bundle: Bundle, into: str) -> str:
    """The branch ``import --into`` writes out, checked before anything is imported."""
    heads = sorted(bundle.manifest.heads)
    branch = "main" if "main" in heads else heads[0] if len(heads) == 1 else None
    if branch is None:
        raise click.UsageError(
            f"the bundle has branches {', '.join(heads)} and none is main: import it, then "
            "`stashpoint fork ID --into DIR` the one you want"
        )
    dest = Path(into).resolve()
    if dest.exists() and (not dest.is_dir() or _entries(dest) not in ([], [STORE_DIR])):
        raise click.UsageError(f"--into {dest}: exists and is not an empty directory")
    return branch


def _entries(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir())


def _into_store_dir(dest: Path, url: str) -> bool:
    """Whether ``--into`` names the directory this (local) store is kept in, which holds
    nothing else: ``import FILE --into .`` in an empty directory, where the store is created.
    A directory that holds some other store, or a link file, is refused."""
    from ..urls import parse_store_url

    path = parse_store_url(url).path
    mine = path is not None and path.resolve() == dest / STORE_DIR
    if not mine and dest.is_dir() and _entries(dest):
        raise click.UsageError(f"--into {dest}: exists and is not an empty directory")
    return mine


def _restore_beside_store(store: Store, session: str, branch: str, dest: Path) -> str:
    """The imported branch's head written into the directory the store is in, which is then
    bound to the branch (as ``stashpoint -C DIR rewind HEAD`` does: a fork's directory gets a
    link file to its store, and this one is the store's own)."""
    restored = store.session(session, branch=branch, workspace=dest, bind=True)
    restored.rewind("HEAD")
    return str(restored.root)
