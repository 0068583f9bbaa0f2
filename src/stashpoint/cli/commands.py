"""The core commands: init, snap, log, show, diff, rewind, fork, label, verify, demo."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._app import (
    EXIT_INTEGRITY,
    STORE_DIR,
    Ctx,
    emit,
    json_option,
    pass_ctx,
    printable,
    short,
    size_text,
)
from ._history import checkpoint_line, draw_graph
from ._progress import ByteProgress

if TYPE_CHECKING:
    from ..model import Checkpoint
    from ..session import Session

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


def _cp_json(session: Session, cp: Checkpoint, labels: dict[str, str] | None = None) -> Any:
    from ..session import checkpoint_json

    return checkpoint_json(cp, labels if labels is not None else session.labels())


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option(
    "--new-key",
    "new_key",
    metavar="FILE|-",
    help="Make a random 256-bit key, write it to FILE (a new file, mode 0600; '-' prints it) "
    "and create the store encrypted with it (AES-256-GCM). Every later command then needs it: "
    "$STASHPOINT_KEY_FILE=FILE or $STASHPOINT_KEY.",
)
@click.option(
    "--durability",
    metavar="LEVEL",
    help="The store's durability level, for every later command and program: fsync (default: "
    "every checkpoint on disk before it returns), group[:N][,Tms] (flushed every N "
    "checkpoints or T ms) or exit (when the store closes).",
)
@json_option
@pass_ctx
def init(ctx: Ctx, directory: str | None, new_key: str | None, durability: str | None) -> None:
    """Create a store (.stashpoint) in DIRECTORY (default: the current directory).

    \b
    Example:
      stashpoint init            # then: stashpoint snap -m "first"
      stashpoint init --new-key ~/.sp.key && export STASHPOINT_KEY_FILE=~/.sp.key
      export STASHPOINT_KEY=$(stashpoint init --new-key -)
      stashpoint init --durability group:64,100ms
    """
    if durability is not None:
        from ..durability import Durability

        Durability.parse(durability)  # refuse a bad level before creating anything
    from ..opening import open_store
    from ..workspace import check_root

    root = check_root(Path(directory or ctx.workspace or "."), force=ctx.force)
    path = root / STORE_DIR
    existed = path.is_dir()
    key_id = None
    if new_key is not None:
        from ..crypto import Cipher, generate_key

        key = generate_key()
        key_id = Cipher(bytes.fromhex(key)).key_id
        store = open_store(ctx.store_url or path, encryption_key=bytes.fromhex(key))
        if durability is not None:
            store.set_durability(durability)
        store.close()
        if new_key != "-":
            try:  # O_EXCL: never overwrite a key (that would lose the store it opens)
                fd = os.open(new_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                raise click.ClickException(
                    f"{new_key} exists; refusing to overwrite a key"
                ) from None
            with os.fdopen(fd, "w") as f:
                f.write(key + "\n")
                f.flush()
                os.fsync(f.fileno())
        data = {"store": str(ctx.store_url or path), "created": not existed, "key_id": key_id}
        if new_key == "-":
            emit(ctx, {**data, "key": key}, key)
        else:
            emit(
                ctx,
                {**data, "key_file": new_key},
                f"Initialised an encrypted stashpoint store in {path} (key id {key_id}, "
                f"key in {new_key}); export STASHPOINT_KEY_FILE={new_key}",
            )
        return
    store = open_store(ctx.store_url or path)
    if durability is not None:
        store.set_durability(durability)
    level = store.durability
    store.close()
    emit(
        ctx,
        {"store": str(ctx.store_url or path), "created": not existed, "durability": str(level)},
        f"{'Reinitialised' if existed else 'Initialised'} stashpoint store in {path}"
        + (f" (durability: {level.describe()})" if durability is not None else ""),
    )


@click.command()
@click.option("-m", "--message", help="What this checkpoint is.")
@click.option("-l", "--label", help="A name to find it by later (e.g. 'tests-pass').")
@click.option(
    "--if-changed",
    is_flag=True,
    help="Record nothing when no file changed since the last checkpoint (for agent hooks).",
)
@click.option(
    "--kind",
    type=click.Choice(["manual", "milestone", "auto"]),
    default="manual",
    show_default=True,
    help="milestone checkpoints are kept by retention policies.",
)
@click.option(
    "--artifact",
    "artifact_specs",
    multiple=True,
    metavar="NAME=PATH",
    help="Attach a large file from outside the workspace (weights, a dataset) by name; "
    "stored in content-defined chunks, so a small change stores a small delta. Repeatable.",
)
@json_option
@pass_ctx
def snap(
    ctx: Ctx,
    message: str | None,
    label: str | None,
    kind: str,
    if_changed: bool,
    artifact_specs: tuple[str, ...],
) -> None:
    """Snapshot the workspace (all files, also those changed by shell commands).

    Creates the store in the current directory if there is none yet. The session's state is
    carried over from the previous checkpoint unchanged. With --if-changed, nothing is recorded
    when no file changed since the last checkpoint (exit 0, "created": false), so a hook that
    fires after every tool call does not fill the history with duplicates.

    \b
    Example:
      stashpoint snap -m "after tests pass" --label green
      stashpoint snap --if-changed -m "after Edit"   # from an agent hook
      stashpoint snap -m "epoch 3" --artifact weights=/data/adapter.safetensors
    """
    artifacts = dict(_artifact_spec(s, need_path=True) for s in artifact_specs)
    session = ctx.session(create=True)
    before = session.head
    with ByteProgress("snapshot", enabled=not ctx.json) as progress:
        cp = session.checkpoint(
            message=message,
            label=label,
            kind=kind,
            progress=progress.callback,
            skip_unchanged=if_changed,
            artifacts=artifacts or None,
        )
    assert cp.workspace is not None
    if before is not None and cp.id == before.id:
        emit(
            ctx,
            {**_cp_json(session, cp), "created": False},
            f"no changes since {click.style(short(cp.id), fg='yellow')}; nothing recorded",
        )
        return
    emit(
        ctx,
        {**_cp_json(session, cp), "created": True},
        f"{click.style(short(cp.id), fg='yellow')} step {cp.step}: {_count(cp.workspace.files)}, "
        f"{size_text(cp.workspace.bytes)}"
        + "".join(f", {n} ({size_text(cp.artifacts[n].size)})" for n in artifacts)
        + (f" - {message}" if message else ""),
    )


def _artifact_spec(spec: str, *, need_path: bool) -> tuple[str, str | None]:
    """``NAME=PATH`` (or ``NAME`` where the path may be left out) from the command line."""
    name, sep, path = spec.partition("=")
    if not name or (sep and not path) or (need_path and not sep):
        raise click.UsageError(f"--artifact wants NAME=PATH, got {spec!r}")
    return name, (path or None)


@click.command()
@click.option("--graph", is_flag=True, help="Draw the branch tree.")
@click.option("-n", "--limit", type=int, help="Show at most N checkpoints.")
@json_option
@pass_ctx
def log(ctx: Ctx, graph: bool, limit: int | None) -> None:
    """List the session's checkpoints, newest first (a child always before its parent).

    A damaged record does not hide the rest: every intact checkpoint is listed (with --json
    too: the list holds the intact ones), then each damaged record is named on stderr and the
    command exits 2 (`stashpoint verify` checks the whole store).

    \b
    Example:
      stashpoint log --graph
      stashpoint log --json | jq '.[0].id'
    """
    from ..errors import IntegrityError

    session = ctx.session(files=False)
    damaged: list[IntegrityError] = []
    cps = session.history(limit=limit, damaged=damaged)
    labels = session.labels()
    if ctx.json:
        emit(ctx, [_cp_json(session, cp, labels) for cp in cps])
    elif not cps and not damaged:
        click.echo(f"session {session.name!r} has no checkpoints yet")
    elif cps:
        heads: dict[str, list[str]] = {}
        for branch, head in session.branches().items():
            marker = f"HEAD -> {branch}" if branch == session.branch else branch
            heads.setdefault(head, []).append(marker)
        if graph:
            draw_graph(cps, labels, heads, session.head.id if session.head else None)
        else:
            for cp in cps:
                click.echo(checkpoint_line(cp, labels, heads))
    if damaged:
        for exc in damaged:
            click.echo(f"error: {exc}", err=True)
        click.echo(
            f"error: {len(damaged)} damaged checkpoint record(s) left out of this log; "
            "run `stashpoint verify` to check the whole store",
            err=True,
        )
        raise SystemExit(EXIT_INTEGRITY)


@click.command()
@click.argument("ref", default="HEAD")
@click.option("--files", "list_files", is_flag=True, help="List every file in the snapshot.")
@click.option("--artifact", metavar="NAME", help="Fetch this artifact (with -o) instead.")
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    help="Where --artifact writes (atomically; a directory gets the original name; - for stdout).",
)
@click.option(
    "--overwrite", is_flag=True, help="With --artifact: replace the file at -o if it exists."
)
@json_option
@pass_ctx
def show(
    ctx: Ctx,
    ref: str,
    list_files: bool,
    artifact: str | None,
    output: str | None,
    overwrite: bool,
) -> None:
    """Show one checkpoint: metadata, state, a workspace summary and its artifacts.

    --artifact NAME -o PATH never replaces an existing file without --overwrite (exit 1),
    and never a symlink, directory or device: with -o DIR the file name comes from the
    checkpoint, possibly from an imported bundle.

    \b
    Example:
      stashpoint show HEAD --json
      stashpoint show HEAD~1 --artifact weights -o /tmp/weights-before.bin
    """
    from ..statediff import jsonable, readable_state

    session = ctx.session(files=False)
    if artifact is not None or output is not None:
        _fetch_artifact(ctx, session, ref, artifact, output, overwrite)
        return
    cp = session.get(ref)
    from ..retention import PrunedError

    data = _cp_json(session, cp)
    try:
        messages, values = readable_state(session, cp)  # LangGraph's channels decoded
        if messages is not None:
            values[session.conversation_key] = messages
        data["state"] = jsonable(values)
    except PrunedError:  # the record stays for the hash chain; its contents were released
        data["state"], data["pruned"], list_files = None, True, False
    data["durability"] = session.store.durability_report(session.durability)
    manifest: dict[str, Any] | None = None
    if cp.workspace is not None:
        manifest = {
            "root": cp.workspace.root,
            "tree": cp.workspace.tree,
            "files": cp.workspace.files,
            "bytes": cp.workspace.bytes,
        }
        if list_files:
            from ..workspace.tree import TreeReader

            reader = TreeReader(session.store.blobs)
            manifest["entries"] = [
                {"path": os.fsdecode(p), "type": e.kind, "mode": oct(e.mode), "size": e.size}
                for p, e in reader.walk(bytes.fromhex(cp.workspace.tree))
            ]
    data["manifest"] = manifest
    if ctx.json:
        emit(ctx, data)
        return
    click.echo(f"checkpoint {click.style(cp.id, fg='yellow')}")
    keys = ("session", "branch", "parent", "step", "kind", "status", "label", "message")
    for key in (*keys, "created_at"):
        if data.get(key) is not None:
            click.echo(f"  {key:<14} {printable(str(data[key]))}")
    if cp.journal is not None and not data.get("pruned"):
        from ..durable import tasks_at

        tasks = tasks_at(session, cp)
        done = sum(1 for t in tasks if t.status in ("completed", "skipped"))
        what = f", tasks {done}/{len(tasks)} done" if tasks else ""
        click.echo(f"  {'journal':<14} {cp.journal.length} entries{what}")
    for key in ("approval", "in_doubt", "decision", "edit"):
        if key in cp.meta:
            click.echo(printable(f"  {key:<14} {cp.meta[key]}"[:300]))
    click.echo(f"  {'digest':<14} {cp.digest}")
    dur = data["durability"]
    click.echo(f"  {'durability':<14} {dur['means']} ({dur['backend']})")
    click.echo(
        f"  {'schema':<14} v{cp.schema_version}  deps: "
        + ", ".join(f"{k} {v}" for k, v in cp.deps.items())
    )
    if manifest:
        click.echo(
            f"  {'workspace':<14} {manifest['files']} files, {size_text(manifest['bytes'])} "
            f"in {printable(str(manifest['root']))}"
        )
        for e in manifest.get("entries", []):
            click.echo(f"    {e['type']} {e['mode']:>7} {e['size']:>10}  {printable(e['path'])}")
    for name, art in cp.artifacts.items():
        click.echo(
            f"  {'artifact':<14} {printable(name)}: {size_text(art.size)} in {art.chunks} chunks, "
            f"from {printable(str(art.path))}"
        )
    state = data["state"]
    if state:
        click.echo("  state:")
        for key, value in state.items():
            text = repr(value)
            if isinstance(value, list):
                text = f"[{len(value)} items]"
            click.echo(f"    {printable(key[:200])}: {printable(text[:200])}")


def _fetch_artifact(
    ctx: Ctx, session: Session, ref: str, name: str | None, output: str | None, overwrite: bool
) -> None:
    if name is None or output is None:
        raise click.UsageError("--artifact NAME and -o FILE go together")
    cp = session.get(ref)
    if output == "-":
        import sys

        out = sys.stdout.buffer
        for part in session.read_artifact(cp, name):
            out.write(part)
        out.flush()
        return
    with ByteProgress(f"fetching {name}", enabled=not ctx.json) as progress:
        path = session.fetch_artifact(cp, name, output, overwrite=overwrite, progress=progress)
    art = cp.artifacts[name]
    emit(
        ctx,
        {
            "checkpoint": cp.id,
            "artifact": name,
            "path": str(path),
            "digest": art.digest,
            "size": art.size,
        },
        f"wrote {name} ({size_text(art.size)}) of {short(cp.id)} to {path}",
    )


@click.command()
@click.argument("a")
@click.argument("b", default="HEAD")
@click.option("--stat", is_flag=True, help="Only list changed paths.")
@click.option(
    "--full",
    is_flag=True,
    help="With --json, write long values, texts and lists whole (else cut, marked truncated).",
)
@json_option
@pass_ctx
def diff(ctx: Ctx, a: str, b: str, stat: bool, full: bool) -> None:
    """Compare two checkpoints: state, conversation and files (unified diff).

    Stored text is printed with control characters and newlines escaped (\\x1b, \\n).

    \b
    Example:
      stashpoint diff HEAD~1 HEAD
      stashpoint diff 01JA0000 --stat
    """
    from ..statediff import text_lines, to_json
    from ..textdiff import file_diff

    session = ctx.session(files=False)
    d = session.diff(a, b)
    if ctx.json:
        emit(ctx, to_json(d, full=full))
        return
    click.echo(f"diff {short(d.a.id)} -> {short(d.b.id)}")
    for style, line in text_lines(d):  # printable lines
        if style == "head":
            line = click.style(line, bold=True)
        elif style:
            line = click.style(line, fg="green" if style == "add" else "red")
        click.echo(line)
    for change in d.files:
        path = printable(os.fsdecode(change.path))
        if stat:
            click.echo(f"{change.status:>9}  {path}")
            continue
        text = file_diff(session.store.blobs, change, path)
        lines = text.split("\n")[:-1]
        click.echo("".join(_content_line(t) + "\n" for t in lines), nl=False)


def _kept_text(kept: list[str]) -> str:
    """The lines a command adds to its output for the files it kept our hooks in."""
    return "".join(f"\nkept stashpoint's hooks in {printable(p)}" for p in kept)


def _keep_hooks_option(f: Any) -> Any:
    return click.option(
        "--no-keep-hooks",
        "no_keep_hooks",
        is_flag=True,
        help="Restore the agent's settings file exactly as the checkpoint has it, without "
        "merging back stashpoint's hooks (stashpoint hooks install) it lacks.",
    )(f)


@click.command()
@click.argument("ref")
@click.option("--files-only", is_flag=True, help="Restore files; keep the current state.")
@click.option("--state-only", is_flag=True, help="Restore state; keep the current files.")
@click.option(
    "--compensate",
    is_flag=True,
    help="Run the registered compensations of irreversible effects after the target "
    "(newest first), when the agent next resumes.",
)
@click.option(
    "--artifacts",
    "all_artifacts",
    is_flag=True,
    help="Also put back the target's artifacts: under --artifacts-to DIR, or at the paths "
    "they were attached from with --artifacts-to-recorded-paths.",
)
@click.option(
    "--artifacts-to",
    "artifacts_to",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Write the artifacts under DIR (their layout below their common directory kept).",
)
@click.option(
    "--artifacts-to-recorded-paths",
    "recorded_paths",
    is_flag=True,
    help="Write the artifacts at the absolute paths recorded with them (list them first: "
    "stashpoint show REF).",
)
@click.option(
    "--artifact",
    "artifact_specs",
    multiple=True,
    metavar="NAME[=PATH]",
    help="Put back one artifact (optionally to another path). Repeatable.",
)
@_keep_hooks_option
@json_option
@pass_ctx
def rewind(
    ctx: Ctx,
    ref: str,
    files_only: bool,
    state_only: bool,
    compensate: bool,
    all_artifacts: bool,
    artifact_specs: tuple[str, ...],
    artifacts_to: str | None,
    recorded_paths: bool,
    no_keep_hooks: bool,
) -> None:
    """Go back to a checkpoint: files and state (default), or only one of them.

    A safety checkpoint of the current workspace is taken first, so a rewind can always be
    undone: `stashpoint rewind <safety id>`. Ignored files are never touched. External
    effects recorded after the target (messages sent, deployments) cannot be undone by a
    rewind: they are listed; --compensate asks for their compensations. Hooks installed
    with `stashpoint hooks install` stay installed, even when the checkpoint is older than
    them (--no-keep-hooks: restore the agent's settings file exactly as it was).

    Files are restored only into the directory the session's checkpoints were taken in;
    to restore into another one, name it, with the store (-C alone also looks for the
    store from DIR): `stashpoint --store .stashpoint -C DIR rewind REF`, run in the project.

    \b
    Example:
      stashpoint rewind HEAD~2 --files-only
      stashpoint rewind before-deploy --compensate && stashpoint resume
      stashpoint rewind epoch-2 --artifacts --artifacts-to restored/
    """
    if files_only and state_only:
        raise click.UsageError("--files-only and --state-only exclude each other")
    artifacts: bool | dict[str, str | None] = all_artifacts or dict(
        _artifact_spec(s, need_path=False) for s in artifact_specs
    )
    session = ctx.session()
    with ByteProgress("artifacts", enabled=bool(artifacts) and not ctx.json) as progress:
        result = session.rewind(
            ref,
            files=not state_only,
            state=not files_only,
            compensate=compensate,
            artifacts=artifacts,
            progress=progress,
            artifacts_to=artifacts_to,
            recorded_paths=recorded_paths,
            keep_hooks=not no_keep_hooks,
        )
    stats = result.files
    data = {
        "target": _cp_json(session, result.target),
        "safety": _cp_json(session, result.safety),
        "head": _cp_json(session, result.head),
        "files": None
        if stats is None
        else {**vars(stats), "kept_dirs": [os.fsdecode(p) for p in stats.kept_dirs]},
        "effects": [e.to_dict() for e in result.effects],
        "compensations": result.compensations,
        "compensation_pending": compensate and len(result.compensations) < len(result.effects),
        "artifacts": sorted(result.artifacts),
        "artifact_paths": result.artifacts,
        "undo": result.undo,
        "kept_hooks": result.kept_hooks,
    }
    changed = (
        f"{stats.written} written, {stats.deleted} deleted" if stats is not None else "no files"
    )
    emit(
        ctx,
        data,
        f"rewound to {short(result.target.id)} ({changed}"
        + "".join(f", {n} restored to {p}" for n, p in result.artifacts.items())
        + "); "
        f"undo with: {data['undo']}"
        + (
            f"\n{len(result.effects)} compensation(s) requested: they run when the agent "
            "resumes (stashpoint resume)"
            if data["compensation_pending"]
            else ""
        )
        + _kept_text(result.kept_hooks),
    )


@click.command()
@click.argument("ref")
@click.option(
    "-b",
    "--branch",
    help="Name of the new branch (default: fork-<id>; fork-<id>-2 ... when that is taken).",
)
@click.option(
    "--into",
    type=click.Path(file_okay=False),
    help="Materialise the checkpoint in this (new or empty) directory instead of here.",
)
@_keep_hooks_option
@json_option
@pass_ctx
def fork(ctx: Ctx, ref: str, branch: str | None, into: str | None, no_keep_hooks: bool) -> None:
    """Start a new branch from a checkpoint, here or in another directory.

    Forked here (without --into), this workspace's files become the checkpoint's, after a
    safety checkpoint; stashpoint's agent hooks stay installed, as with rewind.

    --into DIR must be new or empty, and outside this workspace and the store: inside it,
    this workspace's snapshots would take in the new branch's files and its rewinds delete
    them. A refused fork (exit 1) creates nothing.

    \b
    Example (A/B run on identical state):
      stashpoint fork HEAD~3 --branch try-b --into ../repo-b
      cd ../repo-b && stashpoint snap -m "b: first step"
    """
    session = ctx.session()
    target = session.get(ref)
    new = session.fork(target.id, branch, into=into, keep_hooks=not no_keep_hooks)
    kept_hooks = new.last_restore.kept_hooks if new.last_restore is not None else []
    where = str(new.root) if new.root else "(no workspace)"
    emit(
        ctx,
        {
            "branch": new.branch,
            "from": _cp_json(session, target),
            "workspace": where,
            "kept_hooks": kept_hooks,
        },
        f"branch {new.branch!r} starts at {short(target.id)} in {where}" + _kept_text(kept_hooks),
    )


@click.command()
@click.argument("ref")
@click.argument("name", required=False)
@click.option("--delete", is_flag=True, help="Remove the checkpoint's label.")
@json_option
@pass_ctx
def label(ctx: Ctx, ref: str, name: str | None, delete: bool) -> None:
    """Give a checkpoint a name you can use instead of its id.

    \b
    Example:
      stashpoint label HEAD tests-pass && stashpoint rewind tests-pass
    """
    if not delete and not name:
        raise click.UsageError("give a NAME, or --delete")
    session = ctx.session(files=False)
    cp = session.label(ref, None if delete else name)
    emit(
        ctx,
        {"id": cp.id, "label": None if delete else name},
        f"{short(cp.id)} " + ("unlabelled" if delete else f"labelled {name!r}"),
    )


_PROBLEMS_SHOWN = 50
"""Problems verify prints one per line; the JSON output has all of them."""


@click.command()
@click.option(
    "--mirror",
    "mirror",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[URL]",
    help="Also verify the mirror (default: the global --mirror) and compare the two stores.",
)
@click.option(
    "--witness",
    is_flag=True,
    help="Also print the rollback witness: where it is and each branch's sequence number.",
)
@json_option
@pass_ctx
def verify(ctx: Ctx, mirror: str | None, witness: bool) -> None:
    """Check every checkpoint, hash chain, conversation and blob in the store.

    Exits 2 when anything is damaged and names what: also a head or label whose MAC fails
    (keyed store), and a branch older than this user's rollback witness ("store rolled back
    from seq N to M"). With --mirror, verifies both stores and
    compares checkpoint ids, digests and heads; exits 2 on damage on either side or records
    that disagree (a mirror that is only behind is reported, exit 0).

    \b
    Example:
      stashpoint verify || echo "store damaged"
      stashpoint --mirror postgresql://db/agents verify --mirror --json
    """
    from ..stores.formats import CURRENT as CURRENT_FORMAT
    from ..verify import verify_store

    if mirror is not None:
        from .mirror_cmd import verify_mirror

        verify_mirror(ctx, mirror)
        return
    store = ctx.store()
    with ByteProgress("verify", enabled=not ctx.json) as progress:
        report = verify_store(store, progress=progress)
    out = report.to_dict()
    out["format"] = store.format
    if witness:
        w = store.witness
        out["witness"] = (
            None
            if w is None
            else {
                "path": str(w.path),
                "keyed": w.key is not None,
                "branches": [
                    {"session": s, "branch": b, "seq": seq, "head": head}
                    for (s, b), (seq, head, _digest) in sorted(w.heads.items())
                ],
            }
        )
        if not ctx.json:
            click.echo(
                "rollback witness: off"
                if w is None
                else f"rollback witness {w.path}: {len(w.heads)} branch(es) seen"
            )
    emit(ctx, out)
    if not ctx.json:
        for p in report.problems[:_PROBLEMS_SHOWN]:
            click.echo(click.style("damaged: ", fg="red") + p.message, err=True)
        if len(report.problems) > _PROBLEMS_SHOWN:
            click.echo(
                f"... and {len(report.problems) - _PROBLEMS_SHOWN} more "
                "(stashpoint verify --json lists every one)",
                err=True,
            )
        click.echo(
            f"{report.checkpoints} checkpoints, {report.blobs} blobs "
            f"({size_text(report.bytes)}) checked (store format {store.format}): "
            + ("ok" if report.ok else f"{len(report.problems)} problem(s)")
        )
        if store.format < CURRENT_FORMAT:
            click.echo(
                f"store format {store.format} is read as it is; `stashpoint upgrade` converts "
                f"it to format {CURRENT_FORMAT} (needed before anything writes to it)"
            )
    if not report.ok:
        raise SystemExit(EXIT_INTEGRITY)


@click.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Where to run it.")
@json_option
@pass_ctx
def demo(ctx: Ctx, directory: str | None) -> None:
    """Run a scripted agent for ~10 steps, then rewind, fork and diff its history; then a
    durable agent that is killed with kill -9, resumed, paused for approval and approved.

    Deterministic, offline, no API key. Leaves the workspace and store behind for you to explore.

    \b
    Example:
      stashpoint demo
    """
    from .demo import run_demo

    run_demo(Path(directory) if directory else None, json_out=ctx.json)


_KEPT_IN_FILES = re.compile("([\t\f\u2028])")


def _content_line(line: str) -> str:
    """A line of a file's diff, escaped like any stored text but for the tabs, form feeds
    and line separators a text file holds inside its lines (shown as they are, as by
    ``diff -u``): an escape sequence or carriage return in a file cannot drive the terminal."""
    parts = _KEPT_IN_FILES.split(line)
    return "".join(p if n % 2 else printable(p) for n, p in enumerate(parts))


def _count(n: int, noun: str = "file") -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
